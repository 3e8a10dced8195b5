// tokenizer/jinja_value.h — the interpreter's value type (Python-like: none, bool, int, float,
// str, list/tuple, dict in insertion order, namespace/object, callable, Undefined) and the
// Python semantics the templates rely on: str(), repr(), truth, ==, <, json.dumps, str methods'
// Unicode helpers. Internal to tokenizer/jinja_*.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp::jinja {

struct Value;
struct DictObj;
struct Callable;
using ValueList = std::vector<Value>;

struct Value {
  enum Kind : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Object, Func };
  Kind kind = Undefined;
  bool tuple = false;   // List: printed as (a, b)
  bool markup = false;  // Str: markupsafe.Markup (from |safe or |escape): `+` escapes the other side
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str: the text (UTF-8); Undefined: why it is undefined, for error messages
  std::shared_ptr<ValueList> list;
  std::shared_ptr<DictObj> dict;  // Dict, Object (namespace, loop)
  std::shared_ptr<Callable> fn;

  static Value undefined(std::string why = {}) { Value v; v.s = std::move(why); return v; }
  static Value none() { Value v; v.kind = None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Float; v.f = x; return v; }
  static Value str(std::string x) { Value v; v.kind = Str; v.s = std::move(x); return v; }
  static Value markup_str(std::string x) { Value v = str(std::move(x)); v.markup = true; return v; }
  static Value make_list(ValueList items = {}, bool is_tuple = false);
  static Value make_dict();
  // An attribute bag: "Namespace" (assignable with {% set ns.x %}) or "LoopContext".
  static Value make_object(std::string type_name);
  static Value function(std::string name, std::function<Value(struct CallArgs&)> f);

  bool is_undefined() const { return kind == Undefined; }
  bool is_none() const { return kind == None; }
  bool is_str() const { return kind == Str; }
  bool is_list() const { return kind == List; }
  bool is_dict() const { return kind == Dict; }
  bool is_number() const { return kind == Bool || kind == Int || kind == Float; }
  bool is_integral() const { return kind == Bool || kind == Int; }
  int64_t as_int() const { return kind == Bool ? int64_t(b) : i; }
  double as_double() const { return kind == Float ? f : double(as_int()); }
};

struct DictObj {
  std::string type_name;  // Object only
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value v);
};

// Arguments of a call: positional, then keyword, as written.
struct CallArgs {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::string callee;  // for messages
  // The argument at position `index` or named `name`; Undefined-kind `missing` when neither.
  const Value& get(size_t index, std::string_view name, const Value& missing) const;
  bool has(size_t index, std::string_view name) const;
  // Rejects more positionals than `max_pos` or a keyword not in `names`.
  void check(size_t max_pos, std::initializer_list<std::string_view> names) const;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// The error type raised inside evaluation; the evaluator adds the template position.
struct JinjaError {
  std::string message;
};
[[noreturn]] void raise(std::string message);
// Concatenation without `"lit" + std::string` chains (GCC 12 reports false -Wrestrict on them).
std::string cat(std::initializer_list<std::string_view> parts);

// Conversions and Python semantics.
Value from_json(const nlohmann::ordered_json& j);
std::string type_name(const Value& v);  // Python's: 'int', 'str', 'NoneType', 'list', 'dict', ...
bool truthy(const Value& v);
std::string to_str(const Value& v);   // str(v); Undefined -> ""
std::string repr(const Value& v);     // repr(v)
std::string py_float_repr(double d);  // repr(float)
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);  // raises when the types cannot be ordered
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys). indent < 0: None.
struct JsonStyle {
  int indent = -1;
  std::string indent_str;  // used instead of spaces when indent is given as a string
  bool indent_is_str = false;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
};
std::string to_json_text(const Value& v, const JsonStyle& style);
// Length as Python's len(): code points for str, items for list/dict; raises otherwise.
int64_t length(const Value& v);
// The items a for loop visits: list items, dict keys, str characters; Undefined -> empty.
ValueList iterate(const Value& v);

// markupsafe.escape: & < > " ' as entities.
std::string html_escape(const std::string& s);

// UTF-8 helpers with Python's notion of characters and whitespace.
bool py_is_space(uint32_t cp);
std::vector<uint32_t> code_points(std::string_view s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool is_cased_upper(uint32_t cp);
bool is_cased_lower(uint32_t cp);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
// strip/lstrip/rstrip: `chars` null = whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace fp::jinja
