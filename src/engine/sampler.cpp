// engine/sampler.cpp — penalties, then greedy (argmax op) or filtered sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(float* logits, int64_t n_vocab, const std::vector<int32_t>& history, size_t n_prompt) {
  if ((p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && history.size() > n_prompt) {
    counts_.clear();
    for (size_t i = n_prompt; i < history.size(); ++i)
      if (history[i] >= 0 && history[i] < n_vocab) ++counts_[history[i]];
    for (auto& [t, c] : counts_) logits[t] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(c);
  }
  if (p_.repetition_penalty != 1.0f && p_.repetition_window > 0) {
    std::unordered_set<int32_t> seen;
    size_t start = history.size() > static_cast<size_t>(p_.repetition_window) ? history.size() - p_.repetition_window : 0;
    for (size_t i = start; i < history.size(); ++i) {
      int32_t t = history[i];
      if (t < 0 || t >= n_vocab || !seen.insert(t).second) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.temperature <= 0.0f) {
    int32_t id = 0;
    dispatch(ArgmaxArgs{logits, 1, n_vocab, &id});
    return id;
  }
  // Candidates sorted by logit, cut by top-k, then softmax with temperature.
  cand_.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_[static_cast<size_t>(i)] = {logits[i], static_cast<int32_t>(i)};
  size_t k = p_.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p_.top_k), cand_.size()) : cand_.size();
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(), by_logit);
  cand_.resize(k);
  float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) sum += (c.first = std::exp((c.first - mx) / p_.temperature));
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);
  // top-p: the smallest prefix whose mass reaches p (at least one token).
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].first;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (p_.min_p > 0.0f) {
    float floor = cand_[0].first * p_.min_p;
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= floor) ++keep;
    cand_.resize(keep);
  }
  double total = 0;
  for (auto& c : cand_) total += c.first;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), acc = 0;
  for (auto& c : cand_) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand_.back().second;
}

}  // namespace fp
