// engine/sampler.cpp — penalties, then greedy (the argmax op) or the sample op on a fresh draw.
#include "engine/sampler.h"

#include <cmath>
#include <unordered_set>

#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

void Sampler::apply_penalties(float* logits, int64_t n_vocab, const int32_t* history, size_t n_history, size_t n_prompt) {
  if ((p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && n_history > n_prompt) {
    counts_.clear();
    for (size_t i = n_prompt; i < n_history; ++i)
      if (history[i] >= 0 && history[i] < n_vocab) ++counts_[history[i]];
    for (auto& [t, c] : counts_) logits[t] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(c);
  }
  if (p_.repetition_penalty != 1.0f && p_.repetition_window > 0) {
    std::unordered_set<int32_t> seen;
    size_t start = n_history > static_cast<size_t>(p_.repetition_window) ? n_history - p_.repetition_window : 0;
    for (size_t i = start; i < n_history; ++i) {
      int32_t t = history[i];
      if (t < 0 || t >= n_vocab || !seen.insert(t).second) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
}

void Sampler::rewind(int64_t rows_used) {
  rng_ = marked_;
  for (int64_t i = 0; i < rows_used; ++i) (void)next_row();
}

int32_t Sampler::sample(float* logits, int64_t n_vocab, const int32_t* history, size_t n_history, size_t n_prompt) {
  apply_penalties(logits, n_vocab, history, n_history, n_prompt);
  const SampleRow row = next_row();
  int32_t id = 0;
  if (row.temperature > 0.0f) dispatch(SampleArgs{logits, 1, n_vocab, &row, &id});
  else dispatch(ArgmaxArgs{logits, 1, n_vocab, &id});
  return id;
}

SampleRow Sampler::next_row() {
  SampleRow row;
  row.temperature = p_.temperature > 0.0f ? p_.temperature : 0.0f;
  row.top_k = p_.top_k;
  row.top_p = p_.top_p;
  row.min_p = p_.min_p;
  if (row.temperature > 0.0f) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return row;
}

bool Sampler::penalties_off() const {
  return (p_.repetition_penalty == 1.0f || p_.repetition_window <= 0) && p_.presence_penalty == 0.0f &&
         p_.frequency_penalty == 0.0f;
}

}  // namespace fp
