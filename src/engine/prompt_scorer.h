// engine/prompt_scorer.h — the log-probability of each prompt token after the tokens before it
// (what `echo` with `logprobs` returns for the prompt, and what evaluation harnesses such as
// lm-evaluation-harness read to score a continuation): one forward over every position of the
// prompt on a private cache, in chunks, each row reduced to the next token's log-probability and
// the top alternatives as it comes (never more than a chunk of logits held).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "model/model.h"

namespace fp {

struct ScoredToken {
  float logprob = 0.0f;                            // log p(token | the tokens before it)
  int64_t rank = 1;                                // 1 + the number of tokens more likely than it
  std::vector<std::pair<int32_t, float>> top;      // the top_k most likely tokens there, best first
};

// Entry i scores ids[i + 1] (ids.size() - 1 entries; the first token has no context). Runs with
// the model's one-sequence adapter (Model::set_single_lora). Errors: an empty prompt or one longer
// than the model's context.
std::vector<ScoredToken> score_prompt(Model& model, const std::vector<int32_t>& ids, int top_k, int64_t chunk = 64);

// Log-softmax of one logit row: the log-probability of `token` and the `top_k` best (ties by id),
// computed in double.
ScoredToken score_row(const float* logits, int64_t vocab, int32_t token, int top_k);

}  // namespace fp
