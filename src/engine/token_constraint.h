// engine/token_constraint.h — constrained decoding: which tokens may come next so that the text
// stays inside a grammar (engine/grammar.h; a JSON schema compiled by engine/json_schema.h, any
// JSON object, or GBNF given directly). Refused tokens' logits become -inf before sampling, so
// greedy and sampled decoding alike only write text the grammar accepts, and the
// end-of-generation token is allowed only where the text is complete.
//
// The allowed set for a grammar state is found by walking the vocabulary's byte trie
// (tokenizer/vocab_trie.h) with the state, pruning a branch at the first byte the grammar refuses;
// tokens that end inside a UTF-8 character are judged by the characters they can still become.
// States are interned (numbered) and each state's step over a byte is remembered, so the walk
// mostly follows a table: JSON has few states (inside a string every character leads back to the
// same one), and a walk over a 128K vocabulary that takes most tokens costs a few milliseconds
// instead of a grammar step per trie node. Sets are cached by state, so after the first visit a
// step's mask is a lookup.
//
// A gate (a sequence of token ids, set_gate) holds the grammar back until the generated tokens
// have spelled it: before that every token may come, after its last token the grammar applies to
// what follows. gpt-oss's harmony replies think in an analysis channel first and answer after
// <|channel|>final<|message|>: with that as the gate, the answer alone follows the schema (the
// control tokens of the headers have no bytes, so a grammar could not spell them).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar.h"

namespace fp {

class Tokenizer;
class VocabTrie;

class TokenConstraint {
 public:
  // `what` says where the grammar came from ("json_schema", "json_object", "grammar") for messages.
  TokenConstraint(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok, std::string what);

  const Grammar& grammar() const { return *grammar_; }
  const std::string& what() const { return what_; }
  // The grammar's start, behind the gate when there is one.
  GrammarState start() const;
  // Token ids the reply must spell before the grammar applies (empty: none).
  void set_gate(std::vector<int32_t> gate);

  // Bit i (word i / 64) set when token i may come next in state `s`. Where nothing at all may
  // (the grammar wants a character no token spells), the end-of-generation tokens are allowed so
  // that the generation ends instead of going astray.
  const std::vector<uint64_t>& allowed(const GrammarState& s);
  // Sets the logits of refused tokens to -inf (ids at or beyond the tokenizer's vocabulary too).
  void mask_logits(const GrammarState& s, float* logits, int64_t n_vocab);
  // Advances `s` over a token's bytes (before the gate: over the gate's match, any token taken);
  // false when the grammar refuses them.
  bool accept(GrammarState& s, int32_t token) const;
  // Speculative decoding: how many leading tokens of a draft the grammar takes from `s` (a draft
  // is cut there: a refused token could never be kept).
  int64_t accepted_prefix(GrammarState s, const int32_t* draft, int64_t n) const;
  // Masks the n_draft + 1 rows of a draft's check: row i under the state after draft[0..i), so
  // that each row is judged as plain decoding would judge it there (rows past a refused draft
  // token are never read and stay as they are).
  void mask_draft_rows(GrammarState s, const int32_t* draft, int64_t n_draft, float* rows, int64_t n_vocab);
  // The text is complete and no token can extend it: only ending is left.
  bool only_end(const GrammarState& s);

  size_t cache_size() const { return masks_.size(); }
  void clear_cache();  // forgets every state, step and mask (a benchmark's cold start)

 private:
  struct Interned {
    GrammarState state;
    std::array<int32_t, 256> next;  // the state after each byte: kUnknown until needed, kDead when refused
  };
  static constexpr int32_t kUnknown = -2, kDead = -1;
  int32_t intern(GrammarState s);
  int32_t step(int32_t id, uint8_t byte);
  void walk(uint32_t node, int32_t state, std::vector<uint64_t>& bits);

  std::shared_ptr<const Grammar> grammar_;
  const Tokenizer& tok_;
  const VocabTrie& trie_;
  std::string what_;
  std::vector<int32_t> end_ids_;  // end-of-generation tokens
  std::vector<int32_t> gate_;
  std::vector<uint64_t> every_token_;  // the mask before the gate
  int32_t n_vocab_ = 0;
  std::vector<Interned> states_;
  std::unordered_map<std::string, int32_t> ids_;   // GrammarState::key() -> index into states_
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;  // state -> allowed tokens
};

}  // namespace fp
