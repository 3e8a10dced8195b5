// engine/sampler.h — turns a row of logits into the next token: greedy, or temperature with
// top-k, top-p, min-p and a repetition penalty, from a seeded generator (reproducible). The
// penalties are applied here; the filters and the draw are the sample op (kernels/ops.h), which
// a model on a device runs there (Model::forward_sampled) on the same uniform draw.
#pragma once
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "kernels/ops.h"

namespace fp {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off; llama.cpp semantics (divide positive logits, multiply negative)
  int32_t repetition_window = 64;   // how many recent tokens the penalty looks at
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated tokens
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [n_vocab], modified in place by penalties. `history` holds the tokens so far, of
  // which the first n_prompt are the prompt (presence/frequency penalties look at the rest).
  int32_t sample(float* logits, int64_t n_vocab, const std::vector<int32_t>& history, size_t n_prompt = 0) {
    return sample(logits, n_vocab, history.data(), history.size(), n_prompt);
  }
  // The same, for `history` = tokens[0..n_history).
  int32_t sample(float* logits, int64_t n_vocab, const int32_t* history, size_t n_history, size_t n_prompt);
  // The penalties alone (what sample() applies first), for `history` = tokens[0..n_history).
  void apply_penalties(float* logits, int64_t n_vocab, const int32_t* history, size_t n_history, size_t n_prompt);
  // Speculative decoding draws every row of a draft ahead (next_row() per row, sampled where the
  // logits are); mark() before those draws and rewind(rows) after the verdict take back the
  // draws of the rows not used, so that a sequence's token j always uses draw j: a seed gives the
  // same tokens with and without drafts.
  void mark() { marked_ = rng_; }
  void rewind(int64_t rows_used);
  // The sample op's settings for the next token, its uniform draw taken from this sampler's
  // generator (greedy rows draw nothing), as sample() would use them: for a caller that samples
  // elsewhere (on the device) a request whose penalties are off (penalties_off()).
  SampleRow next_row();
  bool penalties_off() const;
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_, marked_;
  std::unordered_map<int32_t, int32_t> counts_;
};

}  // namespace fp
