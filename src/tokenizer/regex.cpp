// tokenizer/regex.cpp — parser (pattern -> tree), compiler (tree -> program) and the
// backtracking matcher of the pre-tokenizer regex subset described in regex.h.
#include "tokenizer/regex.h"

#include <cctype>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace fp {

namespace {

bool is_ascii_letter(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
// Simple case folding onto ASCII letters: ASCII upper case, plus the two non-ASCII characters
// that fold to an ASCII letter (U+017F long s, U+212A Kelvin sign), as Oniguruma folds them.
uint32_t fold(uint32_t c) {
  if (c < 128) return is_ascii_letter(c) ? (c | 0x20) : c;
  if (c == 0x17F) return 's';
  if (c == 0x212A) return 'k';
  return c;
}

// One item of a character class; `neg` inverts the item (\P{..}, \S, \D, \W inside [...]).
struct ClassItem {
  enum Kind : uint8_t { Range, Category, Space } kind = Range;
  bool neg = false;
  uint32_t lo = 0, hi = 0;
  uni::GcMask mask = 0;
};
struct CharClass {
  bool negated = false;
  bool ci = false;
  std::vector<ClassItem> items;

  bool test_raw(uint32_t cp) const {
    for (const auto& it : items) {
      bool hit = false;
      switch (it.kind) {
        case ClassItem::Range: hit = cp >= it.lo && cp <= it.hi; break;
        case ClassItem::Category: hit = uni::in(cp, it.mask); break;
        case ClassItem::Space: hit = uni::is_space(cp); break;
      }
      if (hit != it.neg) return true;
    }
    return false;
  }
  bool test(uint32_t cp) const {
    bool hit = test_raw(cp);
    if (!hit && ci) {
      const uint32_t f = fold(cp);
      hit = (f != cp && test_raw(f)) || (is_ascii_letter(f) && test_raw(f ^ 0x20));
    }
    return hit != negated;
  }
};

struct Node {
  enum Kind : uint8_t { Empty, Char, Class, Begin, End, Concat, Alt, Repeat, Look } kind = Empty;
  explicit Node(Kind k = Empty) : kind(k) {}
  uint32_t cp = 0;
  bool ci = false;
  int cls = -1;
  int min = 0, max = 0;  // Repeat; max < 0: unbounded
  bool greedy = true;
  bool neg = false;      // Look
  std::vector<Node> kids;
};

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::Char: case Node::Class: return false;
    case Node::Concat:
      for (const auto& k : n.kids) if (!nullable(k)) return false;
      return true;
    case Node::Alt:
      for (const auto& k : n.kids) if (nullable(k)) return true;
      return false;
    case Node::Repeat: return n.min == 0 || nullable(n.kids[0]);
    default: return true;
  }
}

class RegexParser {
 public:
  RegexParser(const std::string& pattern, std::vector<CharClass>& classes) : pattern_(pattern), classes_(classes) {
    // Decode the pattern once; escapes and classes are then read code point by code point.
    for (size_t i = 0; i < pattern.size();) {
      size_t len;
      p_.push_back(uni::decode_one(pattern, i, &len));
      i += len;
    }
  }
  Node parse() {
    Node n = parse_alt(false);
    if (i_ != p_.size()) error("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex '", pattern_, "': ", what, " at character ", i_);
  }
  bool eof() const { return i_ >= p_.size(); }
  uint32_t peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : 0; }
  uint32_t next() {
    if (eof()) error("unexpected end of pattern");
    return p_[i_++];
  }
  bool accept(uint32_t c) {
    if (!eof() && p_[i_] == c) { ++i_; return true; }
    return false;
  }

  Node parse_alt(bool in_group) {
    if (++depth_ > 100) error("groups nested too deeply");
    const bool saved_ci = ci_;
    Node alt{Node::Alt};
    alt.kids.push_back(parse_concat());
    while (accept('|')) alt.kids.push_back(parse_concat());
    if (in_group && !accept(')')) error("missing ')'");
    ci_ = saved_ci;  // (?i) reaches the end of its group only
    --depth_;
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node parse_concat() {
    Node seq{Node::Concat};
    while (!eof() && peek() != '|' && peek() != ')') {
      Node atom = parse_atom();
      if (atom.kind == Node::Empty) continue;
      seq.kids.push_back(parse_quantifier(std::move(atom)));
    }
    return seq;
  }

  Node parse_quantifier(Node atom) {
    int stacked = 0;
    while (!eof()) {
      int mn, mx;
      const uint32_t c = peek();
      if (c == '?') { mn = 0; mx = 1; ++i_; }
      else if (c == '*') { mn = 0; mx = -1; ++i_; }
      else if (c == '+') { mn = 1; mx = -1; ++i_; }
      else if (c == '{' && peek(1) >= '0' && peek(1) <= '9') {
        ++i_;
        mn = read_int();
        mx = mn;
        if (accept(',')) mx = (peek() == '}') ? -1 : read_int();
        if (!accept('}')) error("bad {n,m} quantifier");
        if (mx >= 0 && mx < mn) error("bad {n,m} quantifier");
        if (mn > 1000 || mx > 1000) error("repeat count too large");
      } else {
        break;
      }
      if (atom.kind == Node::Begin || atom.kind == Node::End || atom.kind == Node::Look) error("quantifier on an assertion");
      if (++stacked > 4) error("too many stacked quantifiers");
      Node rep{Node::Repeat};
      rep.min = mn;
      rep.max = mx;
      if (accept('?')) rep.greedy = false;
      else if (peek() == '+') error("possessive quantifiers are not supported");
      rep.kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  int read_int() {
    int v = 0;
    if (!(peek() >= '0' && peek() <= '9')) error("expected a number");
    while (peek() >= '0' && peek() <= '9') v = v * 10 + static_cast<int>(next() - '0');
    return v;
  }

  Node literal(uint32_t cp) {
    Node n{Node::Char};
    n.cp = cp;
    n.ci = ci_ && is_ascii_letter(cp);
    return n;
  }
  Node class_node(CharClass cc) {
    cc.ci = ci_;
    classes_.push_back(std::move(cc));
    Node n{Node::Class};
    n.cls = static_cast<int>(classes_.size() - 1);
    return n;
  }

  Node parse_atom() {
    const uint32_t c = next();
    switch (c) {
      case '(': return parse_group();
      case '[': return class_node(parse_class());
      case '.': {
        CharClass cc;
        cc.negated = true;
        cc.items.push_back({ClassItem::Range, false, '\n', '\n', 0});
        return class_node(cc);
      }
      case '^': return Node{Node::Begin};
      case '$': return Node{Node::End};
      case '\\': {
        const uint32_t e = peek();
        if (e == 'A') { ++i_; return Node{Node::Begin}; }
        if (e == 'z' || e == 'Z') { ++i_; return Node{Node::End}; }
        if (e == 'b' || e == 'B' || e == 'G' || e == 'K' || (e >= '1' && e <= '9')) error("unsupported escape");
        ClassItem item;
        uint32_t cp;
        if (parse_escape(&item, &cp)) {
          CharClass cc;
          cc.items.push_back(item);
          return class_node(cc);
        }
        return literal(cp);
      }
      case '*': case '+': case '?': error("quantifier without an operand");
      default: return literal(c);
    }
  }

  Node parse_group() {
    if (accept('?')) {
      if (accept(':')) return wrap_group();
      if (accept('=') || accept('!')) {
        Node look{Node::Look};
        look.neg = p_[i_ - 1] == '!';
        look.kids.push_back(parse_alt(true));
        return look;
      }
      if (peek() == 'i') {
        ++i_;
        if (accept(')')) { ci_ = true; return Node{Node::Empty}; }
        if (accept(':')) {
          const bool saved = ci_;
          ci_ = true;
          Node n = parse_alt(true);
          ci_ = saved;
          return n;
        }
      }
      error("unsupported group syntax");
    }
    return wrap_group();  // capturing groups behave as plain groups: only the whole match matters
  }
  Node wrap_group() { return parse_alt(true); }

  // Reads an escape after '\'. Returns true and fills *item for a class escape (\p, \s, \d, \w...),
  // else returns false with the literal code point in *cp.
  bool parse_escape(ClassItem* item, uint32_t* cp) {
    const uint32_t e = next();
    switch (e) {
      case 'p': case 'P': {
        std::string name;
        if (accept('{')) {
          while (!eof() && peek() != '}') name += static_cast<char>(next());
          if (!accept('}')) error("unterminated \\p{");
        } else {
          name = static_cast<char>(next());
        }
        bool neg = e == 'P';
        if (!name.empty() && name[0] == '^') { neg = !neg; name.erase(0, 1); }
        const uni::GcMask m = uni::mask_for_name(name);
        if (!m) error("unknown Unicode property '" + name + "'");
        *item = {ClassItem::Category, neg, 0, 0, m};
        return true;
      }
      case 's': case 'S': *item = {ClassItem::Space, e == 'S', 0, 0, 0}; return true;
      case 'd': case 'D': *item = {ClassItem::Category, e == 'D', 0, 0, uni::gc_bit(uni::Nd)}; return true;
      case 'w': case 'W':
        *item = {ClassItem::Category, e == 'W', 0, 0, uni::kLetter | uni::kMark | uni::gc_bit(uni::Nd) | uni::gc_bit(uni::Pc)};
        return true;
      case 'r': *cp = '\r'; return false;
      case 'n': *cp = '\n'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case 'e': *cp = 0x1B; return false;
      case 'a': *cp = 0x07; return false;
      case '0': *cp = 0; return false;
      case 'x': case 'u': {
        uint32_t v = 0;
        const bool braced = accept('{');
        const int digits = braced ? 8 : (e == 'x' ? 2 : 4);
        int n = 0;
        for (; n < digits && std::isxdigit(static_cast<int>(peek() < 128 ? peek() : 0)); ++n) {
          const uint32_t h = next();
          v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (n == 0 || (braced && !accept('}'))) error("bad hex escape");
        *cp = v;
        return false;
      }
      default:
        if (e < 128 && std::isalnum(static_cast<int>(e))) error(std::string("unsupported escape \\") + static_cast<char>(e));
        *cp = e;  // escaped punctuation (or any non-ASCII character) stands for itself
        return false;
    }
  }

  CharClass parse_class() {
    CharClass cc;
    cc.negated = accept('^');
    bool first = true;
    while (true) {
      if (eof()) error("unterminated character class");
      uint32_t c = next();
      if (c == ']' && !first) break;
      first = false;
      if (c == '[') error("nested character classes are not supported");
      uint32_t lo;
      if (c == '\\') {
        ClassItem item;
        if (parse_escape(&item, &lo)) {
          cc.items.push_back(item);
          continue;
        }
      } else {
        lo = c;
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != 0) {
        ++i_;
        uint32_t h = next();
        if (h == '\\') {
          ClassItem item;
          if (parse_escape(&item, &h)) error("class escape as a range end");
        }
        hi = h;
        if (hi < lo) error("reversed range in character class");
      }
      cc.items.push_back({ClassItem::Range, false, lo, hi, 0});
    }
    return cc;
  }

  const std::string& pattern_;
  std::vector<CharClass>& classes_;
  std::vector<uint32_t> p_;
  size_t i_ = 0;
  bool ci_ = false;
  int depth_ = 0;
};

}  // namespace

struct Regex::Program {
  enum Op : uint8_t { Char, CharCi, Class, Split, Jmp, Begin, End, Look, Match };
  struct Inst {
    Op op;
    bool neg = false;
    uint32_t a = 0, b = 0;
  };
  std::vector<Inst> code;
  std::vector<CharClass> classes;

  size_t emit(Op op, uint32_t a = 0, uint32_t b = 0) {
    if (code.size() >= (1u << 20)) fail("regex: pattern compiles to over 1M instructions (nested counted repeats?)");
    code.push_back({op, false, a, b});
    return code.size() - 1;
  }
  uint32_t here() const { return static_cast<uint32_t>(code.size()); }

  void compile(const Node& n) {
    switch (n.kind) {
      case Node::Empty: break;
      case Node::Char: emit(n.ci ? CharCi : Char, n.ci ? (n.cp | 0x20) : n.cp); break;
      case Node::Class: emit(Class, static_cast<uint32_t>(n.cls)); break;
      case Node::Begin: emit(Begin); break;
      case Node::End: emit(End); break;
      case Node::Concat:
        for (const auto& k : n.kids) compile(k);
        break;
      case Node::Alt: {
        std::vector<size_t> jumps;
        for (size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const size_t split = emit(Split);
            code[split].a = here();
            compile(n.kids[k]);
            jumps.push_back(emit(Jmp));
            code[split].b = here();
          } else {
            compile(n.kids[k]);
          }
        }
        for (size_t j : jumps) code[j].a = here();
        break;
      }
      case Node::Repeat: {
        const Node& body = n.kids[0];
        for (int k = 0; k < n.min; ++k) compile(body);
        if (n.max < 0) {
          if (nullable(body)) {  // a loop over an empty-matching body could spin: allow one extra pass
            optional(body, n.greedy);
            break;
          }
          const uint32_t loop = here();
          const size_t split = emit(Split);
          compile(body);
          emit(Jmp, loop);
          set_split(split, loop + 1, here(), n.greedy);
        } else {
          std::vector<size_t> splits;
          for (int k = n.min; k < n.max; ++k) {
            splits.push_back(emit(Split));
            code[splits.back()].a = here();
            compile(body);
          }
          for (size_t s : splits) set_split(s, code[s].a, here(), n.greedy);
        }
        break;
      }
      case Node::Look: {
        const size_t look = emit(Look);
        code[look].neg = n.neg;
        code[look].a = here();
        compile(n.kids[0]);
        emit(Match);
        code[look].b = here();
        break;
      }
    }
  }
  void optional(const Node& body, bool greedy) {
    const size_t split = emit(Split);
    const uint32_t start = here();
    compile(body);
    set_split(split, start, here(), greedy);
  }
  // Split tries `a` first; a lazy quantifier prefers skipping the body.
  void set_split(size_t at, uint32_t body, uint32_t skip, bool greedy) {
    code[at].a = greedy ? body : skip;
    code[at].b = greedy ? skip : body;
  }

  // Backtracking run from pc at pos; returns the end position of the first match, or -1.
  int64_t run(uint32_t pc, size_t pos, const uint32_t* cps, size_t begin, size_t end, uint64_t* steps) const {
    thread_local std::vector<std::pair<uint32_t, size_t>> stack;
    const size_t base = stack.size();
    int64_t result = -1;
    while (true) {
      if (++*steps > 50'000'000) {
        stack.resize(base);
        fail("regex: match exceeded the step limit (pathological pattern or input)");
      }
      const Inst& in = code[pc];
      bool ok = true;
      switch (in.op) {
        case Char: ok = pos < end && cps[pos] == in.a; if (ok) { ++pos; ++pc; } break;
        case CharCi: ok = pos < end && fold(cps[pos]) == in.a; if (ok) { ++pos; ++pc; } break;
        case Class: ok = pos < end && classes[in.a].test(cps[pos]); if (ok) { ++pos; ++pc; } break;
        case Split: stack.emplace_back(in.b, pos); pc = in.a; break;
        case Jmp: pc = in.a; break;
        case Begin: ok = pos == begin; ++pc; break;
        case End: ok = pos == end; ++pc; break;
        case Look: {
          const bool hit = run(in.a, pos, cps, begin, end, steps) >= 0;
          ok = hit != in.neg;
          pc = in.b;
          break;
        }
        case Match: result = static_cast<int64_t>(pos); break;
      }
      if (result >= 0) break;
      if (!ok) {
        if (stack.size() == base) break;
        pc = stack.back().first;
        pos = stack.back().second;
        stack.pop_back();
      }
    }
    stack.resize(base);
    return result;
  }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern), prog_(std::make_unique<Program>()) {
  RegexParser parser(pattern, prog_->classes);
  Node root = parser.parse();
  prog_->compile(root);
  prog_->emit(Program::Match);
}
Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

int64_t Regex::match_at(const uint32_t* cps, size_t begin, size_t end, size_t pos) const {
  uint64_t steps = 0;
  const int64_t e = prog_->run(0, pos, cps, begin, end, &steps);
  return e < 0 ? -1 : e - static_cast<int64_t>(pos);
}

}  // namespace fp
