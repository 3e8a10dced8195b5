// tokenizer/jinja.h — a small Jinja2 interpreter for Hugging Face chat templates: the public API.
//
// It renders templates the way transformers does (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension; tojson as json.dumps with
// ensure_ascii=False; raise_exception and strftime_now as globals). What it covers:
//   {{ }} {% %} {# #} with '-' / '+' whitespace control, {% raw %};
//   for (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/cycle,
//        else, an inline `if` filter, tuple unpacking), if/elif/else, set (also ns.attr and block set),
//   macro, filter blocks, with, break/continue, {% generation %} (transformers' tracker tag, transparent);
//   Python-like values (none, bool, int, float, str, list, tuple, dict with insertion order),
//   attribute/subscript/slice access, arithmetic, ~, comparisons, and/or/not, in, tests, inline
//   if-else, calls, filters, str/dict methods, range/dict/namespace.
// Undefined behaves as jinja2's default Undefined: prints as "", is falsy and iterates empty;
// arithmetic, calls, attribute access and subscripts on it are errors.
// |safe and |escape give Markup strings: Markup + str escapes the str, as markupsafe does.
// Every error (syntax or runtime) is an fp::Error naming the template, line and column.
// Parsing bounds the nesting depth; rendering bounds the output size and the work done.
// Not covered (an error, or a difference noted here): recursive for loops, {% call %}, macro
// varargs/kwargs/caller, extends/include/import/block, {% do %}; range() and filters that return
// generators in jinja2 (map, select, unique, reverse) give lists, which print differently;
// integers are 64-bit (overflow is an error); upper/lower/title map Latin, Greek and Cyrillic
// letters only; Markup survives +, * and |escape but not other filters or str methods.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fp::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t(16) << 20;  // also the largest string any operation may build
  uint64_t max_steps = 20'000'000;              // statements + expressions evaluated
  int max_call_depth = 64;                      // nested macro calls
};

struct TemplateProgram;  // the parsed template (jinja_ast.h)

class Template {
 public:
  // Parses `source`; a syntax error throws fp::Error "NAME:LINE:COL: what".
  explicit Template(std::string_view source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `vars` (a JSON object; other JSON kinds are an error).
  // Globals available besides: range, dict, namespace, raise_exception, strftime_now.
  std::string render(const nlohmann::ordered_json& vars, const RenderLimits& limits = {}) const;

  const std::string& name() const;

 private:
  std::unique_ptr<TemplateProgram> program_;
};

}  // namespace fp::jinja
