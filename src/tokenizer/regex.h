// tokenizer/regex.h — a small backtracking regex engine over code points, for pre-tokenizer
// patterns (std::regex knows no \p{L}). Leftmost-first alternation and greedy quantifiers,
// as in Oniguruma, which Hugging Face tokenizers uses, so splits agree with it.
// Supported: | () (?:) (?i:) (?i) (?=) (?!) ? * + {n} {n,} {n,m} (and lazy forms), . ^ $,
// classes [...] [^...] with ranges, \p{..} \P{..} \s \S \d \D \w \W \r \n \t \f \v \xNN \x{..} \uNNNN.
// Case-insensitive matching folds onto ASCII letters only (with ſ -> s and K -> k), which is all
// the contraction patterns need.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fp {

class Regex {
 public:
  // Throws fp::Error naming the pattern when it uses syntax outside the subset above.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Length (in code points) of the match starting exactly at cps[pos], or -1 when none.
  // The subject is cps[begin, end); ^ and $ and lookarounds see only that span.
  int64_t match_at(const uint32_t* cps, size_t begin, size_t end, size_t pos) const;
  const std::string& pattern() const { return pattern_; }

  struct Program;

 private:
  std::string pattern_;
  std::unique_ptr<Program> prog_;
};

}  // namespace fp
