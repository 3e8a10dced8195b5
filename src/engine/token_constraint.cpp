// engine/token_constraint.cpp — allowed-token masks by trie walk, cached by grammar state.
#include "engine/token_constraint.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_trie.h"

namespace fp {

namespace {
constexpr size_t kMaxCachedStates = 4096;
inline void set_bit(std::vector<uint64_t>& bits, int32_t i) { bits[static_cast<size_t>(i) >> 6] |= uint64_t{1} << (i & 63); }
inline bool has_bit(const std::vector<uint64_t>& bits, int64_t i) { return (bits[static_cast<size_t>(i) >> 6] >> (i & 63)) & 1; }
}  // namespace

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok, std::string what)
    : grammar_(std::move(grammar)), tok_(tok), trie_(tok.vocab_trie()), what_(std::move(what)), n_vocab_(tok.n_vocab()) {
  for (int32_t id = 0; id < n_vocab_; ++id)
    if (tok.is_eog(id)) end_ids_.push_back(id);
  scratch_.resize(trie_.depth() + 1);
}

bool TokenConstraint::is_end(int32_t token) const { return tok_.is_eog(token); }

void TokenConstraint::walk(uint32_t node, const GrammarState& s, size_t depth, std::vector<uint64_t>& bits) {
  const VocabTrie::Node& n = trie_.node(node);
  for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
    const VocabTrie::Node& child = trie_.node(c);
    GrammarState& next = scratch_[depth];
    next = s;
    if (!grammar_advance(*grammar_, next, child.byte)) continue;
    for (uint32_t t = 0; t < child.n_tokens; ++t) set_bit(bits, trie_.token_ids()[child.first_token + t]);
    if (child.n_children) walk(c, next, depth + 1, bits);
  }
}

const std::vector<uint64_t>& TokenConstraint::allowed(const GrammarState& s) {
  std::string key = s.key();
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  if (cache_.size() >= kMaxCachedStates) cache_.clear();
  ++walks_;
  std::vector<uint64_t> bits((static_cast<size_t>(n_vocab_) + 63) / 64, 0);
  walk(VocabTrie::kRoot, s, 0, bits);
  bool any = false;
  for (uint64_t w : bits) any |= w != 0;
  if (s.complete() || !any)
    for (int32_t id : end_ids_) set_bit(bits, id);
  return cache_.emplace(std::move(key), std::move(bits)).first->second;
}

void TokenConstraint::mask_logits(const GrammarState& s, float* logits, int64_t n_vocab) {
  const std::vector<uint64_t>& bits = allowed(s);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n_vocab; ++i)
    if (i >= n_vocab_ || !has_bit(bits, i)) logits[i] = ninf;
}

bool TokenConstraint::accept(GrammarState& s, int32_t token) const {
  if (token < 0 || token >= n_vocab_) return false;
  const std::string b = tok_.token_to_bytes(token);
  return !b.empty() && grammar_accepts_prefix(*grammar_, s, b);
}

bool TokenConstraint::only_end(const GrammarState& s) {
  if (!s.complete()) return false;
  const std::vector<uint64_t>& bits = allowed(s);
  size_t n = 0;
  for (uint64_t w : bits) n += static_cast<size_t>(__builtin_popcountll(w));
  size_t ends = 0;
  for (int32_t id : end_ids_) ends += has_bit(bits, id);
  return n == ends;
}

}  // namespace fp
