// tokenizer/jinja_filters.cpp — jinja2's built-in filters (trim, tojson as transformers defines it,
// length, default, join, map/select/sort, indent, round, ...) and tests (defined, none, string,
// mapping, ...), with jinja2's argument names and Undefined handling.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/unicode.h"

namespace fp::jinja {
namespace {

using FilterFn = Value (*)(const Value& in, CallArgs& a);
using TestFn = bool (*)(const Value& in, CallArgs& a);

const Value& arg(const CallArgs& a, size_t i, std::string_view name) { return a.get(i, name, kMissing); }
// An optional argument: absent or none -> fallback.
bool given(const Value& v) { return !v.is_undefined() && !v.is_none(); }

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t def) {
  const Value& v = arg(a, i, name);
  if (!given(v)) return def;
  if (!v.is_integral()) raise(a.callee + "(): '" + std::string(name) + "' must be an integer, not " + type_name(v));
  return v.as_int();
}

std::string soft_str(const Value& v) { return to_str(v); }

// jinja2's make_attrgetter: "a.b.0" looks up items (then attributes) part by part.
Value lookup_path(const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return get_item(item, attribute);
  Value v = item;
  const std::string path = to_str(attribute);
  size_t b = 0;
  for (;;) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const bool num = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, num ? Value::integer(std::atoll(part.c_str())) : Value::str(part));
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  Value k = given(attribute) ? lookup_path(item, attribute) : item;
  if (!case_sensitive && k.is_str()) k = Value::str(lower(k.s));
  return k;
}

bool parse_py_int(std::string s, int base, int64_t* out) {
  s = strip(s, nullptr, true, true);
  std::string digits;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_' && k > 0 && k + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[k - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[k + 1])))
      continue;
    digits += s[k];
  }
  if (digits.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno || *end || end == digits.c_str()) return false;
  *out = v;
  return true;
}

bool parse_py_float(std::string s, double* out) {
  s = strip(s, nullptr, true, true);
  const std::string l = lower(s);
  const std::string body = (!l.empty() && (l[0] == '+' || l[0] == '-')) ? l.substr(1) : l;
  const double sign = (!l.empty() && l[0] == '-') ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") return *out = sign * HUGE_VAL, true;
  if (body == "nan") return *out = NAN, true;
  std::string clean;
  for (const char c : s) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' ||
          c == '_'))
      return false;
    if (c != '_') clean += c;
  }
  if (clean.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return *end == 0;
}

Value f_trim(const Value& in, CallArgs& a) {
  a.check(1, {"chars"});
  const Value& c = arg(a, 0, "chars");
  return Value::str(strip(soft_str(in), c.is_str() ? &c.s : nullptr, true, true));
}

Value f_tojson(const Value& in, CallArgs& a) {
  a.check(4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  st.ensure_ascii = truthy(arg(a, 0, "ensure_ascii"));
  const Value& indent = arg(a, 1, "indent");
  if (indent.is_str()) {
    st.indent_is_str = true;
    st.indent_str = indent.s;
  } else if (given(indent)) {
    if (!indent.is_integral()) raise("tojson: indent must be an integer or a string");
    st.indent = int(std::clamp<int64_t>(indent.as_int(), 0, 64));
  }
  if (st.indent >= 0 || st.indent_is_str) st.item_sep = ",";
  const Value& seps = arg(a, 2, "separators");
  if (given(seps)) {
    if (!seps.is_list() || seps.list->size() != 2 || !(*seps.list)[0].is_str() || !(*seps.list)[1].is_str())
      raise("tojson: separators must be a pair of strings");
    st.item_sep = (*seps.list)[0].s;
    st.key_sep = (*seps.list)[1].s;
  }
  st.sort_keys = truthy(arg(a, 3, "sort_keys"));
  return Value::str(to_json_text(in, st));
}

Value f_length(const Value& in, CallArgs& a) {
  a.check(0, {});
  return Value::integer(length(in));
}

Value f_default(const Value& in, CallArgs& a) {
  a.check(2, {"default_value", "boolean"});
  const bool boolean = truthy(arg(a, 1, "boolean"));
  if (in.is_undefined() || (boolean && !truthy(in))) return a.has(0, "default_value") ? arg(a, 0, "default_value") : Value::str("");
  return in;
}

Value f_join(const Value& in, CallArgs& a) {
  a.check(2, {"d", "attribute"});
  const std::string sep = a.has(0, "d") ? soft_str(arg(a, 0, "d")) : "";
  const Value& attribute = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(in)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(given(attribute) ? lookup_path(item, attribute) : item);
    if (out.size() > kMaxBuiltString) raise("string too long");
  }
  return Value::str(std::move(out));
}

Value f_upper(const Value& in, CallArgs&) { return Value::str(upper(soft_str(in))); }
Value f_lower(const Value& in, CallArgs&) { return Value::str(lower(soft_str(in))); }

Value f_capitalize(const Value& in, CallArgs&) {
  std::vector<uint32_t> cps = code_points(soft_str(in));
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? to_upper(cps[k]) : to_lower(cps[k]);
  return Value::str(from_code_points(cps, 0, cps.size()));
}

Value f_title(const Value& in, CallArgs&) {
  // Words start after '-', whitespace, '(', '{', '[' or '<'; first letter upper, the rest lower.
  std::string out;
  bool word_start = true;
  for (const uint32_t cp : code_points(soft_str(in))) {
    const bool sep = cp == '-' || py_is_space(cp) || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    uni::append_utf8(out, sep ? cp : word_start ? to_upper(cp) : to_lower(cp));
    word_start = sep;
  }
  return Value::str(std::move(out));
}

Value f_replace(const Value& in, CallArgs& a) {
  a.check(3, {"old", "new", "count"});
  const Value& count = arg(a, 2, "count");
  CallArgs b;
  b.callee = "replace";
  b.pos = {Value::str(soft_str(arg(a, 0, "old"))), Value::str(soft_str(arg(a, 1, "new")))};
  if (given(count)) b.pos.push_back(count);
  Value m = get_attr(Value::str(soft_str(in)), "replace");
  return m.fn->call(b);
}

Value f_first(const Value& in, CallArgs&) {
  ValueList items = iterate(in);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& in, CallArgs&) {
  ValueList items = iterate(in);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_list(const Value& in, CallArgs&) { return Value::make_list(iterate(in)); }
Value f_string(const Value& in, CallArgs&) { return Value::str(soft_str(in)); }
Value f_safe(const Value& in, CallArgs&) { return Value::markup_str(soft_str(in)); }
Value f_escape(const Value& in, CallArgs&) { return in.markup ? in : Value::markup_str(html_escape(soft_str(in))); }
Value f_forceescape(const Value& in, CallArgs&) { return Value::markup_str(html_escape(soft_str(in))); }

Value f_int(const Value& in, CallArgs& a) {
  a.check(2, {"default", "base"});
  const Value def = a.has(0, "default") ? arg(a, 0, "default") : Value::integer(0);
  const int64_t base = int_arg(a, 1, "base", 10);
  if (in.is_undefined()) raise(in.s.empty() ? "value is undefined" : in.s);
  if (in.is_integral()) return Value::integer(in.as_int());
  if (in.kind == Value::Float) {
    if (!std::isfinite(in.f) || std::fabs(in.f) >= 9.2e18) raise("cannot convert float to a 64-bit integer");
    return Value::integer(int64_t(std::trunc(in.f)));
  }
  if (in.is_str()) {
    int64_t v = 0;
    if (parse_py_int(in.s, int(base), &v)) return Value::integer(v);
    double d = 0;
    if (parse_py_float(in.s, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(std::trunc(d)));
  }
  return def;
}

Value f_float(const Value& in, CallArgs& a) {
  a.check(1, {"default"});
  const Value def = a.has(0, "default") ? arg(a, 0, "default") : Value::number(0.0);
  if (in.is_undefined()) raise(in.s.empty() ? "value is undefined" : in.s);
  if (in.is_number()) return Value::number(in.as_double());
  double d = 0;
  if (in.is_str() && parse_py_float(in.s, &d)) return Value::number(d);
  return def;
}

Value f_abs(const Value& in, CallArgs&) {
  if (in.kind == Value::Float) return Value::number(std::fabs(in.f));
  if (in.is_integral()) {
    if (in.as_int() == INT64_MIN) raise("integer overflow (beyond 64 bits)");
    return Value::integer(std::llabs(in.as_int()));
  }
  raise("bad operand type for abs(): '" + type_name(in) + "'");
}

Value f_round(const Value& in, CallArgs& a) {
  a.check(2, {"precision", "method"});
  const int64_t precision = int_arg(a, 0, "precision", 0);
  const Value& m = arg(a, 1, "method");
  const std::string method = m.is_str() ? m.s : "common";
  if (method != "common" && method != "ceil" && method != "floor") raise("method must be common, ceil or floor");
  if (!in.is_number()) raise("type " + type_name(in) + " doesn't define __round__ method");
  if (precision < -300 || precision > 300) raise("round: precision out of range");
  const double x = in.as_double();
  if (method != "common") {
    const double scale = std::pow(10.0, double(precision));
    return Value::number((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (in.is_integral()) return Value::integer(in.as_int());
  if (!std::isfinite(x)) return in;
  if (precision >= 0) {  // printf rounds the exact binary value half-to-even, as Python's round()
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(std::min<int64_t>(precision, 300)), x);
    return Value::number(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, double(-precision));
  return Value::number(std::nearbyint(x / scale) * scale);
}

Value f_items(const Value& in, CallArgs&) {
  if (in.is_undefined()) return Value::make_list();
  if (!in.is_dict()) raise("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, v] : in.dict->items) out.push_back(Value::make_list({k, v}, true));
  return Value::make_list(std::move(out));
}

Value f_reverse(const Value& in, CallArgs&) {
  if (in.is_str()) {
    std::vector<uint32_t> cps = code_points(in.s);
    std::reverse(cps.begin(), cps.end());
    return Value::str(from_code_points(cps, 0, cps.size()));
  }
  ValueList items = iterate(in);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}

Value f_indent(const Value& in, CallArgs& a) {
  a.check(3, {"width", "first", "blank"});
  const Value& w = arg(a, 0, "width");
  std::string ind = w.is_str() ? w.s : std::string(size_t(std::clamp<int64_t>(given(w) ? w.as_int() : 4, 0, 1024)), ' ');
  const bool first = truthy(arg(a, 1, "first")), blank = truthy(arg(a, 2, "blank"));
  CallArgs none;
  none.callee = "splitlines";
  Value lines_v = get_attr(Value::str(soft_str(in) + "\n"), "splitlines").fn->call(none);
  const ValueList& lines = *lines_v.list;
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    if (k && (blank || !lines[k].s.empty())) out += ind;
    out += lines[k].s;
    if (out.size() > kMaxBuiltString) raise("string too long");
  }
  if (first) out = ind + out;
  return Value::str(std::move(out));
}

Value f_center(const Value& in, CallArgs& a) {
  CallArgs b;
  b.callee = "center";
  b.pos.push_back(Value::integer(int_arg(a, 0, "width", 80)));
  return get_attr(Value::str(soft_str(in)), "center").fn->call(b);
}

Value f_wordcount(const Value& in, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (const uint32_t cp : code_points(soft_str(in))) {
    const bool w = cp == '_' || uni::in(cp, uni::kLetter | uni::kNumber);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_format(const Value& in, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) raise("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Value d = Value::make_dict();
    for (const auto& [k, v] : a.kw) d.dict->set(Value::str(k), v);
    return percent_format(soft_str(in), {d}, &d);
  }
  return percent_format(soft_str(in), a.pos, nullptr);
}

Value f_attr(const Value& in, CallArgs& a) {
  const Value& name = arg(a, 0, "name");
  if (!name.is_str()) raise("attr: name must be a string");
  if (in.is_undefined()) raise(in.s.empty() ? "value is undefined" : in.s);
  if (in.kind == Value::Object) return get_attr(in, name.s);
  if (in.is_dict() || in.is_str() || in.is_list()) {
    Value m = get_attr(in, name.s);
    if (m.kind == Value::Func) return m;
  }
  return Value::undefined("'" + type_name(in) + " object' has no attribute '" + name.s + "'");
}

Value f_batch(const Value& in, CallArgs& a) {
  const int64_t n = int_arg(a, 0, "linecount", 1);
  if (n <= 0) raise("batch: linecount must be positive");
  const Value& fill = arg(a, 1, "fill_with");
  ValueList out, cur;
  for (const Value& item : iterate(in)) {
    if (int64_t(cur.size()) == n) out.push_back(Value::make_list(std::exchange(cur, {})));
    cur.push_back(item);
  }
  if (!cur.empty()) {
    if (given(fill))
      while (int64_t(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value::make_list(std::move(cur)));
  }
  return Value::make_list(std::move(out));
}

Value f_map(const Value& in, CallArgs& a) {
  ValueList out;
  if (!truthy(in)) return Value::make_list();  // jinja2: `if value:` before iterating
  if (a.pos.empty()) {
    const Value* attribute = nullptr;
    Value def = Value::none();
    for (const auto& [k, v] : a.kw) {
      if (k == "attribute") attribute = &v;
      else if (k == "default") def = v;
      else raise("map: unexpected keyword argument '" + k + "'");
    }
    if (!attribute) raise("map requires a filter argument");
    for (const Value& item : iterate(in)) {
      Value v = lookup_path(item, *attribute);
      out.push_back(v.is_undefined() && !def.is_none() ? def : v);
    }
    return Value::make_list(std::move(out));
  }
  if (!a.pos[0].is_str()) raise("map: the filter name must be a string");
  const std::string name = a.pos[0].s;
  for (const Value& item : iterate(in)) {
    CallArgs b;
    b.callee = name;
    b.pos.assign(a.pos.begin() + 1, a.pos.end());
    b.kw = a.kw;
    out.push_back(apply_filter(name, item, b));
  }
  return Value::make_list(std::move(out));
}

Value select_impl(const Value& in, CallArgs& a, bool by_attr, bool keep) {
  if (!truthy(in)) return Value::make_list();  // jinja2: `if value:` before iterating
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) raise("missing parameter for attribute name");
    attribute = a.pos[k++];
  }
  std::string test;
  if (k < a.pos.size()) {
    if (!a.pos[k].is_str()) raise("select: the test name must be a string");
    test = a.pos[k++].s;
  }
  ValueList out;
  for (const Value& item : iterate(in)) {
    const Value v = by_attr ? lookup_path(item, attribute) : item;
    bool ok;
    if (test.empty()) {
      ok = truthy(v);
    } else {
      CallArgs b;
      b.callee = test;
      b.pos.assign(a.pos.begin() + long(k), a.pos.end());
      b.kw = a.kw;
      ok = apply_test(test, v, b);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value f_select(const Value& in, CallArgs& a) { return select_impl(in, a, false, true); }
Value f_reject(const Value& in, CallArgs& a) { return select_impl(in, a, false, false); }
Value f_selectattr(const Value& in, CallArgs& a) { return select_impl(in, a, true, true); }
Value f_rejectattr(const Value& in, CallArgs& a) { return select_impl(in, a, true, false); }

Value f_sort(const Value& in, CallArgs& a) {
  a.check(3, {"reverse", "case_sensitive", "attribute"});
  const bool rev = truthy(arg(a, 0, "reverse")), cs = truthy(arg(a, 1, "case_sensitive"));
  const Value& attribute = arg(a, 2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(in)) keyed.emplace_back(sort_key(item, attribute, cs), item);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [rev](const auto& x, const auto& y) { return rev ? less(y.first, x.first) : less(x.first, y.first); });
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

Value f_dictsort(const Value& in, CallArgs& a) {
  a.check(3, {"case_sensitive", "by", "reverse"});
  if (!in.is_dict()) raise("dictsort: value must be a mapping");
  const bool cs = truthy(arg(a, 0, "case_sensitive")), rev = truthy(arg(a, 2, "reverse"));
  const Value& by = arg(a, 1, "by");
  const size_t pos = by.is_str() && by.s == "value" ? 1 : 0;
  if (by.is_str() && by.s != "key" && by.s != "value") raise("You can only sort by either \"key\" or \"value\"");
  ValueList items = *f_items(in, a).list;
  auto key = [&](const Value& item) {
    Value k = (*item.list)[pos];
    if (!cs && k.is_str()) k = Value::str(lower(k.s));
    return k;
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return rev ? less(key(y), key(x)) : less(key(x), key(y)); });
  return Value::make_list(std::move(items));
}

Value f_unique(const Value& in, CallArgs& a) {
  a.check(2, {"case_sensitive", "attribute"});
  const bool cs = truthy(arg(a, 0, "case_sensitive"));
  const Value& attribute = arg(a, 1, "attribute");
  ValueList out, seen;
  for (const Value& item : iterate(in)) {
    Value k = sort_key(item, attribute, cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
      seen.push_back(std::move(k));
      out.push_back(item);
    }
  }
  return Value::make_list(std::move(out));
}

Value min_max(const Value& in, CallArgs& a, bool want_max) {
  a.check(2, {"case_sensitive", "attribute"});
  const bool cs = truthy(arg(a, 0, "case_sensitive"));
  const Value& attribute = arg(a, 1, "attribute");
  ValueList items = iterate(in);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, cs);
  for (size_t k = 1; k < items.size(); ++k) {
    Value key = sort_key(items[k], attribute, cs);
    if (want_max ? less(best_key, key) : less(key, best_key)) {
      best = k;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value f_min(const Value& in, CallArgs& a) { return min_max(in, a, false); }
Value f_max(const Value& in, CallArgs& a) { return min_max(in, a, true); }

Value f_sum(const Value& in, CallArgs& a) {
  a.check(2, {"attribute", "start"});
  const Value& attribute = arg(a, 0, "attribute");
  Value total = a.has(1, "start") ? arg(a, 1, "start") : Value::integer(0);
  for (const Value& item : iterate(in)) {
    const Value v = given(attribute) ? lookup_path(item, attribute) : item;
    if (!v.is_number() || !total.is_number())
      raise("unsupported operand type(s) for +: '" + type_name(total) + "' and '" + type_name(v) + "'");
    if (v.is_integral() && total.is_integral()) {
      int64_t r = 0;
      if (__builtin_add_overflow(total.as_int(), v.as_int(), &r)) raise("integer overflow (beyond 64 bits)");
      total = Value::integer(r);
    } else {
      total = Value::number(total.as_double() + v.as_double());
    }
  }
  return total;
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format},
      {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
      {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
      {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests ----

bool t_defined(const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(const Value& v, CallArgs&) { return v.kind == Value::Bool; }
bool t_true(const Value& v, CallArgs&) { return v.kind == Value::Bool && v.b; }
bool t_false(const Value& v, CallArgs&) { return v.kind == Value::Bool && !v.b; }
bool t_integer(const Value& v, CallArgs&) { return v.kind == Value::Int; }
bool t_float(const Value& v, CallArgs&) { return v.kind == Value::Float; }
bool t_number(const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(const Value& v, CallArgs&) { return v.is_str(); }
bool t_mapping(const Value& v, CallArgs&) { return v.is_dict(); }
bool t_sequence(const Value& v, CallArgs&) { return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined(); }
bool t_iterable(const Value& v, CallArgs&) { return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined(); }
bool t_callable(const Value& v, CallArgs&) { return v.kind == Value::Func || v.is_undefined(); }
bool t_escaped(const Value& v, CallArgs&) { return v.markup; }

int64_t int_of(const Value& v, const char* test) {
  if (!v.is_integral()) raise(std::string("test '") + test + "' needs an integer, got " + type_name(v));
  return v.as_int();
}
bool t_odd(const Value& v, CallArgs&) { return (int_of(v, "odd") % 2) != 0; }
bool t_even(const Value& v, CallArgs&) { return (int_of(v, "even") % 2) == 0; }
bool t_divisibleby(const Value& v, CallArgs& a) {
  const int64_t d = int_of(arg(a, 0, "num"), "divisibleby");
  if (d == 0) raise("integer division or modulo by zero");
  return int_of(v, "divisibleby") % d == 0;
}
bool t_lower(const Value& v, CallArgs&) {
  CallArgs none;
  return truthy(get_attr(Value::str(to_str(v)), "islower").fn->call(none));
}
bool t_upper(const Value& v, CallArgs&) {
  CallArgs none;
  return truthy(get_attr(Value::str(to_str(v)), "isupper").fn->call(none));
}
bool t_sameas(const Value& v, CallArgs& a) {
  const Value& o = arg(a, 0, "other");
  if (v.kind != o.kind) return false;
  if (v.kind == Value::List) return v.list == o.list;
  if (v.kind == Value::Dict || v.kind == Value::Object) return v.dict == o.dict;
  return equals(v, o);
}
bool t_in(const Value& v, CallArgs& a) { return contains(arg(a, 0, "seq"), v); }
bool t_eq(const Value& v, CallArgs& a) { return equals(v, arg(a, 0, "other")); }
bool t_ne(const Value& v, CallArgs& a) { return !equals(v, arg(a, 0, "other")); }
bool t_lt(const Value& v, CallArgs& a) { return less(v, arg(a, 0, "other")); }
bool t_gt(const Value& v, CallArgs& a) { return less(arg(a, 0, "other"), v); }
bool t_le(const Value& v, CallArgs& a) { return less(v, arg(a, 0, "other")) || equals(v, arg(a, 0, "other")); }
bool t_ge(const Value& v, CallArgs& a) { return less(arg(a, 0, "other"), v) || equals(v, arg(a, 0, "other")); }
bool t_filter(const Value& v, CallArgs&) { return v.is_str() && has_filter(v.s); }
bool t_test(const Value& v, CallArgs&) { return v.is_str() && has_test(v.s); }

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"sequence", t_sequence}, {"iterable", t_iterable},
      {"callable", t_callable}, {"escaped", t_escaped}, {"odd", t_odd}, {"even", t_even},
      {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper}, {"sameas", t_sameas}, {"in", t_in},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt},
      {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge},
      {">=", t_ge}, {"filter", t_filter}, {"test", t_test},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }
bool has_test(std::string_view name) { return tests().count(name) != 0; }

Value apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) raise("no filter named '" + std::string(name) + "'");
  return it->second(input, args);
}

bool apply_test(std::string_view name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) raise("no test named '" + std::string(name) + "'");
  return it->second(input, args);
}

}  // namespace fp::jinja
