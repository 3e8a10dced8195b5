// tokenizer/jinja_methods.cpp — attribute, item and slice access in jinja2's sandboxed lookup order,
// Python `in`, the str/dict/list methods templates call (strip, split, startswith, items, get, ...)
// and the global functions (range, dict, namespace, raise_exception, strftime_now).
#include <algorithm>
#include <ctime>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/unicode.h"

namespace fp::jinja {
namespace {

// Python's clamping of a slice-like index into [0, n].
int64_t clamp_index(const Value& v, int64_t n, int64_t def) {
  if (v.is_none() || v.is_undefined()) return def;
  if (!v.is_integral()) raise("slice indices must be integers or None");
  int64_t i = v.as_int();
  if (i < 0) i = std::max<int64_t>(0, i + n);
  return std::min(i, n);
}

const std::string& str_arg(const CallArgs& a, size_t i, std::string_view name) {
  const Value& v = a.get(i, name, kMissing);
  if (!v.is_str()) raise(a.callee + "() argument '" + std::string(name) + "' must be str, not " + type_name(v));
  return v.s;
}

// The byte range of s[start:end] with code-point indices (Python's start/end arguments).
std::pair<size_t, size_t> byte_range(const std::string& s, const CallArgs& a, size_t first) {
  if (!a.has(first, "start") && !a.has(first + 1, "end")) return {0, s.size()};
  const uni::CodePoints cps = uni::to_code_points(s);
  const int64_t n = int64_t(cps.cps.size());
  const int64_t b = clamp_index(a.get(first, "start", kMissing), n, 0);
  const int64_t e = clamp_index(a.get(first + 1, "end", kMissing), n, n);
  if (e < b) return {0, 0};
  return {cps.offsets[size_t(b)], cps.offsets[size_t(e)]};
}

int64_t cp_count(std::string_view s) {
  int64_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

ValueList split_whitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  std::vector<uint32_t> cps = code_points(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  ValueList out;
  size_t k = 0;
  while (k < cps.size()) {
    while (k < cps.size() && py_is_space(cps[k])) ++k;
    if (k == cps.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = cps.size();
      if (from_right) {
        std::vector<uint32_t> rest(cps.begin() + long(k), cps.end());
        std::reverse(rest.begin(), rest.end());
        out.push_back(Value::str(from_code_points(rest, 0, rest.size())));
      } else {
        out.push_back(Value::str(from_code_points(cps, k, e)));
      }
      break;
    }
    const size_t b = k;
    while (k < cps.size() && !py_is_space(cps[k])) ++k;
    std::vector<uint32_t> word(cps.begin() + long(b), cps.begin() + long(k));
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(Value::str(from_code_points(word, 0, word.size())));
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

ValueList split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) raise("empty separator");
  ValueList out;
  if (!from_right) {
    size_t b = 0;
    for (;;) {
      const size_t at = (maxsplit >= 0 && int64_t(out.size()) == maxsplit) ? std::string::npos : s.find(sep, b);
      if (at == std::string::npos) break;
      out.push_back(Value::str(s.substr(b, at - b)));
      b = at + sep.size();
    }
    out.push_back(Value::str(s.substr(b)));
    return out;
  }
  size_t e = s.size();
  for (;;) {
    if ((maxsplit >= 0 && int64_t(out.size()) == maxsplit) || e < sep.size()) break;
    const size_t at = s.rfind(sep, e - sep.size());
    if (at == std::string::npos) break;
    out.push_back(Value::str(s.substr(at + sep.size(), e - at - sep.size())));
    e = at;
  }
  out.push_back(Value::str(s.substr(0, e)));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const std::vector<uint32_t> cps = code_points(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) uni::append_utf8(out, cps[k]);
      if (out.size() > kMaxBuiltString) raise("string too long");
    }
    return out;
  }
  size_t b = 0;
  int64_t done = 0;
  for (;;) {
    const size_t at = (count >= 0 && done >= count) ? std::string::npos : s.find(from, b);
    if (at == std::string::npos) break;
    out.append(s, b, at - b);
    out += to;
    if (out.size() > kMaxBuiltString) raise("string too long");
    b = at + from.size();
    ++done;
  }
  out.append(s, b, std::string::npos);
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const uint32_t cp : code_points(s)) {
    const uint32_t c = prev_cased ? to_lower(cp) : to_upper(cp);
    uni::append_utf8(out, c);
    prev_cased = is_cased_upper(c) || is_cased_lower(c);
  }
  return out;
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where /* -1 left, 0 center, 1 right */) {
  const int64_t len = cp_count(s);
  if (width <= len) return s;
  if (width > int64_t(kMaxBuiltString)) raise("width too large");
  const int64_t marg = width - len;
  int64_t left = where < 0 ? 0 : where > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

bool all_cps(const std::string& s, bool (*pred)(uint32_t)) {
  if (s.empty()) return false;
  for (const uint32_t cp : code_points(s))
    if (!pred(cp)) return false;
  return true;
}

}  // namespace

namespace {

Value str_method(const std::string& self, const std::string& name) {
  auto fn = [&](auto body) { return Value::function("str." + name, [self, body](CallArgs& a) -> Value { return body(self, a); }); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return fn([left, right](const std::string& s, CallArgs& a) {
      a.check(1, {"chars"});
      const Value& c = a.get(0, "chars", kMissing);
      if (!c.is_undefined() && !c.is_none() && !c.is_str()) raise("strip arg must be None or str");
      return Value::str(strip(s, c.is_str() ? &c.s : nullptr, left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return fn([right](const std::string& s, CallArgs& a) {
      a.check(2, {"sep", "maxsplit"});
      const Value& sep = a.get(0, "sep", kMissing);
      const Value& m = a.get(1, "maxsplit", kMissing);
      const int64_t maxsplit = m.is_integral() ? m.as_int() : -1;
      if (sep.is_undefined() || sep.is_none()) return Value::make_list(split_whitespace(s, maxsplit, right));
      if (!sep.is_str()) raise("must be str or None, not " + type_name(sep));
      return Value::make_list(split_sep(s, sep.s, maxsplit, right));
    });
  }
  if (name == "splitlines") {
    return fn([](const std::string& s, CallArgs& a) {
      const bool keep = truthy(a.get(0, "keepends", kMissing));
      const std::vector<uint32_t> cps = code_points(s);
      ValueList out;
      size_t b = 0;
      for (size_t k = 0; k < cps.size(); ++k) {
        if (!is_line_break(cps[k])) continue;
        size_t e = k + 1;
        if (cps[k] == '\r' && e < cps.size() && cps[e] == '\n') ++e;
        out.push_back(Value::str(from_code_points(cps, b, keep ? e : k)));
        b = e;
        k = e - 1;
      }
      if (b < cps.size()) out.push_back(Value::str(from_code_points(cps, b, cps.size())));
      return Value::make_list(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool ends = name == "endswith";
    return fn([ends](const std::string& s, CallArgs& a) {
      const Value& p = a.get(0, "prefix", kMissing);
      const auto [b, e] = byte_range(s, a, 1);
      const std::string_view view = std::string_view(s).substr(b, e - b);
      auto one = [&](const Value& x) {
        if (!x.is_str()) raise(std::string(ends ? "endswith" : "startswith") + " first arg must be str or a tuple of str");
        if (x.s.size() > view.size()) return false;
        return ends ? view.substr(view.size() - x.s.size()) == x.s : view.substr(0, x.s.size()) == x.s;
      };
      if (p.is_list() && p.tuple) {
        for (const auto& x : *p.list)
          if (one(x)) return Value::boolean(true);
        return Value::boolean(false);
      }
      return Value::boolean(one(p));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return fn([name](const std::string& s, CallArgs& a) {
      const std::string& sub = str_arg(a, 0, "sub");
      const auto [b, e] = byte_range(s, a, 1);
      const std::string view = s.substr(b, e - b);
      if (name == "count") {
        if (sub.empty()) return Value::integer(cp_count(view) + 1);
        int64_t n = 0;
        for (size_t at = view.find(sub); at != std::string::npos; at = view.find(sub, at + sub.size())) ++n;
        return Value::integer(n);
      }
      const size_t at = name[0] == 'r' ? view.rfind(sub) : view.find(sub);
      if (at == std::string::npos) {
        if (name == "index" || name == "rindex") raise("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_count(std::string_view(s).substr(0, b + at)));
    });
  }
  if (name == "replace") {
    return fn([](const std::string& s, CallArgs& a) {
      const Value& c = a.get(2, "count", kMissing);
      return Value::str(replace_all(s, str_arg(a, 0, "old"), str_arg(a, 1, "new"), c.is_integral() ? c.as_int() : -1));
    });
  }
  if (name == "upper") return fn([](const std::string& s, CallArgs&) { return Value::str(upper(s)); });
  if (name == "lower" || name == "casefold") return fn([](const std::string& s, CallArgs&) { return Value::str(lower(s)); });
  if (name == "title") return fn([](const std::string& s, CallArgs&) { return Value::str(py_title(s)); });
  if (name == "capitalize") {
    return fn([](const std::string& s, CallArgs&) {
      std::vector<uint32_t> cps = code_points(s);
      for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? to_upper(cps[k]) : to_lower(cps[k]);
      return Value::str(from_code_points(cps, 0, cps.size()));
    });
  }
  if (name == "swapcase") {
    return fn([](const std::string& s, CallArgs&) {
      std::string out;
      for (const uint32_t cp : code_points(s))
        uni::append_utf8(out, is_cased_upper(cp) ? to_lower(cp) : is_cased_lower(cp) ? to_upper(cp) : cp);
      return Value::str(std::move(out));
    });
  }
  if (name == "join") {
    return fn([](const std::string& s, CallArgs& a) {
      std::string out;
      const ValueList items = iterate(a.get(0, "iterable", kMissing));
      for (size_t k = 0; k < items.size(); ++k) {
        if (!items[k].is_str())
          raise("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(items[k]) + " found");
        if (k) out += s;
        out += items[k].s;
        if (out.size() > kMaxBuiltString) raise("string too long");
      }
      return Value::str(std::move(out));
    });
  }
  if (name == "format") return fn([](const std::string& s, CallArgs& a) { return brace_format(s, a); });
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int where = name == "center" ? 0 : name == "ljust" ? -1 : 1;
    return fn([where](const std::string& s, CallArgs& a) {
      const Value& w = a.get(0, "width", kMissing);
      if (!w.is_integral()) raise("width must be an integer");
      const Value& f = a.get(1, "fillchar", kMissing);
      return Value::str(pad(s, w.as_int(), f.is_str() ? f.s : " ", where));
    });
  }
  if (name == "zfill") {
    return fn([](const std::string& s, CallArgs& a) {
      const Value& w = a.get(0, "width", kMissing);
      if (!w.is_integral()) raise("width must be an integer");
      const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
      std::string padded = pad(sign ? s.substr(1) : s, w.as_int() - (sign ? 1 : 0), "0", 1);
      return Value::str(sign ? s.substr(0, 1) + padded : padded);
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool right = name == "rpartition";
    return fn([right](const std::string& s, CallArgs& a) {
      const std::string& sep = str_arg(a, 0, "sep");
      if (sep.empty()) raise("empty separator");
      const size_t at = right ? s.rfind(sep) : s.find(sep);
      if (at == std::string::npos)
        return Value::make_list(right ? ValueList{Value::str(""), Value::str(""), Value::str(s)}
                                      : ValueList{Value::str(s), Value::str(""), Value::str("")}, true);
      return Value::make_list({Value::str(s.substr(0, at)), Value::str(sep), Value::str(s.substr(at + sep.size()))}, true);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool suffix = name == "removesuffix";
    return fn([suffix](const std::string& s, CallArgs& a) {
      const std::string& x = str_arg(a, 0, suffix ? "suffix" : "prefix");
      if (x.size() <= s.size()) {
        if (!suffix && s.compare(0, x.size(), x) == 0) return Value::str(s.substr(x.size()));
        if (suffix && s.compare(s.size() - x.size(), x.size(), x) == 0) return Value::str(s.substr(0, s.size() - x.size()));
      }
      return Value::str(s);
    });
  }
  static const std::pair<const char*, bool (*)(uint32_t)> kPredicates[] = {
      {"isalpha", [](uint32_t cp) { return uni::in(cp, uni::kLetter); }},
      {"isdigit", [](uint32_t cp) { return uni::category(cp) == uni::Nd; }},
      {"isdecimal", [](uint32_t cp) { return uni::category(cp) == uni::Nd; }},
      {"isnumeric", [](uint32_t cp) { return uni::in(cp, uni::kNumber); }},
      {"isalnum", [](uint32_t cp) { return uni::in(cp, uni::kLetter | uni::kNumber); }},
      {"isspace", [](uint32_t cp) { return py_is_space(cp); }},
  };
  for (const auto& [pname, pred] : kPredicates)
    if (name == pname) {
      auto p = pred;
      return fn([p](const std::string& s, CallArgs&) { return Value::boolean(all_cps(s, p)); });
    }
  if (name == "islower" || name == "isupper") {
    const bool want_lower = name == "islower";
    return fn([want_lower](const std::string& s, CallArgs&) {
      bool cased = false;
      for (const uint32_t cp : code_points(s)) {
        if (is_cased_upper(cp)) {
          if (want_lower) return Value::boolean(false);
          cased = true;
        } else if (is_cased_lower(cp)) {
          if (!want_lower) return Value::boolean(false);
          cased = true;
        }
      }
      return Value::boolean(cased);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
}

Value dict_method(const Value& self, const std::string& name) {
  auto fn = [&](auto body) { return Value::function("dict." + name, [self, body](CallArgs& a) -> Value { return body(*self.dict, a); }); };
  if (name == "items") {
    return fn([](const DictObj& d, CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : d.items) out.push_back(Value::make_list({k, v}, true));
      return Value::make_list(std::move(out));
    });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return fn([keys](const DictObj& d, CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : d.items) out.push_back(keys ? k : v);
      return Value::make_list(std::move(out));
    });
  }
  if (name == "get") {
    return fn([](const DictObj& d, CallArgs& a) {
      const Value* v = d.find(a.get(0, "key", kMissing));
      if (v) return *v;
      const Value& def = a.get(1, "default", kMissing);
      return def.is_undefined() && !a.has(1, "default") ? Value::none() : def;
    });
  }
  if (name == "copy") {
    return fn([](const DictObj& d, CallArgs&) {
      Value out = Value::make_dict();
      out.dict->items = d.items;
      return out;
    });
  }
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
    return unsafe(self, name);
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "index" || name == "count") {
    const bool count = name == "count";
    return Value::function("list." + name, [self, count](CallArgs& a) -> Value {
      const Value& x = a.get(0, "value", kMissing);
      int64_t n = 0;
      for (size_t k = 0; k < self.list->size(); ++k)
        if (equals((*self.list)[k], x)) {
          if (!count) return Value::integer(int64_t(k));
          ++n;
        }
      if (!count) raise(repr(x) + " is not in list");
      return Value::integer(n);
    });
  }
  if (name == "copy" && !self.tuple)
    return Value::function("list.copy", [self](CallArgs&) -> Value { return Value::make_list(*self.list); });
  if (!self.tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
                      name == "reverse" || name == "sort" || name == "clear"))
    return unsafe(self, name);
  return Value::undefined();
}

// obj.name without the item fallback: methods and object attributes.
Value method(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Str: return str_method(obj.s, name);
    case Value::Dict: return dict_method(obj, name);
    case Value::List: return list_method(obj, name);
    case Value::Object: {
      const Value* v = obj.dict->find(std::string_view(name));
      return v ? *v : Value::undefined();
    }
    default: return Value::undefined();
  }
}

Value no_attribute(const Value& obj, const std::string& name) {
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined(cat({"'", type_name(obj), " object' has no attribute '", name, "'"}));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) raise(obj.s.empty() ? "value is undefined" : obj.s);
  Value m = method(obj, name);
  if (!m.is_undefined() || !m.s.empty()) return m;
  if (obj.is_dict())
    if (const Value* v = obj.dict->find(std::string_view(name))) return *v;
  return no_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Value::Undefined: raise(obj.s.empty() ? "value is undefined" : obj.s);
    case Value::Dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    case Value::List:
      if (key.is_integral()) {
        int64_t i = key.as_int();
        const int64_t n = int64_t(obj.list->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.list)[size_t(i)];
        return Value::undefined(std::string(obj.tuple ? "tuple" : "list") + " index out of range");
      }
      break;
    case Value::Str:
      if (key.is_integral()) {
        const std::vector<uint32_t> cps = code_points(obj.s);
        int64_t i = key.as_int();
        const int64_t n = int64_t(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::str(from_code_points(cps, size_t(i), size_t(i) + 1));
        return Value::undefined("string index out of range");
      }
      break;
    default: break;
  }
  if (key.is_str()) {
    Value m = method(obj, key.s);
    if (!m.is_undefined() || !m.s.empty()) return m;
    return no_attribute(obj, key.s);
  }
  return Value::undefined(cat({"'", type_name(obj), " object' has no attribute ", repr(key)}));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  if (!obj.is_str() && !obj.is_list()) return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
  for (const Value* v : {&start, &stop, &step_v})
    if (!v->is_none() && !v->is_integral()) return Value::undefined("slice indices must be integers or None");
  const int64_t step = step_v.is_none() ? 1 : step_v.as_int();
  if (step == 0) raise("slice step cannot be zero");
  std::vector<uint32_t> cps;
  if (obj.is_str()) cps = code_points(obj.s);
  const int64_t n = obj.is_str() ? int64_t(cps.size()) : int64_t(obj.list->size());
  auto adjust = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, step < 0 ? n - 1 : 0), e = adjust(stop, step < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) picks.push_back(size_t(i));
  if (obj.is_str()) {
    std::string out;
    for (const size_t i : picks) uni::append_utf8(out, cps[i]);
    return Value::str(std::move(out));
  }
  ValueList items;
  for (const size_t i : picks) items.push_back((*obj.list)[i]);
  return Value::make_list(std::move(items), obj.tuple);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Str:
      if (!item.is_str()) raise("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Value::List:
      for (const auto& x : *container.list)
        if (equals(x, item)) return true;
      return false;
    case Value::Dict: return container.dict->find(item) != nullptr;
    case Value::Undefined: return false;
    default: raise("argument of type '" + type_name(container) + "' is not iterable");
  }
}

namespace {

// dict(...) / namespace(...): one optional mapping or list of pairs, then keyword arguments.
void fill_mapping(DictObj& d, const CallArgs& a) {
  if (a.pos.size() > 1) raise(a.callee + "() expected at most 1 positional argument");
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.kind == Value::Dict || src.kind == Value::Object) {
      for (const auto& kv : src.dict->items) d.set(kv.first, kv.second);
    } else {
      for (const Value& pair : iterate(src)) {
        if (!pair.is_list() || pair.list->size() != 2) raise(a.callee + "() sequence elements must be pairs");
        d.set((*pair.list)[0], (*pair.list)[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value::str(k), v);
}

}  // namespace

std::vector<std::pair<std::string, Value>> make_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", [](CallArgs& a) -> Value {
                   if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) raise("range expected 1 to 3 arguments");
                   for (const auto& v : a.pos)
                     if (!v.is_integral()) raise("'" + type_name(v) + "' object cannot be interpreted as an integer");
                   const int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
                   const int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
                   const int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
                   if (step == 0) raise("range() arg 3 must not be zero");
                   const long double count = step > 0 ? ((long double)stop - start) / step : ((long double)start - stop) / -step;
                   if (count > kMaxRange)
                     raise("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(kMaxRange) + ").");
                   ValueList items;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::integer(i));
                   return Value::make_list(std::move(items));
                 }));
  g.emplace_back("dict", Value::function("dict", [](CallArgs& a) -> Value {
                   Value d = Value::make_dict();
                   fill_mapping(*d.dict, a);
                   return d;
                 }));
  g.emplace_back("namespace", Value::function("namespace", [](CallArgs& a) -> Value {
                   Value ns = Value::make_object("Namespace");
                   fill_mapping(*ns.dict, a);
                   return ns;
                 }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
                   raise(to_str(a.get(0, "message", kMissing)));
                 }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [](CallArgs& a) -> Value {
                   const Value& f = a.get(0, "format", kMissing);
                   if (!f.is_str()) raise("strftime_now() argument must be str, not " + type_name(f));
                   const std::time_t now = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   if (f.s.empty()) return Value::str("");
                   std::string buf(f.s.size() * 4 + 64, '\0');
                   const size_t n = std::strftime(buf.data(), buf.size(), f.s.c_str(), &tm);
                   buf.resize(n);
                   return Value::str(std::move(buf));
                 }));
  return g;
}

}  // namespace fp::jinja
