// engine/prompt_scorer.cpp — see prompt_scorer.h.
#include "engine/prompt_scorer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace fp {

ScoredToken score_row(const float* logits, int64_t vocab, int32_t token, int top_k) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const double lse = mx + std::log(sum);
  ScoredToken s;
  s.logprob = static_cast<float>(logits[token] - lse);
  for (int64_t i = 0; i < vocab; ++i) s.rank += logits[i] > logits[token];
  const int64_t k = std::min<int64_t>(std::max(top_k, 0), vocab);
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i)
      s.top.emplace_back(idx[static_cast<size_t>(i)], static_cast<float>(logits[idx[static_cast<size_t>(i)]] - lse));
  }
  return s;
}

std::vector<ScoredToken> score_prompt(Model& model, const std::vector<int32_t>& ids, int top_k, int64_t chunk) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t V = model.config().n_vocab;
  FP_CHECK(n > 0, "scoring a prompt: the prompt is empty");
  FP_CHECK(n <= model.config().max_context, "scoring a prompt: ", n, " tokens, more than the model's context of ",
           model.config().max_context);
  FP_CHECK(chunk > 0, "scoring a prompt: chunk ", chunk, " must be positive");
  for (int32_t id : ids) FP_CHECK(id >= 0 && id < V, "scoring a prompt: token id ", id, " is outside the vocabulary [0, ", V, ")");
  std::vector<ScoredToken> out;
  out.reserve(static_cast<size_t>(n - 1));
  if (n == 1) return out;
  auto cache = model.new_cache(n);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> logits;
  // The last token predicts nothing that is scored: it need not be fed.
  for (int64_t at = 0; at < n - 1; at += chunk) {
    const int64_t len = std::min(chunk, n - 1 - at);
    logits.resize(static_cast<size_t>(len * V));
    model.forward(ids.data() + at, pos.data() + at, len, *cache, logits.data(), true);
    for (int64_t r = 0; r < len; ++r)
      out.push_back(score_row(logits.data() + r * V, V, ids[static_cast<size_t>(at + r + 1)], top_k));
  }
  return out;
}

}  // namespace fp
