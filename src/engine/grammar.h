// engine/grammar.h — constrained decoding's grammar: a context-free grammar over Unicode code
// points in GBNF notation (what llama.cpp's `grammar` field takes; JSON schemas are compiled to
// it, engine/json_schema.h), and the state of a generation inside it: every parse stack still
// possible plus the bytes of an unfinished UTF-8 character, advanced one byte at a time so that a
// token ending inside a character is judged too (engine/token_constraint.h masks the vocabulary
// with it).
//
// GBNF as accepted here: `name ::= alternatives`, alternatives separated by `|`, sequences of
// "literals", [classes] (ranges, ^ to negate), `.` (any character), rule names, ( groups ), and
// the postfix operators * + ? {m} {m,} {m,n}; escapes \n \r \t \\ \" \] \- \xHH \uHHHH
// \UHHHHHHHH; `#` starts a comment. A rule may span lines (a new rule starts at `name ::=`).
// Left recursion is refused when the grammar is parsed (it would never stop expanding), as is a
// grammar whose repetitions build more than 2^20 elements; a text that keeps more than 1024
// parses alive at once (a deeply ambiguous grammar) is refused at that byte.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fp {

// One element of an alternative: a character class, a reference to a rule, or the alternative's end.
struct GrammarElement {
  enum Kind : uint8_t { End, Chars, Ref };
  Kind kind = End;
  bool negated = false;      // Chars: matches a code point in none of the ranges
  uint32_t ref = 0;          // Ref: the rule
  uint32_t first_range = 0;  // Chars: ranges()[first_range .. first_range + n_ranges), sorted, disjoint
  uint32_t n_ranges = 0;
};

// A GBNF literal ("...", escaped) matching exactly these bytes.
std::string gbnf_literal(std::string_view bytes);

class Grammar {
 public:
  // Parses GBNF; `root` names the start rule. Throws fp::Error naming the line and the problem
  // (syntax, an undefined rule, left recursion).
  static std::shared_ptr<const Grammar> parse(std::string_view text, const std::string& root = "root");

  const std::vector<GrammarElement>& elements() const { return elems_; }
  // Where each alternative of a rule starts in elements().
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return alts_[rule]; }
  uint32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  // Whether a Chars element takes code point cp; whether it takes any code point in [lo, hi].
  bool matches(const GrammarElement& e, uint32_t cp) const;
  bool matches_any(const GrammarElement& e, uint32_t lo, uint32_t hi) const;

 private:
  friend class GrammarBuilder;
  std::vector<GrammarElement> elems_;
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // inclusive code point ranges
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

// Where a generation stands: the parse stacks still possible (positions in Grammar::elements(),
// the top at the back always a Chars element; an empty stack means the text so far is a complete
// match), sorted and unique so that equal states compare equal, and an unfinished character.
struct GrammarState {
  std::vector<std::vector<uint32_t>> stacks;
  uint32_t partial_cp = 0;   // the unfinished character's bits so far
  uint8_t partial_left = 0;  // its continuation bytes still to come
  uint8_t partial_len = 0;   // its length in bytes (1-4): overlong encodings are refused
  // Tokens of a TokenConstraint's gate still to come before the grammar applies (0: it applies;
  // engine/token_constraint.h). Not part of key(): only states past the gate are interned.
  uint32_t gate_left = 0;
  bool operator==(const GrammarState& o) const = default;
  bool dead() const { return stacks.empty(); }
  // The text so far is a whole sentence of the grammar (the generation may end here).
  bool complete() const;
  // A compact byte string that identifies the state (a cache key).
  std::string key() const;
};

// The state before any text.
GrammarState grammar_start(const Grammar& g);
// Advances `s` over one byte of UTF-8; false (and `s` unspecified) when the grammar cannot take it.
bool grammar_advance(const Grammar& g, GrammarState& s, uint8_t byte);
// Over a whole string; false when some byte is refused.
bool grammar_accepts_prefix(const Grammar& g, GrammarState& s, std::string_view bytes);

}  // namespace fp
