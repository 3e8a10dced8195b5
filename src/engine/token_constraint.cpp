// engine/token_constraint.cpp — allowed-token masks by trie walk, cached by grammar state.
#include "engine/token_constraint.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_trie.h"

namespace fp {

namespace {
// Past this many interned states (a grammar that keeps making new ones: deep nesting) everything
// is forgotten before the next mask, which is then walked afresh.
constexpr size_t kMaxStates = 20000;
inline void set_bit(std::vector<uint64_t>& bits, int32_t i) { bits[static_cast<size_t>(i) >> 6] |= uint64_t{1} << (i & 63); }
inline bool has_bit(const std::vector<uint64_t>& bits, int64_t i) { return (bits[static_cast<size_t>(i) >> 6] >> (i & 63)) & 1; }
}  // namespace

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok, std::string what)
    : grammar_(std::move(grammar)), tok_(tok), trie_(tok.vocab_trie()), what_(std::move(what)), n_vocab_(tok.n_vocab()) {
  for (int32_t id = 0; id < n_vocab_; ++id)
    if (tok.is_eog(id)) end_ids_.push_back(id);
  FP_CHECK(!end_ids_.empty(), tok.spec().source, ": constrained decoding needs an end-of-generation token, and this vocabulary has none");
}

GrammarState TokenConstraint::start() const {
  GrammarState s = grammar_start(*grammar_);
  s.gate_left = static_cast<uint32_t>(gate_.size());
  return s;
}

void TokenConstraint::set_gate(std::vector<int32_t> gate) {
  for (int32_t id : gate) FP_CHECK(id >= 0 && id < n_vocab_, what_, ": gate token ", id, " is outside the vocabulary");
  gate_ = std::move(gate);
}

void TokenConstraint::clear_cache() {
  states_.clear();
  ids_.clear();
  masks_.clear();
}

int32_t TokenConstraint::intern(GrammarState s) {
  std::string key = s.key();
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(states_.size());
  Interned in;
  in.state = std::move(s);
  in.next.fill(kUnknown);
  states_.push_back(std::move(in));
  ids_.emplace(std::move(key), id);
  return id;
}

int32_t TokenConstraint::step(int32_t id, uint8_t byte) {
  const int32_t known = states_[static_cast<size_t>(id)].next[byte];
  if (known != kUnknown) return known;
  GrammarState t = states_[static_cast<size_t>(id)].state;
  const int32_t next = grammar_advance(*grammar_, t, byte) ? intern(std::move(t)) : kDead;
  states_[static_cast<size_t>(id)].next[byte] = next;  // states_ may have grown: index again
  return next;
}

void TokenConstraint::walk(uint32_t node, int32_t state, std::vector<uint64_t>& bits) {
  const VocabTrie::Node& n = trie_.node(node);
  for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
    const VocabTrie::Node& child = trie_.node(c);
    const int32_t next = step(state, child.byte);
    if (next == kDead) continue;
    for (uint32_t t = 0; t < child.n_tokens; ++t) set_bit(bits, trie_.token_ids()[child.first_token + t]);
    if (child.n_children) walk(c, next, bits);
  }
}

const std::vector<uint64_t>& TokenConstraint::allowed(const GrammarState& s) {
  if (s.gate_left > 0) {  // before the gate: anything
    if (every_token_.empty()) {
      every_token_.assign((static_cast<size_t>(n_vocab_) + 63) / 64, ~uint64_t{0});
      if (n_vocab_ % 64) every_token_.back() = (uint64_t{1} << (n_vocab_ % 64)) - 1;
    }
    return every_token_;
  }
  if (states_.size() > kMaxStates) clear_cache();
  const int32_t id = intern(s);
  auto it = masks_.find(id);
  if (it != masks_.end()) return it->second;
  std::vector<uint64_t> bits((static_cast<size_t>(n_vocab_) + 63) / 64, 0);
  walk(VocabTrie::kRoot, id, bits);
  bool any = false;
  for (uint64_t w : bits) any |= w != 0;
  if (s.complete() || !any)
    for (int32_t e : end_ids_) set_bit(bits, e);
  return masks_.emplace(id, std::move(bits)).first->second;
}

void TokenConstraint::mask_logits(const GrammarState& s, float* logits, int64_t n_vocab) {
  const std::vector<uint64_t>& bits = allowed(s);
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t n = std::min<int64_t>(n_vocab, n_vocab_);
  for (int64_t w = 0; w * 64 < n; ++w) {  // a word at a time: most are all taken or all refused
    const uint64_t m = bits[static_cast<size_t>(w)];
    const int64_t base = w * 64, end = std::min<int64_t>(base + 64, n);
    if (m == ~uint64_t{0} && end - base == 64) continue;
    for (int64_t i = base; i < end; ++i)
      if (!((m >> (i - base)) & 1)) logits[i] = ninf;
  }
  for (int64_t i = n; i < n_vocab; ++i) logits[i] = ninf;  // rows past the tokenizer's vocabulary
}

bool TokenConstraint::accept(GrammarState& s, int32_t token) const {
  if (token < 0 || token >= n_vocab_) return false;
  if (s.gate_left > 0) {
    // The gate's longest prefix that ends the tokens so far: gate[0..matched) then `token`,
    // whose suffix of length k matches when token == gate[k-1] and gate[matched-k+1..matched)
    // == gate[0..k-1) (a gate is a few tokens: the direct check is enough).
    const size_t matched = gate_.size() - s.gate_left;
    size_t k = matched + 1;
    for (; k > 0; --k)
      if (token == gate_[k - 1] && std::equal(gate_.begin() + static_cast<std::ptrdiff_t>(matched + 1 - k),
                                              gate_.begin() + static_cast<std::ptrdiff_t>(matched), gate_.begin()))
        break;
    s.gate_left = static_cast<uint32_t>(gate_.size() - k);
    return true;
  }
  const std::string b = tok_.token_to_bytes(token);
  return !b.empty() && grammar_accepts_prefix(*grammar_, s, b);
}

int64_t TokenConstraint::accepted_prefix(GrammarState s, const int32_t* draft, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (!accept(s, draft[i])) return i;
  return n;
}

void TokenConstraint::mask_draft_rows(GrammarState s, const int32_t* draft, int64_t n_draft, float* rows, int64_t n_vocab) {
  for (int64_t i = 0; i <= n_draft; ++i) {
    mask_logits(s, rows + i * n_vocab, n_vocab);
    if (i == n_draft || !accept(s, draft[i])) break;
  }
}

bool TokenConstraint::only_end(const GrammarState& s) {
  if (s.gate_left > 0 || !s.complete()) return false;
  const std::vector<uint64_t>& bits = allowed(s);
  size_t n = 0;
  for (uint64_t w : bits) n += static_cast<size_t>(__builtin_popcountll(w));
  size_t ends = 0;
  for (int32_t id : end_ids_) ends += has_bit(bits, id);
  return n == ends;
}

}  // namespace fp
