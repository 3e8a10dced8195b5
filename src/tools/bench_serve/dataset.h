// tools/bench_serve/dataset.h — the prompts a benchmark sends: `random` (random tokens, input
// and output lengths drawn around the requested ones) and `shared-prefix` (one random prefix
// shared by every prompt, then a random suffix).
//
// With the server's tokenizer the prompt text is built from random token ids and re-encoded
// until it has exactly the requested number of tokens (BOS/EOS not counted, as vLLM counts);
// without one, prompts are random common words and the counts are approximate.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fp {
class Tokenizer;
}

namespace fp::bench_serve {

struct Prompt {
  std::string text;
  int64_t input_len = 0;   // tokens (exact with a tokenizer, words without)
  int64_t output_len = 0;  // max_tokens to ask for
};

struct DatasetOptions {
  std::string name = "random";  // "random" or "shared-prefix"
  int num_prompts = 100;
  int64_t input_len = 256;      // random part of each prompt (the suffix for shared-prefix)
  int64_t output_len = 128;
  double range_ratio = 0;       // lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1
  int64_t prefix_len = 0;       // shared-prefix: tokens every prompt starts with
  uint64_t seed = 0;
};

// Inclusive bounds of a length drawn with range ratio r, as vLLM draws them:
// [floor(len*(1-r)), ceil(len*(1+r))], at least `min_len`.
std::pair<int64_t, int64_t> length_bounds(int64_t len, double range_ratio, int64_t min_len = 1);

struct Dataset {
  std::vector<Prompt> prompts;
  bool exact_tokens = false;  // built and verified with a tokenizer
  int64_t inexact = 0;        // prompts whose re-encoded count could not be made exact
  std::string note;           // how the prompts were built, for the report
};

// Throws fp::Error on an unknown dataset name or an invalid range ratio.
// `tok` may be null: words instead of tokens.
Dataset make_dataset(const DatasetOptions& opts, const Tokenizer* tok);

}  // namespace fp::bench_serve
