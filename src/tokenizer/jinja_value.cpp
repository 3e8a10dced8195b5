// tokenizer/jinja_value.cpp — Python semantics of interpreter values: str/repr, truth, equality and
// ordering, json.dumps, len/iteration, and the Unicode helpers (whitespace, simple case mapping).
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/unicode.h"

namespace fp::jinja {

namespace {
constexpr int kMaxDataDepth = 512;  // nesting of lists/dicts any recursive operation walks
void check_depth(int depth) {
  if (depth > kMaxDataDepth) raise("data nested deeper than " + std::to_string(kMaxDataDepth) + " levels");
}
}  // namespace

void raise(std::string message) { throw JinjaError{std::move(message)}; }

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (const auto p : parts) out += p;
  return out;
}

Value Value::make_list(ValueList items, bool is_tuple) {
  Value v;
  v.kind = List;
  v.tuple = is_tuple;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::make_dict() {
  Value v;
  v.kind = Dict;
  v.dict = std::make_shared<DictObj>();
  return v;
}

Value Value::make_object(std::string type) {
  Value v;
  v.kind = Object;
  v.dict = std::make_shared<DictObj>();
  v.dict->type_name = std::move(type);
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> f) {
  Value v;
  v.kind = Func;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(f)});
  return v;
}

const Value* DictObj::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.kind == Value::Str && k.s == key) return &v;
  return nullptr;
}

void DictObj::set(Value key, Value v) {
  for (auto& [k, old] : items)
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

const Value& CallArgs::get(size_t index, std::string_view name, const Value& missing) const {
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  if (index < pos.size()) return pos[index];
  return missing;
}

bool CallArgs::has(size_t index, std::string_view name) const {
  if (index < pos.size()) return true;
  for (const auto& kv : kw)
    if (kv.first == name) return true;
  return false;
}

void CallArgs::check(size_t max_pos, std::initializer_list<std::string_view> names) const {
  if (pos.size() > max_pos)
    raise(callee + "() takes at most " + std::to_string(max_pos) + " positional arguments (" +
          std::to_string(pos.size()) + " given)");
  for (const auto& kv : kw)
    if (std::find(names.begin(), names.end(), kv.first) == names.end())
      raise(callee + "() got an unexpected keyword argument '" + kv.first + "'");
}

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
      return Value::number(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::make_dict();
      d.dict->items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.dict->items.emplace_back(Value::str(k), from_json_at(e, depth + 1));
      return d;
    }
    default: raise("unsupported JSON value (binary or discarded)");
  }
}

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "Undefined";
    case Value::None: return "NoneType";
    case Value::Bool: return "bool";
    case Value::Int: return "int";
    case Value::Float: return "float";
    case Value::Str: return "str";
    case Value::List: return v.tuple ? "tuple" : "list";
    case Value::Dict: return "dict";
    case Value::Object: return v.dict->type_name;
    case Value::Func: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
    case Value::None: return false;
    case Value::Bool: return v.b;
    case Value::Int: return v.i != 0;
    case Value::Float: return v.f != 0;
    case Value::Str: return !v.s.empty();
    case Value::List: return !v.list->empty();
    case Value::Dict: return !v.dict->items.empty();
    case Value::Object:
    case Value::Func: return true;
  }
  return false;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e+17"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  if (exp >= -4 && exp < 16) {  // fixed notation, at least one digit after the point
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else {
      if (digits.size() <= size_t(exp) + 1) digits += std::string(size_t(exp) + 1 - digits.size(), '0');
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
      if (out.back() == '.') out += '0';
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + mant + e;
}

namespace {

bool py_printable(uint32_t cp) {
  if (cp == ' ') return true;
  const uni::Gc g = uni::category(cp);
  return !(g == uni::Cc || g == uni::Cf || g == uni::Cs || g == uni::Co || g == uni::Cn || g == uni::Zl ||
           g == uni::Zp || g == uni::Zs);
}

std::string repr_str(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t k = 0; k < s.size();) {
    size_t len = 1;
    const uint32_t cp = uni::decode_one(s, k, &len);
    char buf[16];
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (cp < 0x7f || py_printable(cp)) {
      out.append(s, k, len);
    } else {
      std::snprintf(buf, sizeof buf, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x", cp);
      out += buf;
    }
    k += len;
  }
  out += quote;
  return out;
}

std::string repr_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind) {
    case Value::Undefined: return "Undefined";
    case Value::Str: return repr_str(v.s);
    case Value::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr_at((*v.list)[k], depth + 1);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Dict:
    case Value::Object: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) out += ", ";
        out += repr_at(v.dict->items[k].first, depth + 1) + ": " + repr_at(v.dict->items[k].second, depth + 1);
      }
      out += "}";
      if (v.kind == Value::Object) return "<" + v.dict->type_name + " " + out + ">";
      return out;
    }
    case Value::Func: return "<function " + v.fn->name + ">";
    default: return to_str(v);
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: return py_float_repr(v.f);
    case Value::Str: return v.s;
    default: return repr_at(v, 0);
  }
}

std::string repr(const Value& v) { return repr_at(v, 0); }

namespace {
bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Float || b.kind == Value::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Undefined:
    case Value::None: return true;
    case Value::Str: return a.s == b.s;
    case Value::List:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals_at((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    case Value::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals_at(v, *o, depth + 1)) return false;
      }
      return true;
    case Value::Object: return a.dict == b.dict;
    case Value::Func: return a.fn == b.fn;
    default: return false;
  }
}

bool less_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Float || b.kind == Value::Float) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.kind == Value::Str && b.kind == Value::Str) return a.s < b.s;  // UTF-8 bytes order as code points
  if (a.kind == Value::List && b.kind == Value::List && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      const Value &x = (*a.list)[k], &y = (*b.list)[k];
      if (!equals_at(x, y, depth + 1)) return less_at(x, y, depth + 1);
    }
    return a.list->size() < b.list->size();
  }
  if (a.is_undefined() || b.is_undefined()) raise("'" + (a.is_undefined() ? a.s : b.s) + "' is undefined");
  raise("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}
}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool less(const Value& a, const Value& b) { return less_at(a, b, 0); }

namespace {

void json_str(std::string& out, const std::string& s, bool ascii) {
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (ascii && static_cast<unsigned char>(c) >= 0x80) {
      size_t len = 1;
      uint32_t cp = uni::decode_one(s, k, &len);
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
      k += len - 1;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Value::Str: return k.s;
    case Value::Int: return std::to_string(k.i);
    case Value::Float: return json_float(k.f);
    case Value::Bool: return k.b ? "true" : "false";
    case Value::None: return "null";
    default: raise("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void json_at(std::string& out, const Value& v, const JsonStyle& st, int level) {
  check_depth(level);
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += st.indent_is_str ? st.indent_str : std::string(size_t(st.indent), ' ');
  };
  const bool pretty = st.indent >= 0 || st.indent_is_str;
  switch (v.kind) {
    case Value::None: out += "null"; return;
    case Value::Bool: out += v.b ? "true" : "false"; return;
    case Value::Int: out += std::to_string(v.i); return;
    case Value::Float: out += json_float(v.f); return;
    case Value::Str: json_str(out, v.s, st.ensure_ascii); return;
    case Value::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        if (pretty) newline(level + 1);
        json_at(out, (*v.list)[k], st, level + 1);
      }
      if (pretty) newline(level);
      out += ']';
      return;
    }
    case Value::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return less(a->first, b->first); });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        if (pretty) newline(level + 1);
        json_str(out, json_key(items[k]->first), st.ensure_ascii);
        out += st.key_sep;
        json_at(out, items[k]->second, st, level + 1);
      }
      if (pretty) newline(level);
      out += '}';
      return;
    }
    default: raise("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json_text(const Value& v, const JsonStyle& style) {
  std::string out;
  json_at(out, v, style, 0);
  return out;
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return 0;
    case Value::Str: {
      int64_t n = 0;
      for (const char c : v.s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      return n;
    }
    case Value::List: return int64_t(v.list->size());
    case Value::Dict: return int64_t(v.dict->items.size());
    default: raise("object of type '" + type_name(v) + "' has no len()");
  }
}

ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return {};
    case Value::List: return *v.list;
    case Value::Dict: {
      ValueList keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Str: {
      ValueList chars;
      for (size_t k = 0; k < v.s.size();) {
        const size_t len = std::min(uni::utf8_len(static_cast<uint8_t>(v.s[k])), v.s.size() - k);
        chars.push_back(Value::str(v.s.substr(k, len)));
        k += len;
      }
      return chars;
    }
    default: raise("'" + type_name(v) + "' object is not iterable");
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

bool py_is_space(uint32_t cp) { return uni::is_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    size_t len = 1;
    out.push_back(uni::decode_one(s, k, &len));
    k += len;
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end && k < cps.size(); ++k) uni::append_utf8(out, cps[k]);
  return out;
}

// Simple (one-to-one) case mapping for ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and
// full-width Latin; other scripts are returned unchanged (a known gap against Python).
uint32_t to_upper(uint32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp == 0xB5) return 0x39C;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x131) return 'I';
    if (cp == 0x17F) return 'S';
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp % 2 == 0) ? cp - 1 : cp;
    if (cp == 0x130 || cp == 0x138 || cp == 0x149 || cp == 0x178) return cp;
    return (cp % 2 == 1) ? cp - 1 : cp;
  }
  if (cp >= 0x3B1 && cp <= 0x3CB && cp != 0x3C2) return cp - 32;
  if (cp == 0x3C2) return 0x3A3;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if (cp >= 0xFF41 && cp <= 0xFF5A) return cp - 32;
  return cp;
}

uint32_t to_lower(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x130) return 'i';
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp % 2 == 1) ? cp + 1 : cp;
    if (cp == 0x131 || cp == 0x138 || cp == 0x149 || cp == 0x17F) return cp;
    return (cp % 2 == 0) ? cp + 1 : cp;
  }
  if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 32;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if (cp >= 0xFF21 && cp <= 0xFF3A) return cp + 32;
  return cp;
}

bool is_cased_upper(uint32_t cp) { return uni::category(cp) == uni::Lu || uni::category(cp) == uni::Lt; }
bool is_cased_lower(uint32_t cp) { return uni::category(cp) == uni::Ll; }

std::string upper(std::string_view s) {
  std::string out;
  for (const uint32_t cp : code_points(s)) uni::append_utf8(out, to_upper(cp));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (const uint32_t cp : code_points(s)) uni::append_utf8(out, to_lower(cp));
  return out;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  auto strippable = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : py_is_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

}  // namespace fp::jinja
