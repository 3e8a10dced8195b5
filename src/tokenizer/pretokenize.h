// tokenizer/pretokenize.h — splits text into pre-tokens before byte-level BPE: a sequence of
// regex splits (HF pre_tokenizer Sequence / llama.cpp per-`pre` presets), each keeping both
// its matches and the gaps between them as pieces.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace fp {

// The regexes of a GGUF tokenizer.ggml.pre name; throws naming `source` when it is unknown.
std::vector<std::string> pre_regexes_for(const std::string& pre, const std::string& source);
// The GPT-2 pattern (HF ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

class PreTokenizer {
 public:
  explicit PreTokenizer(const std::vector<std::string>& patterns);
  // Appends the pieces of `text` (views into it, in order, covering it exactly) to out.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  void split_one(const Regex& re, std::string_view piece, std::vector<std::string_view>& out) const;
  std::vector<Regex> regexes_;
};

}  // namespace fp
