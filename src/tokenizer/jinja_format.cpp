// tokenizer/jinja_format.cpp — Python string formatting for templates: str.format ("{0:>8.2f}",
// "{name}") and printf-style "%s %05.1f" % args (also the `format` filter), over one shared
// implementation of Python's format-spec mini-language.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/unicode.h"

namespace fp::jinja {
namespace {

struct Spec {
  std::string fill = " ";
  char align = 0;  // '<', '>', '^', '=' or 0 (default for the type)
  char sign = '-';
  bool alt = false;
  int64_t width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

int64_t read_int(const std::string& s, size_t& k) {
  int64_t v = 0;
  while (k < s.size() && is_ascii_digit(s[k])) {
    v = v * 10 + (s[k++] - '0');
    if (v > int64_t(kMaxBuiltString)) raise("format width or precision too large");
  }
  return v;
}

Spec parse_spec(const std::string& s) {
  Spec sp;
  size_t k = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  size_t first_len = s.empty() ? 0 : uni::utf8_len(static_cast<uint8_t>(s[0]));
  if (s.size() > first_len && is_align(s[first_len])) {
    sp.fill = s.substr(0, first_len);
    sp.align = s[first_len];
    k = first_len + 1;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = s[0];
    k = 1;
  }
  if (k < s.size() && (s[k] == '+' || s[k] == '-' || s[k] == ' ')) sp.sign = s[k++];
  if (k < s.size() && s[k] == '#') {
    sp.alt = true;
    ++k;
  }
  if (k < s.size() && s[k] == '0') {
    if (!sp.align) {
      sp.fill.assign(1, '0');
      sp.align = '=';
    }
    ++k;
  }
  if (k < s.size() && is_ascii_digit(s[k])) sp.width = read_int(s, k);
  if (k < s.size() && (s[k] == ',' || s[k] == '_')) sp.grouping = s[k++];
  if (k < s.size() && s[k] == '.') {
    ++k;
    if (k >= s.size() || !is_ascii_digit(s[k])) raise("format specifier missing precision");
    sp.precision = int(read_int(s, k));
  }
  if (k < s.size()) sp.type = s[k++];
  if (k != s.size()) raise("invalid format specifier '" + s + "'");
  return sp;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  const size_t n = digits.size();
  for (size_t k = 0; k < n; ++k) {
    if (k && (n - k) % 3 == 0) out += sep;
    out += digits[k];
  }
  return out;
}

// Pads `body` (with its sign/prefix split off as `head`) to the spec's width.
std::string align(const std::string& head, const std::string& body, const Spec& sp, char default_align) {
  int64_t len = 0;
  for (const char c : head + body) len += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  const char a = sp.align ? sp.align : default_align;
  if (sp.width <= len) return head + body;
  const int64_t marg = sp.width - len;
  std::string fill;
  auto repeat = [&](int64_t n) {
    std::string r;
    for (int64_t k = 0; k < n; ++k) r += sp.fill;
    return r;
  };
  if (a == '<') return head + body + repeat(marg);
  if (a == '>') return repeat(marg) + head + body;
  if (a == '=') return head + repeat(marg) + body;
  return repeat(marg / 2) + head + body + repeat(marg - marg / 2);
}

std::string format_value(const Value& v, const Spec& sp) {
  const char t = sp.type;
  if (v.is_str() || ((t == 0 || t == 's') && !v.is_number())) {
    if (t != 0 && t != 's') raise(std::string("Unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
    if (sp.align == '=') raise("'=' alignment not allowed in string format specifier");
    std::string s = to_str(v);
    if (sp.precision >= 0) {
      const std::vector<uint32_t> cps = code_points(s);
      s = from_code_points(cps, 0, std::min(cps.size(), size_t(sp.precision)));
    }
    return align("", s, sp, '<');
  }
  if (!v.is_number()) raise(std::string("Unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
  const bool as_int = (t == 0 || t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c' || t == 'n') &&
                      v.is_integral();
  std::string head, body;
  if (as_int) {
    const int64_t x = v.as_int();
    const uint64_t mag = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
    if (x < 0) head = "-";
    else if (sp.sign == '+') head = "+";
    else if (sp.sign == ' ') head = " ";
    if (t == 'c') {
      if (x < 0 || x > 0x10FFFF) raise("%c arg not in range(0x110000)");
      std::string c;
      uni::append_utf8(c, uint32_t(x));
      return align("", c, sp, '<');
    }
    const int base = t == 'x' || t == 'X' ? 16 : t == 'o' ? 8 : t == 'b' ? 2 : 10;
    std::string digits;
    uint64_t m = mag;
    do {
      const int d = int(m % uint64_t(base));
      digits.insert(digits.begin(), char(d < 10 ? '0' + d : (t == 'X' ? 'A' : 'a') + d - 10));
      m /= uint64_t(base);
    } while (m);
    if (sp.alt && base != 10) head += base == 16 ? (t == 'X' ? "0X" : "0x") : base == 8 ? "0o" : "0b";
    body = sp.grouping ? group_digits(digits, sp.grouping) : digits;
    return align(head, body, sp, '>');
  }
  if (t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c')
    raise(std::string("Unknown format code '") + t + "' for object of type 'float'");
  double x = v.as_double();
  if (std::signbit(x)) head = "-";
  else if (sp.sign == '+') head = "+";
  else if (sp.sign == ' ') head = " ";
  x = std::fabs(x);
  if (t == 0 && sp.precision < 0) {
    body = py_float_repr(x);
  } else {
    const int prec = sp.precision < 0 ? 6 : sp.precision;
    char conv = t == 0 ? 'g' : t == '%' ? 'f' : t == 'n' ? 'g' : t;
    if (!(conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G'))
      raise(std::string("Unknown format code '") + t + "' for object of type 'float'");
    char fmt[16];
    std::snprintf(fmt, sizeof fmt, sp.alt ? "%%#.%d%c" : "%%.%d%c", prec, conv);
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, t == '%' ? x * 100 : x);
    body = buf;
    if (t == '%') body += '%';
    if (sp.grouping) {
      const size_t dot = body.find_first_not_of("0123456789");
      body = group_digits(body.substr(0, dot), sp.grouping) + (dot == std::string::npos ? "" : body.substr(dot));
    }
  }
  return align(head, body, sp, '>');
}

// One replacement field's value: "0", "name", "name.attr", "0[key]", or "" for the next positional.
Value field_value(const std::string& field, const CallArgs& a, size_t& auto_index) {
  size_t k = 0;
  while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
  const std::string head = field.substr(0, k);
  Value v;
  if (head.empty() || std::all_of(head.begin(), head.end(), is_ascii_digit)) {
    size_t idx = auto_index;
    if (head.empty()) ++auto_index;
    else if (head.size() > 9) raise("Replacement index " + head + " out of range for positional args tuple");
    else idx = size_t(std::atol(head.c_str()));
    if (idx >= a.pos.size()) raise("Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
    v = a.pos[idx];
  } else {
    bool found = false;
    for (const auto& [name, x] : a.kw)
      if (name == head) {
        v = x;
        found = true;
      }
    if (!found) raise("KeyError: '" + head + "'");
  }
  while (k < field.size()) {
    if (field[k] == '.') {
      size_t e = k + 1;
      while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
      v = get_attr(v, field.substr(k + 1, e - k - 1));
      k = e;
    } else {
      const size_t e = field.find(']', k);
      if (e == std::string::npos) raise("Missing ']' in format string");
      const std::string key = field.substr(k + 1, e - k - 1);
      const bool num = !key.empty() && key.size() <= 18 && std::all_of(key.begin(), key.end(), is_ascii_digit);
      v = get_item(v, num ? Value::integer(std::atoll(key.c_str())) : Value::str(key));
      k = e + 1;
    }
  }
  return v;
}

}  // namespace

Value brace_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else raise("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    const size_t e = fmt.find('}', k);
    if (e == std::string::npos) raise("expected '}' before end of string");
    std::string field = fmt.substr(k + 1, e - k - 1), spec;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conv = 0;
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    Value v = field_value(field, a, auto_index);
    if (conv == 'r') v = Value::str(repr(v));
    else if (conv == 's') v = Value::str(to_str(v));
    else if (conv) raise("Unknown conversion specifier " + std::string(1, conv));
    out += format_value(v, parse_spec(spec));
    if (out.size() > kMaxBuiltString) raise("string too long");
    k = e;
  }
  return Value::str(std::move(out));
}

Value percent_format(const std::string& fmt, const ValueList& args, const Value* mapping) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) raise("incomplete format");
    Value v;
    bool have = false;
    if (fmt[k] == '(') {
      const size_t e = fmt.find(')', k);
      if (e == std::string::npos) raise("incomplete format key");
      if (!mapping) raise("format requires a mapping");
      const Value* x = mapping->dict->find(std::string_view(fmt).substr(k + 1, e - k - 1));
      if (!x) raise("KeyError: '" + fmt.substr(k + 1, e - k - 1) + "'");
      v = *x;
      have = true;
      k = e + 1;
    }
    Spec sp;
    for (; k < fmt.size(); ++k) {
      const char f = fmt[k];
      if (f == '-') sp.align = '<';
      else if (f == '+') sp.sign = '+';
      else if (f == ' ' && sp.sign != '+') sp.sign = ' ';
      else if (f == '#') sp.alt = true;
      else if (f == '0') sp.fill.assign(1, '0');
      else break;
    }
    if (k < fmt.size() && is_ascii_digit(fmt[k])) sp.width = read_int(fmt, k);
    if (k < fmt.size() && fmt[k] == '.') {
      ++k;
      sp.precision = int(read_int(fmt, k));
    }
    if (k >= fmt.size()) raise("incomplete format");
    const char t = fmt[k];
    if (t == '%') {
      out += '%';
      continue;
    }
    if (!have) {
      if (next >= args.size()) raise("not enough arguments for format string");
      v = args[next++];
    }
    if (sp.fill == "0" && sp.align != '<' && v.is_number()) sp.align = '=';
    else sp.fill.assign(1, ' ');
    if (!sp.align) sp.align = '>';
    switch (t) {
      case 's': out += format_value(Value::str(to_str(v)), sp); break;
      case 'r':
      case 'a': out += format_value(Value::str(repr(v)), sp); break;
      case 'd':
      case 'i':
      case 'u':
        if (!v.is_number()) raise("%" + std::string(1, t) + " format: a real number is required, not " + type_name(v));
        sp.type = 'd';
        sp.precision = -1;
        out += format_value(Value::integer(v.kind == Value::Float ? int64_t(std::trunc(v.f)) : v.as_int()), sp);
        break;
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
        if (!v.is_number()) raise("must be real number, not " + type_name(v));
        sp.type = t;
        out += format_value(Value::number(v.as_double()), sp);
        break;
      case 'x': case 'X': case 'o': case 'c':
        if (!v.is_integral()) raise("%" + std::string(1, t) + " format: an integer is required, not " + type_name(v));
        sp.type = t;
        out += format_value(v, sp);
        break;
      default: raise("unsupported format character '" + std::string(1, t) + "'");
    }
    if (out.size() > kMaxBuiltString) raise("string too long");
  }
  if (!mapping && next < args.size()) raise("not all arguments converted during string formatting");
  return Value::str(std::move(out));
}

}  // namespace fp::jinja
