// engine/grammar.cpp — the GBNF parser (text to flattened rules, repetitions rewritten as
// rules, left recursion refused) and the byte-by-byte matcher over parse stacks.
#include "engine/grammar.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace fp {

// ---------------------------------------------------------------------------------------------
// Parsing

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : src_(text) {}

  std::shared_ptr<const Grammar> build(const std::string& root) {
    skip_space();
    FP_CHECK(pos_ < src_.size(), "grammar: empty (no rules)");
    while (pos_ < src_.size()) {
      const size_t at = pos_;
      const std::string name = identifier();
      FP_CHECK(!name.empty(), "grammar line ", line_of(at), ": expected a rule name, found '", excerpt(at), "'");
      skip_space();
      FP_CHECK(src_.substr(pos_, 3) == "::=", "grammar line ", line_of(pos_), ": expected '::=' after rule name '", name, "'");
      pos_ += 3;
      const uint32_t r = rule_id(name);
      FP_CHECK(!defined_[r], "grammar line ", line_of(at), ": rule '", name, "' is defined twice");
      defined_[r] = true;
      rules_[r] = alternatives(false);
      skip_space();
    }
    for (size_t r = 0; r < rules_.size(); ++r)
      FP_CHECK(defined_[r], "grammar: rule '", names_[r], "' is used but never defined");
    auto it = ids_.find(root);
    FP_CHECK(it != ids_.end(), "grammar: no root rule '", root, "'");
    check_left_recursion();

    auto g = std::make_shared<Grammar>();
    g->root_ = it->second;
    g->names_ = names_;
    g->alts_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const Seq& alt : rules_[r]) {
        g->alts_[r].push_back(static_cast<uint32_t>(g->elems_.size()));
        for (const Item& item : alt) {
          GrammarElement e;
          if (item.is_ref) {
            e.kind = GrammarElement::Ref;
            e.ref = item.ref;
          } else {
            e.kind = GrammarElement::Chars;
            e.negated = item.negated;
            std::vector<std::pair<uint32_t, uint32_t>> rs = item.ranges;
            std::sort(rs.begin(), rs.end());
            std::vector<std::pair<uint32_t, uint32_t>> merged;
            for (const auto& x : rs) {
              if (!merged.empty() && x.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, x.second);
              else merged.push_back(x);
            }
            e.first_range = static_cast<uint32_t>(g->ranges_.size());
            e.n_ranges = static_cast<uint32_t>(merged.size());
            g->ranges_.insert(g->ranges_.end(), merged.begin(), merged.end());
          }
          g->elems_.push_back(e);
        }
        g->elems_.push_back(GrammarElement{});  // End
      }
    return g;
  }

 private:
  struct Item {  // a parsed element: a character class or a rule reference
    bool is_ref = false, negated = false;
    uint32_t ref = 0;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
  };
  using Seq = std::vector<Item>;

  std::string_view src_;
  size_t pos_ = 0;
  int group_depth_ = 0;  // ( ) nesting: the parser recurses per level, so it is bounded
  static constexpr int kMaxGroupDepth = 512;
  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, uint32_t> ids_;
  static constexpr size_t kMaxItems = 1 << 20;
  size_t items_ = 0;  // elements written by repetitions so far

  size_t line_of(size_t at) const { return 1 + static_cast<size_t>(std::count(src_.begin(), src_.begin() + static_cast<std::ptrdiff_t>(std::min(at, src_.size())), '\n')); }
  std::string excerpt(size_t at) const {
    std::string s(src_.substr(at, 20));
    const size_t nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  uint32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t r = static_cast<uint32_t>(rules_.size());
    ids_.emplace(name, r);
    names_.push_back(name);
    rules_.emplace_back();
    defined_.push_back(false);
    return r;
  }
  uint32_t anonymous_rule(std::vector<Seq> alts) {
    const uint32_t r = rule_id(std::string(1, '_').append(std::to_string(rules_.size())));
    rules_[r] = std::move(alts);
    defined_[r] = true;
    return r;
  }
  static Item ref_to(uint32_t r) {
    Item it;
    it.is_ref = true;
    it.ref = r;
    return it;
  }

  void skip_space() {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_;
      else if (c == '#') while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      else break;
    }
  }
  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }
  std::string identifier() {
    const size_t start = pos_;
    while (pos_ < src_.size() && name_char(src_[pos_])) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }
  // At `name ::=`: the next rule starts here.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < src_.size() && name_char(src_[p])) ++p;
    if (p == pos_) return false;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r')) ++p;
    return src_.substr(p, 3) == "::=";
  }

  // One UTF-8 character or escape of a literal or class.
  uint32_t character() {
    FP_CHECK(pos_ < src_.size(), "grammar line ", line_of(pos_), ": unexpected end inside a literal or class");
    const unsigned char c = static_cast<unsigned char>(src_[pos_]);
    if (c == '\\') {
      FP_CHECK(pos_ + 1 < src_.size(), "grammar line ", line_of(pos_), ": a '\\' at the end");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '/': case '^': case '\'': return static_cast<uint32_t>(e);
        default: fail("grammar line ", line_of(pos_), ": unknown escape '\\", std::string(1, e), "'");
      }
    }
    size_t len = 1;
    const uint32_t cp = uni::decode_one(src_, pos_, &len);
    FP_CHECK(c < 0x80 || len > 1, "grammar line ", line_of(pos_), ": invalid UTF-8");  // (a bad sequence decodes as 1 byte)
    pos_ += len;
    return cp;
  }
  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      FP_CHECK(pos_ < src_.size() && std::isxdigit(static_cast<unsigned char>(src_[pos_])), "grammar line ", line_of(pos_),
               ": expected ", digits, " hex digits in an escape");
      const char h = src_[pos_];
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    FP_CHECK(v <= 0x10FFFF, "grammar line ", line_of(pos_), ": code point ", v, " is beyond Unicode");
    return v;
  }
  size_t number() {
    const size_t start = pos_;
    size_t v = 0;
    while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) {
      v = v * 10 + static_cast<size_t>(src_[pos_++] - '0');
      FP_CHECK(v <= 10000, "grammar line ", line_of(start), ": a repetition count above 10000");
    }
    FP_CHECK(pos_ > start, "grammar line ", line_of(start), ": expected a number in '{m,n}'");
    return v;
  }

  std::vector<Seq> alternatives(bool in_group) {
    std::vector<Seq> alts;
    alts.push_back(sequence(in_group));
    while (pos_ < src_.size() && src_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence(in_group));
    }
    return alts;
  }

  Seq sequence(bool in_group) {
    Seq seq;
    for (;;) {
      skip_space();
      if (pos_ >= src_.size() || src_[pos_] == '|' || src_[pos_] == ')') break;
      if (!in_group && at_rule_start()) break;
      const size_t at = pos_;
      Seq prim = primary();
      skip_space();
      if (pos_ < src_.size() && (src_[pos_] == '*' || src_[pos_] == '+' || src_[pos_] == '?' || src_[pos_] == '{')) {
        prim = repeat(std::move(prim), at);
      }
      seq.insert(seq.end(), prim.begin(), prim.end());
    }
    FP_CHECK(in_group || pos_ >= src_.size() || src_[pos_] != ')', "grammar line ", line_of(pos_), ": unmatched ')'");
    return seq;
  }

  Seq primary() {
    const size_t at = pos_;
    const char c = src_[pos_];
    Seq out;
    if (c == '"') {
      ++pos_;
      while (pos_ < src_.size() && src_[pos_] != '"') {
        Item it;
        const uint32_t cp = character();
        it.ranges.push_back({cp, cp});
        out.push_back(std::move(it));
      }
      FP_CHECK(pos_ < src_.size(), "grammar line ", line_of(at), ": unterminated literal");
      ++pos_;
    } else if (c == '[') {
      ++pos_;
      Item it;
      if (pos_ < src_.size() && src_[pos_] == '^') {
        it.negated = true;
        ++pos_;
      }
      while (pos_ < src_.size() && src_[pos_] != ']') {
        const uint32_t lo = character();
        uint32_t hi = lo;
        if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
          ++pos_;
          hi = character();
          FP_CHECK(hi >= lo, "grammar line ", line_of(at), ": a class range runs backwards");
        }
        it.ranges.push_back({lo, hi});
      }
      FP_CHECK(pos_ < src_.size(), "grammar line ", line_of(at), ": unterminated character class");
      ++pos_;
      out.push_back(std::move(it));
    } else if (c == '.') {
      ++pos_;
      Item it;
      it.negated = true;  // none of no ranges: any character
      out.push_back(std::move(it));
    } else if (c == '(') {
      ++pos_;
      FP_CHECK(++group_depth_ <= kMaxGroupDepth, "grammar line ", line_of(at), ": groups nested deeper than ", kMaxGroupDepth);
      std::vector<Seq> alts = alternatives(true);
      --group_depth_;
      FP_CHECK(pos_ < src_.size() && src_[pos_] == ')', "grammar line ", line_of(at), ": unmatched '('");
      ++pos_;
      out.push_back(ref_to(anonymous_rule(std::move(alts))));
    } else if (name_char(c)) {
      const std::string name = identifier();
      out.push_back(ref_to(rule_id(name)));
    } else {
      fail("grammar line ", line_of(at), ": unexpected '", excerpt(at), "'");
    }
    return out;
  }

  // x*, x+, x?, x{m}, x{m,}, x{m,n}: written as rules (x* is r ::= x r | empty).
  Seq repeat(Seq x, size_t at) {
    size_t lo = 0, hi = 0;
    bool unbounded = false;
    const char op = src_[pos_++];
    if (op == '*') unbounded = true;
    else if (op == '+') lo = 1, unbounded = true;
    else if (op == '?') hi = 1;
    else {
      skip_space();
      lo = number();
      skip_space();
      hi = lo;
      if (pos_ < src_.size() && src_[pos_] == ',') {
        ++pos_;
        skip_space();
        if (pos_ < src_.size() && src_[pos_] == '}') unbounded = true;
        else hi = number();
        skip_space();
      }
      FP_CHECK(pos_ < src_.size() && src_[pos_] == '}', "grammar line ", line_of(at), ": expected '}' in a repetition");
      ++pos_;
      FP_CHECK(unbounded || hi >= lo, "grammar line ", line_of(at), ": repetition {", lo, ",", hi, "} runs backwards");
    }
    // A bound on what repetitions can build: ("a"{10000}){10000} would be 10^8 elements.
    items_ += (std::max<size_t>(lo, 1) + (unbounded ? 1 : hi - std::min(hi, lo))) * std::max<size_t>(x.size(), 1);
    FP_CHECK(items_ <= kMaxItems, "grammar line ", line_of(at), ": the grammar grows past ", kMaxItems,
             " elements with its repetitions");
    Seq out;
    for (size_t i = 0; i < lo; ++i) out.insert(out.end(), x.begin(), x.end());
    if (unbounded) {
      const uint32_t r = rule_id(std::string(1, '_').append(std::to_string(rules_.size())));
      defined_[r] = true;
      Seq again = x;
      again.push_back(ref_to(r));
      rules_[r] = {again, Seq{}};
      out.push_back(ref_to(r));
    } else if (hi > lo) {
      uint32_t inner = anonymous_rule({x, Seq{}});  // x | empty
      for (size_t k = lo + 1; k < hi; ++k) {
        Seq more = x;
        more.push_back(ref_to(inner));
        inner = anonymous_rule({more, Seq{}});
      }
      out.push_back(ref_to(inner));
    }
    return out;
  }

  // A rule that can reach itself without taking a character would expand forever.
  void check_left_recursion() {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r]) {
          const bool all = std::all_of(alt.begin(), alt.end(), [&](const Item& it) { return it.is_ref && nullable[it.ref]; });
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (const Seq& alt : rules_[r])
        for (const Item& it : alt) {
          if (!it.is_ref) break;
          left[r].push_back(it.ref);
          if (!nullable[it.ref]) break;
        }
    // Depth-first with an explicit stack (a chain of 10^5 rules must not overflow the C++ one).
    std::vector<uint8_t> color(n, 0);  // 0 unseen, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;  // rule, next of its left refs to follow
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start] != 0) continue;
      color[start] = 1;
      path.push_back({start, 0});
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == left[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t s = left[r][next++];
        FP_CHECK(color[s] != 1, "grammar: rule '", names_[s], "' is left-recursive (it can reach itself before any character)");
        if (color[s] == 0) {
          color[s] = 1;
          path.push_back({s, 0});
        }
      }
    }
  }
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, const std::string& root) {
  return GrammarBuilder(text).build(root);
}

bool Grammar::matches(const GrammarElement& e, uint32_t cp) const {
  const auto* b = ranges_.data() + e.first_range;
  const auto* end = b + e.n_ranges;
  const auto* it = std::upper_bound(b, end, cp, [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  const bool in = it != b && (it - 1)->second >= cp;
  return in != e.negated;
}

bool Grammar::matches_any(const GrammarElement& e, uint32_t lo, uint32_t hi) const {
  const auto* b = ranges_.data() + e.first_range;
  const auto* end = b + e.n_ranges;
  if (!e.negated) {
    for (const auto* r = b; r != end; ++r)
      if (r->first <= hi && r->second >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range. The ranges are merged, so
  // [lo, hi] is covered only when one range holds all of it.
  for (const auto* r = b; r != end; ++r)
    if (r->first <= lo && r->second >= hi) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Matching

bool GrammarState::complete() const { return partial_left == 0 && !stacks.empty() && stacks.front().empty(); }

std::string GrammarState::key() const {
  std::string k;
  k.reserve(8 + stacks.size() * 16);
  auto put = [&](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(partial_cp);
  put(partial_left);
  put(partial_len);
  for (const auto& s : stacks) {
    put(static_cast<uint32_t>(s.size()));
    for (uint32_t p : s) put(p);
  }
  return k;
}

namespace {

constexpr size_t kMaxStacks = 1024;

// Past this many stacks from one expansion (before duplicates go) the state is given up: a
// grammar whose rules fan out into each other (x ::= y | y | ..., y ::= z | z | ...) would
// otherwise take time and memory that grow with the product of the fan-outs.
constexpr size_t kMaxExpanded = 16 * kMaxStacks;

// Expands `stack` until its top is a character class (or it is empty: a complete match), adding
// each result to `out`. A reference that ends its alternative replaces the frame instead of
// stacking on it, so right recursion (x* as r ::= x r) keeps stacks flat. Iterative (a worklist
// of partial stacks), since chains of references can be as long as the grammar. False when the
// expansion passed kMaxExpanded (a state of many stacks may hold more in all: the matcher's own
// bound, kMaxStacks, applies after duplicates merge).
bool expand_stack(const Grammar& g, std::vector<uint32_t> stack, std::vector<std::vector<uint32_t>>& out) {
  std::vector<std::vector<uint32_t>> work;
  const size_t before = out.size();  // the cap is per expansion, not per state
  for (;;) {
    for (;;) {
      if (stack.empty()) {
        out.push_back(stack);
        break;
      }
      const uint32_t pos = stack.back();
      const GrammarElement& e = g.elements()[pos];
      if (e.kind == GrammarElement::Chars) {
        out.push_back(std::move(stack));
        break;
      }
      if (e.kind == GrammarElement::End) {
        stack.pop_back();
        continue;
      }
      if (g.elements()[pos + 1].kind == GrammarElement::End) stack.pop_back();
      else stack.back() = pos + 1;
      const std::vector<uint32_t>& alts = g.alternatives(e.ref);
      for (size_t i = 1; i < alts.size(); ++i) {
        work.push_back(stack);
        work.back().push_back(alts[i]);
      }
      stack.push_back(alts[0]);
      if (out.size() - before + work.size() > kMaxExpanded) return false;
    }
    if (out.size() - before > kMaxExpanded) return false;
    if (work.empty()) return true;
    stack = std::move(work.back());
    work.pop_back();
  }
}

void normalize(std::vector<std::vector<uint32_t>>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

bool advance_code_point(const Grammar& g, GrammarState& s, uint32_t cp) {
  std::vector<std::vector<uint32_t>> out;
  std::vector<uint32_t> tmp;
  for (const auto& st : s.stacks) {
    if (st.empty() || !g.matches(g.elements()[st.back()], cp)) continue;
    tmp = st;
    tmp.back() += 1;
    if (!expand_stack(g, tmp, out)) {
      out.clear();
      break;
    }
  }
  normalize(out);
  // An ambiguous grammar can keep exponentially many parses alive (r ::= "a" r "b" | "a" r "c"
  // | ""): past this many the text is refused rather than let one request stall the engine.
  if (out.size() > kMaxStacks) out.clear();
  s.stacks = std::move(out);
  return !s.stacks.empty();
}

}  // namespace

GrammarState grammar_start(const Grammar& g) {
  GrammarState s;
  std::vector<uint32_t> tmp;
  for (uint32_t a : g.alternatives(g.root())) {
    tmp.assign(1, a);
    if (!expand_stack(g, tmp, s.stacks)) {
      s.stacks.clear();  // a dead state: nothing can be written
      break;
    }
  }
  normalize(s.stacks);
  return s;
}

bool grammar_advance(const Grammar& g, GrammarState& s, uint8_t byte) {
  uint32_t cp = s.partial_cp;
  uint32_t left = s.partial_left, len = s.partial_len;
  if (left == 0) {
    if (byte < 0x80) return advance_code_point(g, s, byte);
    if ((byte & 0xE0) == 0xC0 && byte >= 0xC2) cp = byte & 0x1Fu, left = 1, len = 2;
    else if ((byte & 0xF0) == 0xE0) cp = byte & 0x0Fu, left = 2, len = 3;
    else if ((byte & 0xF8) == 0xF0 && byte <= 0xF4) cp = byte & 0x07u, left = 3, len = 4;
    else return false;  // a continuation byte without a lead, or no UTF-8 lead at all
  } else {
    if ((byte & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (byte & 0x3Fu);
    --left;
  }
  // The code points this encoding can still become: never an overlong form (a shorter encoding's
  // code point, such as E0 80 BA for ':'), a surrogate, or beyond U+10FFFF.
  const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  const uint32_t lo = std::max(cp << (6 * left), min_cp);
  const uint32_t hi = std::min((cp << (6 * left)) | ((1u << (6 * left)) - 1), 0x10FFFFu);
  if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
  if (left == 0) {
    s.partial_cp = 0;
    s.partial_left = s.partial_len = 0;
    return advance_code_point(g, s, cp);
  }
  // Still inside a character: some stack must take a code point that starts this way.
  bool any = false;
  for (const auto& st : s.stacks)
    if (!st.empty() && g.matches_any(g.elements()[st.back()], lo, hi)) {
      any = true;
      break;
    }
  s.partial_cp = cp;
  s.partial_left = static_cast<uint8_t>(left);
  s.partial_len = static_cast<uint8_t>(len);
  return any;
}

bool grammar_accepts_prefix(const Grammar& g, GrammarState& s, std::string_view bytes) {
  for (char c : bytes)
    if (!grammar_advance(g, s, static_cast<uint8_t>(c))) return false;
  return true;
}

std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace fp
