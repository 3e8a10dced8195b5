// tokenizer/jinja_lexer.cpp — the Jinja lexer: data/tag splitting with jinja2's whitespace rules
// (trim_blocks, lstrip_blocks, '-' and '+' markers, a final newline dropped), comments, raw
// blocks, and the tokens inside {{ }} / {% %} (names, numbers, strings with escapes, operators).
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/unicode.h"

namespace fp::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : name_(name) {
    // jinja2 turns \r\n and \r into \n and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t t = find_tag(pos_);
      if (t == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        break;
      }
      std::string text = src_.substr(pos_, t - pos_);
      const size_t text_at = pos_;
      const char kind = src_[t + 1];
      size_t p = t + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      apply_lstrip(text, sign, kind != '{');
      emit_data(std::move(text), text_at);
      if (kind == '#') {
        comment(p, t);
      } else if (kind == '%' && raw_begin(p)) {
        raw(t);
      } else {
        tag(kind == '{' ? Token::VarBegin : Token::BlockBegin, t, p);
      }
    }
    push(Token::Eof, "", src_.size());
    return std::move(out_);
  }

 private:
  std::string src_;
  const std::string& name_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // the previous match ended with a newline (jinja2's line_starting)

  [[noreturn]] void error(size_t at, const std::string& what) const {
    const auto [line, col] = line_col(at);
    fail(name_, ":", line, ":", col, ": ", what);
  }

  std::pair<int, int> line_col(size_t at) const {
    size_t lo = 0, hi = line_starts_.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      (line_starts_[mid] <= at ? lo : hi) = mid;
    }
    return {int(lo + 1), int(at - line_starts_[lo] + 1)};
  }

  Token& push(Token::Kind kind, std::string text, size_t at) {
    Token tok;
    tok.kind = kind;
    tok.text = std::move(text);
    std::tie(tok.line, tok.col) = line_col(at);
    out_.push_back(std::move(tok));
    return out_.back();
  }

  void emit_data(std::string text, size_t at) {
    if (!text.empty()) push(Token::Data, std::move(text), at);
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  // Whitespace before a tag: '-' strips all of it; otherwise lstrip_blocks strips spaces between
  // the line start and a block or comment tag when nothing else is there.
  void apply_lstrip(std::string& text, char sign, bool block_or_comment) const {
    if (sign == '-') {
      text = strip(text, nullptr, false, true);
    } else if (sign != '+' && block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
          strip(std::string_view(text).substr(l_pos), nullptr, true, false).empty())
        text.resize(l_pos);
    }
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t len = 1;
      const uint32_t cp = uni::decode_one(src_, p, &len);
      if (!py_is_space(cp)) break;
      p += len;
    }
    return p;
  }

  bool starts(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // The end of a block or comment: "+X" keeps what follows, "-X" strips all whitespace after,
  // plain "X" drops one newline (trim_blocks). Returns the position after it.
  size_t end_block_like(size_t p, std::string_view end, bool trim) {
    size_t q;
    if (src_[p] == '+') {
      q = p + 1 + end.size();
    } else if (src_[p] == '-') {
      q = skip_space(p + 1 + end.size());
    } else {
      q = p + end.size();
      if (trim && q < src_.size() && src_[q] == '\n') ++q;
    }
    line_starting_ = q > 0 && src_[q - 1] == '\n';
    return q;
  }

  void comment(size_t p, size_t begin) {
    const size_t q = src_.find("#}", p);
    if (q == std::string::npos) error(begin, "missing end of comment tag");
    const size_t e = (q > p && (src_[q - 1] == '-' || src_[q - 1] == '+')) ? q - 1 : q;
    pos_ = end_block_like(e, "#}", true);
  }

  bool raw_begin(size_t p) {
    p = skip_space(p);
    if (!starts(p, "raw")) return false;
    p = skip_space(p + 3);
    if (starts(p, "-%}")) {
      pos_ = skip_space(p + 3);
    } else if (starts(p, "%}")) {
      pos_ = p + 2;
    } else {
      return false;
    }
    line_starting_ = src_[pos_ - 1] == '\n';
    return true;
  }

  void raw(size_t begin) {
    for (size_t k = find_tag(pos_); k != std::string::npos; k = find_tag(k + 1)) {
      if (src_[k + 1] != '%') continue;
      size_t p = k + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_space(p);
      if (!starts(p, "endraw")) continue;
      p = skip_space(p + 6);
      if (!(starts(p, "%}") || starts(p, "-%}") || starts(p, "+%}"))) continue;
      std::string text = src_.substr(pos_, k - pos_);
      apply_lstrip(text, sign, true);
      emit_data(std::move(text), pos_);
      pos_ = end_block_like(p, "%}", true);
      return;
    }
    error(begin, "missing end of raw directive");
  }

  void tag(Token::Kind begin_kind, size_t begin, size_t p) {
    push(begin_kind, "", begin);
    const bool block = begin_kind == Token::BlockBegin;
    const std::string_view end = block ? "%}" : "}}";
    std::vector<char> balance;
    for (;;) {
      p = skip_space(p);
      if (p >= src_.size())
        error(begin, std::string("unexpected end of template, expected end of ") +
                         (block ? "statement block ('%}')" : "print statement ('}}')"));
      if (balance.empty()) {
        const bool plus = block && starts(p + 1, end) && src_[p] == '+';
        const bool minus = starts(p + 1, end) && src_[p] == '-';
        if (plus || minus || starts(p, end)) {
          push(block ? Token::BlockEnd : Token::VarEnd, "", p);
          pos_ = end_block_like(p, end, block);
          return;
        }
      }
      p = token(p, balance);
    }
  }

  // Lexes one token inside a tag starting at p; returns the position after it.
  size_t token(size_t p, std::vector<char>& balance) {
    const char c = src_[p];
    if (is_digit(c)) return number(p);
    if (is_name_start(c)) {
      size_t q = p;
      while (q < src_.size() && is_name_char(src_[q])) ++q;
      push(Token::Name, src_.substr(p, q - p), p);
      return q;
    }
    if (c == '\'' || c == '"') return string(p);
    static const char* const kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kOps2)
      if (starts(p, op)) {
        push(Token::Op, op, p);
        return p + 2;
      }
    static const std::string_view kOps1 = "+-/*%~[](){}><=.:|,;";
    if (kOps1.find(c) == std::string_view::npos) {
      size_t len = 1;
      std::string ch;
      uni::append_utf8(ch, uni::decode_one(src_, p, &len));
      error(p, "unexpected char '" + ch + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(p, std::string("unexpected '") + c + "'");
      if (balance.back() != c) error(p, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      balance.pop_back();
    }
    push(Token::Op, std::string(1, c), p);
    return p + 1;
  }

  // Digits with optional '_' separators between them; returns the end (== p when none).
  size_t digits(size_t p, bool (*ok)(char)) const {
    size_t q = p;
    while (q < src_.size() && ok(src_[q])) {
      ++q;
      if (q + 1 < src_.size() && src_[q] == '_' && ok(src_[q + 1])) ++q;
    }
    return q;
  }

  size_t number(size_t p) {
    auto keep = [](std::string s) {
      std::string out;
      for (const char ch : s)
        if (ch != '_') out += ch;
      return out;
    };
    // float: digits ( (.digits)? e[+-]?digits | .digits ), unless right after a '.'
    const size_t int_end = digits(p, is_digit);
    if (p == 0 || src_[p - 1] != '.') {
      size_t q = int_end;
      bool frac = false;
      if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
        q = digits(q + 1, is_digit);
        frac = true;
      }
      bool expo = false;
      if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t e = q + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && is_digit(src_[e])) {
          q = digits(e, is_digit);
          expo = true;
        }
      }
      if (frac || expo) {
        Token& tok = push(Token::Float, src_.substr(p, q - p), p);
        tok.f = std::strtod(keep(tok.text).c_str(), nullptr);
        return q;
      }
    }
    // integer: 0b / 0o / 0x prefixes, [1-9](_?\d)*, 0(_?0)*
    int base = 10;
    size_t q = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = char(src_[p + 1] | 0x20);
      auto bin = [](char ch) { return ch == '0' || ch == '1'; };
      auto oct = [](char ch) { return ch >= '0' && ch <= '7'; };
      auto hex = [](char ch) { return is_digit(ch) || (char(ch | 0x20) >= 'a' && char(ch | 0x20) <= 'f'); };
      bool (*ok)(char) = x == 'b' ? +bin : x == 'o' ? +oct : x == 'x' ? +hex : nullptr;
      size_t start = p + 2;
      if (ok && start < src_.size() && src_[start] == '_') ++start;
      if (ok && start < src_.size() && ok(src_[start])) {
        base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
        q = digits(start, ok);
        const std::string body = keep(src_.substr(p + 2, q - p - 2));
        return push_int(src_.substr(p, q - p), body, base, p, q);
      }
      auto zero = [](char ch) { return ch == '0'; };
      q = digits(p, zero);
      return push_int(src_.substr(p, q - p), "0", 10, p, q);
    }
    q = int_end;
    return push_int(src_.substr(p, q - p), keep(src_.substr(p, q - p)), base, p, q);
  }

  size_t push_int(std::string text, const std::string& body, int base, size_t p, size_t q) {
    errno = 0;
    const long long v = std::strtoll(body.c_str(), nullptr, base);
    if (errno == ERANGE) error(p, "integer literal " + text + " is too large");
    Token& tok = push(Token::Int, std::move(text), p);
    tok.i = v;
    return q;
  }

  size_t string(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    for (;;) {
      if (q >= src_.size()) error(p, "unterminated string literal");
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) error(p, "unterminated string literal");
      q = escape(q + 1, out);
    }
    push(Token::String, std::move(out), p);
    return q + 1;
  }

  // Python's unicode-escape after a backslash at p-1; appends the character, returns the position after.
  size_t escape(size_t p, std::string& out) {
    const char c = src_[p];
    auto hex_digits = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 0; k < n; ++k) {
        const size_t at = p + 1 + k;
        const char h = at < src_.size() ? char(src_[at] | 0x20) : 0;
        if (!(is_digit(h) || (h >= 'a' && h <= 'f'))) error(p - 1, "truncated \\" + std::string(1, c) + " escape");
        v = v * 16 + uint32_t(is_digit(h) ? h - '0' : h - 'a' + 10);
      }
      if (v > 0x10FFFF) error(p - 1, "illegal Unicode character in escape");
      uni::append_utf8(out, v);
      return p + 1 + n;
    };
    switch (c) {
      case '\n': return p + 1;
      case '\\': out += '\\'; return p + 1;
      case '\'': out += '\''; return p + 1;
      case '"': out += '"'; return p + 1;
      case 'a': out += '\a'; return p + 1;
      case 'b': out += '\b'; return p + 1;
      case 'f': out += '\f'; return p + 1;
      case 'n': out += '\n'; return p + 1;
      case 'r': out += '\r'; return p + 1;
      case 't': out += '\t'; return p + 1;
      case 'v': out += '\v'; return p + 1;
      case 'x': return hex_digits(2);
      case 'u': return hex_digits(4);
      case 'U': return hex_digits(8);
      default: break;
    }
    if (c >= '0' && c <= '7') {
      uint32_t v = 0;
      size_t q = p;
      while (q < p + 3 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7') v = v * 8 + uint32_t(src_[q++] - '0');
      uni::append_utf8(out, v);
      return q;
    }
    out += '\\';  // unknown escapes stay as written
    return p;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& name) { return Lexer(source, name).run(); }

}  // namespace fp::jinja
