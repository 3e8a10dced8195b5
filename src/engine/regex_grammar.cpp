// engine/regex_grammar.cpp — the pattern compiler: a recursive-descent parser over the pattern
// that writes GBNF as it goes, character sets kept as code point ranges until they are written
// out in their JSON-escaped form.
#include "engine/regex_grammar.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace fp {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxCount = 1000;
constexpr int kMaxDepth = 100;  // group nesting (the compiler recurses per level)
constexpr size_t kMaxPatternBytes = 4096;
constexpr size_t kMaxGbnfBytes = 1 << 20;

// Any character of a JSON string, escapes included: what an unanchored side may hold.
const char* const kAnyJsonChar = R"(([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})))";

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.push_back({lo, hi});
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

bool contains(const Ranges& r, uint32_t cp) {
  for (const auto& [lo, hi] : r)
    if (cp >= lo && cp <= hi) return true;
  return false;
}

// A code point as GBNF writes it inside a literal or class.
std::string gbnf_char(uint32_t cp) {
  if (cp < 0x80 && std::isalnum(static_cast<int>(cp))) return std::string(1, static_cast<char>(cp));
  char buf[16];
  if (cp < 0x80) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

// The set written as it appears inside a JSON string: most characters as themselves, `"` and `\`
// and control characters as escapes (one form each).
std::string json_chars(const Ranges& set) {
  const Ranges s = normalized(set);
  std::vector<std::string> alts;
  Ranges plain;
  for (auto [lo, hi] : s) {
    lo = std::max<uint32_t>(lo, 0x20);
    for (const auto& [cut_lo, cut_hi] : std::vector<std::pair<uint32_t, uint32_t>>{{'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}}) {
      if (lo > hi) break;
      if (cut_lo > lo && cut_lo <= hi) plain.push_back({lo, cut_lo - 1});
      if (cut_lo <= hi && cut_hi >= lo) lo = std::max(lo, cut_hi + 1);
    }
    if (lo <= hi) plain.push_back({lo, hi});
  }
  if (!plain.empty()) {
    std::string cls = "[";
    for (const auto& [lo, hi] : plain) cls += gbnf_char(lo) + (hi > lo ? "-" + gbnf_char(hi) : "");
    alts.push_back(cls + "]");
  }
  // The escapes share one alternative after the backslash, so that a set such as `.` costs the
  // matcher two parses per character, not one per escape: `"` and `\` and the short forms
  // (\b \f \n \r \t) as one class, the other controls as u00 and two hex digits.
  std::string after_backslash;
  if (contains(s, '"')) after_backslash += gbnf_char('"');
  if (contains(s, '\\')) after_backslash += gbnf_char('\\');
  std::string by_high_nibble[2];
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!contains(s, c)) continue;
    const char short_form = c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : 0;
    if (short_form) {
      after_backslash += short_form;
      continue;
    }
    const uint32_t low = c & 15;
    by_high_nibble[c >> 4] += low < 10 ? std::string(1, static_cast<char>('0' + low))
                                       : std::string{static_cast<char>('a' + low - 10), static_cast<char>('A' + low - 10)};
  }
  std::vector<std::string> escapes;
  if (!after_backslash.empty()) escapes.push_back("[" + after_backslash + "]");
  std::string unicode;
  for (int high = 0; high < 2; ++high)
    if (!by_high_nibble[high].empty())
      unicode += std::string(unicode.empty() ? "" : " | ") + "\"" + static_cast<char>('0' + high) + "\" [" + by_high_nibble[high] + "]";
  if (!unicode.empty()) escapes.push_back("\"u00\" (" + unicode + ")");
  if (!escapes.empty()) alts.push_back("\"\\\\\" " + (escapes.size() == 1 ? escapes[0] : "(" + escapes[0] + " | " + escapes[1] + ")"));
  if (alts.empty()) return "[]";  // matches nothing
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's \s: WhiteSpace and LineTerminator.
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

// A piece of the pattern as GBNF, with what the grammar needs to repeat it: a repetition of
// something that can match nothing would be left-recursive, so a nullable piece also carries its
// non-empty part (the same strings but the empty one).
struct Piece {
  std::string gbnf;
  bool nullable = false;
  std::string nonempty;  // nullable pieces: "" when the piece matches the empty string only
};

// The set as plain text: its code points but NUL and the surrogates (no UTF-8 text holds them).
std::string text_chars(const Ranges& set) {
  std::string cls;
  for (auto [lo, hi] : normalized(set)) {
    lo = std::max<uint32_t>(lo, 1);
    if (lo < 0xD800 && hi > 0xDFFF) {
      cls += gbnf_char(lo) + "-" + gbnf_char(0xD7FF);
      lo = 0xE000;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      lo = 0xE000;
    } else if (hi >= 0xD800 && hi <= 0xDFFF) {
      hi = 0xD7FF;
    }
    if (lo <= hi) cls += gbnf_char(lo) + (hi > lo ? "-" + gbnf_char(hi) : "");
  }
  return cls.empty() ? "[]" : "[" + cls + "]";
}

enum class PatternTarget { JsonString, Text };

class PatternCompiler {
 public:
  PatternCompiler(const std::string& p, PatternTarget target) : p_(p), target_(target) {}

  std::string compile() {
    if (p_.size() > kMaxPatternBytes) bad("longer than " + std::to_string(kMaxPatternBytes) + " bytes", 0);
    std::vector<std::string> alts;
    for (;;) {
      const bool start_anchor = pos_ < p_.size() && p_[pos_] == '^';
      if (start_anchor) ++pos_;
      end_anchor_ = false;
      std::string seq = sequence(0).gbnf;
      if (target_ == PatternTarget::JsonString) {  // a search: free text where a side is not anchored
        if (!start_anchor) seq = std::string(kAnyJsonChar) + "* " + seq;
        if (!end_anchor_) seq += std::string(" ") + kAnyJsonChar + "*";
      }
      alts.push_back(seq);
      if (pos_ == p_.size()) break;
      if (p_[pos_] == ')') bad("an unmatched ')'");
      ++pos_;  // '|'
    }
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
    if (body.size() > kMaxGbnfBytes) bad("the pattern's grammar grows past 1 MiB", 0);
    if (target_ == PatternTarget::Text) return "(" + body + ")";
    return "\"\\\"\" (" + body + ") \"\\\"\"";
  }

 private:
  Piece chars(const Ranges& set) const {
    const std::string g = target_ == PatternTarget::Text ? text_chars(set) : json_chars(set);
    if (g == "[]") bad("a class that matches no character that can be written");
    return {g, false, g};
  }

  const std::string& p_;
  PatternTarget target_;
  size_t pos_ = 0;
  bool end_anchor_ = false;

  [[noreturn]] void bad(const std::string& what, size_t at = std::string::npos) const {
    const std::string shown = p_.size() > 80 ? p_.substr(0, 77) + "..." : p_;
    fail("pattern '", shown, "' at offset ", at == std::string::npos ? pos_ : at, ": ", what);
  }

  Piece alternation(int depth) {
    std::vector<Piece> alts = {sequence(depth)};
    while (pos_ < p_.size() && p_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    if (alts.size() == 1) return alts[0];
    Piece out;
    std::string nonempty;
    for (const Piece& a : alts) {
      out.gbnf += (out.gbnf.empty() ? "" : " | ") + a.gbnf;
      out.nullable = out.nullable || a.nullable;
      if (!a.nonempty.empty()) nonempty += (nonempty.empty() ? "" : " | ") + a.nonempty;
    }
    out.gbnf = "(" + out.gbnf + ")";
    out.nonempty = nonempty.empty() ? "" : "(" + nonempty + ")";
    return out;
  }

  Piece sequence(int depth) {
    std::vector<Piece> parts;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$') {
        if (depth == 0 && (pos_ + 1 == p_.size() || p_[pos_ + 1] == '|')) {
          end_anchor_ = true;
          ++pos_;
          break;
        }
        bad("'$' is supported only at the end of the pattern");
      }
      Piece piece = atom(depth);
      size_t lo = 1, hi = 1;
      bool unbounded = false;
      if (quantifier(lo, hi, unbounded)) {
        if (pos_ < p_.size() && p_[pos_] == '?') ++pos_;  // lazy: the same strings
        piece = repeated(piece, lo, hi, unbounded);
        if (pos_ < p_.size() && (p_[pos_] == '*' || p_[pos_] == '+' || p_[pos_] == '?')) bad("a quantifier after a quantifier");
      }
      parts.push_back(piece);
    }
    Piece out;
    out.nullable = true;
    for (const Piece& p : parts) {
      out.gbnf += (out.gbnf.empty() ? "" : " ") + p.gbnf;
      out.nullable = out.nullable && p.nullable;
    }
    if (out.gbnf.empty()) return {"\"\"", true, ""};
    if (out.gbnf.size() > kMaxGbnfBytes) bad("the pattern's grammar grows past 1 MiB");
    if (!out.nullable) {
      out.nonempty = out.gbnf;
      return out;
    }
    if (depth == 0) return out;  // the top level is never repeated: no non-empty part needed
    // Every part can match nothing: the non-empty strings start with some part's non-empty
    // string, the parts before it empty. (Quadratic in the parts, hence the size bound.)
    std::string nonempty;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].nonempty.empty()) continue;
      std::string alt = parts[i].nonempty;
      for (size_t j = i + 1; j < parts.size() && alt.size() <= kMaxGbnfBytes; ++j) alt += " " + parts[j].gbnf;
      nonempty += (nonempty.empty() ? "" : " | ") + alt;
      if (nonempty.size() > kMaxGbnfBytes) bad("the pattern's grammar grows past 1 MiB (many optional pieces under a repetition)");
    }
    out.nonempty = nonempty.empty() ? "" : "(" + nonempty + ")";
    return out;
  }

  // x{lo,hi}; a nullable x repeats its non-empty part (x{lo,hi} then equals x'{0,hi}).
  static Piece repeated(const Piece& x, size_t lo, size_t hi, bool unbounded) {
    if (!unbounded && hi == 0) return {"\"\"", true, ""};
    if (x.nullable) {
      if (x.nonempty.empty()) return x;  // the empty string only, however often
      lo = 0;
    }
    const std::string body = "(" + (x.nullable ? x.nonempty : x.gbnf) + ")";
    auto suffix = [&](size_t from) {
      if (unbounded) return from == 0 ? std::string("*") : from == 1 ? std::string("+") : "{" + std::to_string(from) + ",}";
      if (from == 0 && hi == 1) return std::string("?");
      if (from == hi) return from == 1 ? std::string() : "{" + std::to_string(from) + "}";
      return "{" + std::to_string(from) + "," + std::to_string(hi) + "}";
    };
    Piece out;
    out.gbnf = body + suffix(lo);
    out.nullable = lo == 0;
    out.nonempty = lo == 0 ? body + suffix(1) : out.gbnf;
    return out;
  }

  // A quantifier at pos_, consumed; false (nothing consumed) when there is none.
  bool quantifier(size_t& lo, size_t& hi, bool& unbounded) {
    if (pos_ >= p_.size()) return false;
    const char c = p_[pos_];
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      lo = c == '+' ? 1 : 0, hi = 1, unbounded = c != '?';
      return true;
    }
    if (c != '{') return false;
    size_t i = pos_ + 1;
    auto number = [&](size_t& v) {
      const size_t start = i;
      v = 0;
      while (i < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i]))) {
        v = v * 10 + static_cast<size_t>(p_[i++] - '0');
        if (v > kMaxCount) bad("a count above " + std::to_string(kMaxCount), start);
      }
      return i > start;
    };
    if (!number(lo)) return false;  // a literal '{'
    hi = lo, unbounded = false;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(hi)) unbounded = true;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    if (!unbounded && hi < lo) bad("a count {" + std::to_string(lo) + "," + std::to_string(hi) + "} that runs backwards");
    pos_ = i + 1;
    return true;
  }

  Piece atom(int depth) {
    const size_t at = pos_;
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.compare(pos_, 2, "?:") == 0) {
        pos_ += 2;
      } else if (p_.compare(pos_, 3, "?<=") == 0 || p_.compare(pos_, 3, "?<!") == 0 || p_.compare(pos_, 2, "?=") == 0 ||
                 p_.compare(pos_, 2, "?!") == 0) {
        bad("lookaround is not supported", at);
      } else if (p_.compare(pos_, 2, "?<") == 0) {
        const size_t close = p_.find('>', pos_);
        if (close == std::string::npos) bad("an unterminated group name", at);
        pos_ = close + 1;
      } else if (pos_ < p_.size() && p_[pos_] == '?') {
        bad("an unknown group kind", at);
      }
      if (depth >= kMaxDepth) bad("groups nested deeper than " + std::to_string(kMaxDepth), at);
      Piece inner = alternation(depth + 1);
      if (pos_ >= p_.size() || p_[pos_] != ')') bad("an unmatched '('", at);
      ++pos_;
      return inner;
    }
    if (c == '[') return chars(char_class());
    if (c == '.') {
      ++pos_;
      return chars(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      Ranges set;
      const uint32_t cp = escape(false, &set);
      return chars(set.empty() ? Ranges{{cp, cp}} : set);
    }
    if (c == '^') bad("'^' is supported only at the start of the pattern");
    if (c == '*' || c == '+' || c == '?') bad("nothing to repeat");
    if (c == '{') {
      size_t lo, hi;
      bool unbounded;
      if (quantifier(lo, hi, unbounded)) bad("nothing to repeat", at);
    }
    const uint32_t cp = code_point();
    return chars({{cp, cp}});
  }

  uint32_t code_point() {
    size_t len = 1;
    const uint32_t cp = uni::decode_one(p_, pos_, &len);
    if (static_cast<unsigned char>(p_[pos_]) >= 0x80 && len == 1) bad("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k, ++pos_) {
      if (pos_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[pos_]))) bad("expected " + std::to_string(digits) + " hex digits");
      const char h = p_[pos_];
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  // An escape at pos_ ('\'); a class escape (\d ...) fills *set, anything else is one code point.
  uint32_t escape(bool in_class, Ranges* set) {
    const size_t at = pos_++;
    if (pos_ >= p_.size()) bad("a '\\' at the end", at);
    const char e = p_[pos_++];
    switch (e) {
      case 'd': *set = kDigits; return 0;
      case 'D': *set = complement(kDigits); return 0;
      case 'w': *set = kWord; return 0;
      case 'W': *set = complement(kWord); return 0;
      case 's': *set = kSpace; return 0;
      case 'S': *set = complement(kSpace); return 0;
      case 't': return '\t';
      case 'n': return '\n';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u': {
        // JSON Schema's patterns come from JavaScript, whose strings are UTF-16: a character
        // past U+FFFF is written as a surrogate pair, \uD83D\uDE00.
        const uint32_t u = hex(4);
        if (u < 0xD800 || u > 0xDFFF) return u;
        if (u <= 0xDBFF && p_.compare(pos_, 2, "\\u") == 0) {
          const size_t back = pos_;
          pos_ += 2;
          const uint32_t low = hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF) return 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
          pos_ = back;
        }
        bad("a lone surrogate (\\u" + std::to_string(u) + " in decimal) is not a character", at);
      }
      case 'b':
        if (in_class) return '\b';
        bad("a word boundary (\\b) is not supported", at);
      case 'B': bad("\\B is not supported", at);
      case 'p': case 'P': bad("Unicode property escapes (\\p{...}) are not supported", at);
      case 'k': bad("backreferences are not supported", at);
      case 'c': bad("control escapes (\\cX) are not supported", at);
      default:
        if (e >= '1' && e <= '9') bad("backreferences are not supported", at);
        if (std::isalnum(static_cast<unsigned char>(e))) bad(std::string("unknown escape '\\") + e + "'", at);
        --pos_;
        return code_point();  // an escaped punctuation character (or any other) stands for itself
    }
  }

  Ranges char_class() {
    const size_t at = pos_++;
    bool negated = false;
    if (pos_ < p_.size() && p_[pos_] == '^') negated = true, ++pos_;
    Ranges set;
    if (pos_ < p_.size() && p_[pos_] == ']') bad("an empty class '[]' matches nothing", at);
    // One member: a code point, or a class escape (its set in *member_set).
    auto member = [&](Ranges* member_set) -> uint32_t {
      member_set->clear();
      if (p_[pos_] == '\\') return escape(true, member_set);
      return code_point();
    };
    while (pos_ < p_.size() && p_[pos_] != ']') {
      Ranges lo_set;
      const uint32_t lo = member(&lo_set);
      if (!lo_set.empty()) {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
        continue;
      }
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi_set;
        const uint32_t hi = member(&hi_set);
        if (!hi_set.empty()) bad("a class range ending in a class escape", at);
        if (hi < lo) bad("a class range that runs backwards", at);
        set.push_back({lo, hi});
      } else {
        set.push_back({lo, lo});
      }
    }
    if (pos_ >= p_.size()) bad("an unterminated class", at);
    ++pos_;
    return negated ? complement(set) : normalized(set);
  }
};

}  // namespace

std::string pattern_to_gbnf(const std::string& pattern) { return PatternCompiler(pattern, PatternTarget::JsonString).compile(); }

std::string regex_text_gbnf(const std::string& pattern) { return PatternCompiler(pattern, PatternTarget::Text).compile(); }

std::string format_pattern(const std::string& format) {
  // Dates that exist (30-day months, February's 28 days and 29 in leap years), years 0001-9999
  // (what Python's datetime, behind pydantic, takes); times without leap seconds, up to
  // microseconds: the strict side of RFC 3339, so that every client's parser accepts them.
  const std::string year = R"((000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3}))";
  const std::string leap_year = R"((\d\d(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00))";
  const std::string date = "(" + year + R"(-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8])))" +
                           "|" + leap_year + "-02-29)";
  const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  const std::string label = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
  const std::string octet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "T" + time + "$";
  if (format == "duration") {  // RFC 3339 Appendix A: P, then a date part and/or a T time part, or weeks
    const std::string n = R"(\d{1,9})";
    const std::string second = n + "S", minute = n + "M(" + second + ")?", hour = n + "H(" + minute + ")?";
    const std::string time_part = "T(" + hour + "|" + minute + "|" + second + ")";
    const std::string day = n + "D", month = n + "M(" + day + ")?", years = n + "Y(" + month + ")?";
    return "^P((" + day + "|" + month + "|" + years + ")(" + time_part + ")?|" + time_part + "|" + n + "W)$";
  }
  if (format == "uuid") return R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)";
  if (format == "email") {
    const std::string atom = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)";
    return "^" + atom + R"((\.)" + atom + ")*@" + label + R"((\.)" + label + ")+$";
  }
  if (format == "hostname") return "^" + label + R"((\.)" + label + ")*$";
  if (format == "ipv4") return "^(" + octet + R"(\.){3})" + octet + "$";
  if (format == "ipv6") {  // eight groups, or fewer around one "::" (no embedded IPv4)
    const std::string h = "[0-9a-fA-F]{1,4}";
    std::string alts = "(" + h + ":){7}" + h;
    for (int before = 0; before <= 7; ++before) {
      const int after_max = 7 - before;
      std::string alt = before == 0 ? "::" : (before > 1 ? "(" + h + ":){" + std::to_string(before - 1) + "}" : "") + h + "::";
      if (after_max > 0) alt += "(" + h + (after_max > 1 ? "(:" + h + "){0," + std::to_string(after_max - 1) + "}" : "") + ")?";
      alts += "|" + alt;
    }
    return "^(" + alts + ")$";
  }
  if (format == "uri") return R"(^[A-Za-z][A-Za-z0-9+.\-]*:([A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$)";
  return "";
}

}  // namespace fp
