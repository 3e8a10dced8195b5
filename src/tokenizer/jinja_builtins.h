// tokenizer/jinja_builtins.h — what templates can call: attribute/item/slice access with jinja2's
// sandboxed lookup order, Python str/dict/list methods, filters, tests and global functions.
// Internal to tokenizer/jinja_*.cpp.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace fp::jinja {

// The value of an argument a call did not pass.
inline const Value kMissing = Value::undefined();

// obj.name: a method first (dict.items, str.strip, ...), then the item; Undefined when neither.
// Raises on an Undefined obj.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: the item first, then a method named key; Undefined when neither (or a bad key type).
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] (null parts as none) for str, list and tuple; Undefined otherwise.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python's `item in container`.
bool contains(const Value& container, const Value& item);

// Unknown filter or test names are errors when applied (jinja2 defers them to run time too
// when they sit inside an `if`).
bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
bool apply_test(std::string_view name, const Value& input, CallArgs& args);

// str.format(*args, **kwargs) and printf-style `fmt % args` (mapping: for "%(key)s").
Value brace_format(const std::string& fmt, const CallArgs& a);
Value percent_format(const std::string& fmt, const ValueList& args, const Value* mapping);

// range, dict, namespace, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> make_globals();

// Largest string or list any builtin may build (the renderer applies its own output limit too).
constexpr size_t kMaxBuiltString = size_t(32) << 20;
constexpr size_t kMaxListItems = size_t(1) << 20;
constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox MAX_RANGE

}  // namespace fp::jinja
