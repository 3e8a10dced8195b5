// engine/json_schema.cpp — the schema-to-GBNF compiler: one rule per schema node, named after
// its path (root-address-city), over shared rules for JSON's primitives.
#include "engine/json_schema.h"

#include "engine/grammar.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/error.h"
#include "engine/number_range_grammar.h"
#include "engine/regex_grammar.h"

namespace fp {

namespace {

using ojson = nlohmann::ordered_json;

// JSON's primitives. Whitespace between tokens is bounded (one space, or a newline and up to 20
// blanks) so that a model cannot spend its tokens on blanks; numbers have at most 16 digits per part.
const char* const kPrimitives = R"(ws ::= | " " | "\n" [ \t]{0,20}
char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
)";


class SchemaCompiler {
 public:
  explicit SchemaCompiler(const ojson& root) : root_(root) {}

  std::string compile() {
    const std::string r = visit(root_, "root", "#");
    std::string out = kPrimitives;
    if (r != "root") out += "root ::= " + r + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  const ojson& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> used_ = {"ws", "char", "string", "integer", "number", "boolean", "null", "value", "object", "array"};
  std::map<std::string, std::string> refs_;  // $ref -> its rule

  std::map<std::string, int> next_suffix_;  // base name -> the next number to try after it
  int depth_ = 0;                            // schema nesting: visit() recurses per level
  static constexpr int kMaxDepth = 128;

  // A rule name from a path-like hint, cut to 64 characters (a deep schema would otherwise make
  // names as long as its depth, and the grammar's size its square), numbered when taken.
  std::string fresh_name(const std::string& hint) {
    std::string base;
    for (char c : hint.substr(0, 64)) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    std::string name = base;
    for (int& i = next_suffix_.try_emplace(base, 2).first->second; used_.count(name); ++i) name = base + "-" + std::to_string(i);
    used_.insert(name);
    return name;
  }
  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string name = fresh_name(hint);
    rules_.push_back({name, body});
    return name;
  }

  static const std::set<std::string>& ignored() {
    static const std::set<std::string> s = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict"};
    return s;
  }
  static const std::set<std::string>& supported() {
    static const std::set<std::string> s = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                            "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "oneOf",
                                            "allOf", "$ref", "pattern", "format", "minimum", "maximum",
                                            "exclusiveMinimum", "exclusiveMaximum"};
    return s;
  }

  // `true`, the schema that takes anything (a reference, so that `cond ? s[k] : any_schema()`
  // does not copy s[k]: a copy per level made deep schemas quadratic).
  static const ojson& any_schema() {
    static const ojson any = true;
    return any;
  }

  // A const or enum value is written out by nlohmann's dump(), which recurses per level.
  static void check_value_depth(const ojson& v, const char* key, const std::string& path) {
    std::vector<std::pair<const ojson*, int>> todo = {{&v, 0}};
    while (!todo.empty()) {
      const auto [x, d] = todo.back();
      todo.pop_back();
      FP_CHECK(d <= kMaxDepth, "json_schema: the '", key, "' value at ", path, " is nested deeper than ", kMaxDepth, " levels");
      if (x->is_structured())
        for (const auto& child : *x) todo.push_back({&child, d + 1});
    }
  }

  static size_t count(const ojson& s, const char* key, const std::string& path) {
    const ojson& v = s[key];
    FP_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), "json_schema: '", key, "' at ", path,
             " must be a non-negative integer, not ", v.dump());
    const uint64_t n = v.get<uint64_t>();
    FP_CHECK(n <= 10000, "json_schema: '", key, "' at ", path, " is ", n, " (at most 10000 is supported)");
    return static_cast<size_t>(n);
  }

  // `x` repeated lo..hi times (hi < 0: no bound), as a GBNF suffix.
  static std::string repeat(const std::string& x, size_t lo, int64_t hi) {
    if (hi < 0) return "(" + x + "){" + std::to_string(lo) + ",}";
    return "(" + x + "){" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  std::string visit(const ojson& s, const std::string& name, const std::string& path) {
    FP_CHECK(depth_ < kMaxDepth, "json_schema: nested deeper than ", kMaxDepth, " levels at ", path.substr(0, 200), "...");
    ++depth_;
    std::string rule = visit_node(s, name.substr(0, 64), path);
    --depth_;
    return rule;
  }

  std::string visit_node(const ojson& s, const std::string& name, const std::string& path) {
    if (s.is_boolean()) {
      FP_CHECK(s.get<bool>(), "json_schema: the schema at ", path, " is false (it accepts nothing)");
      return "value";
    }
    FP_CHECK(s.is_object(), "json_schema: the schema at ", path, " must be an object or a boolean, not ", s.dump());
    for (const auto& [k, v] : s.items()) {
      (void)v;
      FP_CHECK(supported().count(k) || ignored().count(k), "json_schema: keyword '", k, "' at ", path,
               " is not supported (supported: type, properties, required, additionalProperties, items, minItems, maxItems, "
               "minLength, maxLength, pattern, format, minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum, const, "
               "anyOf, oneOf, allOf, $ref)");
    }
    if (s.contains("$ref")) return reference(s["$ref"], path);
    for (const char* key : {"const", "enum"})
      if (s.contains(key)) check_value_depth(s[key], key, path);
    if (s.contains("const")) return add_rule(name, gbnf_literal(s["const"].dump()));
    if (s.contains("enum")) {
      const ojson& e = s["enum"];
      FP_CHECK(e.is_array() && !e.empty(), "json_schema: 'enum' at ", path, " must be a non-empty array");
      std::string body;
      for (const auto& v : e) body += (body.empty() ? "" : " | ") + gbnf_literal(v.dump());
      return add_rule(name, body);
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) {
        const ojson& alts = s[key];
        FP_CHECK(alts.is_array() && !alts.empty(), "json_schema: '", key, "' at ", path, " must be a non-empty array");
        std::string body;
        for (size_t i = 0; i < alts.size(); ++i)
          body += (i ? " | " : "") + visit(alts[i], name + "-" + std::to_string(i), path + "/" + key + "/" + std::to_string(i));
        return add_rule(name, body);
      }
    if (s.contains("allOf")) {
      const ojson& all = s["allOf"];
      FP_CHECK(all.is_array() && all.size() == 1, "json_schema: 'allOf' at ", path,
               " is supported with one schema only (merging schemas is not)");
      return visit(all[0], name, path + "/allOf/0");
    }
    if (!s.contains("type")) {
      for (const char* key : {"pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                              "exclusiveMaximum"})
        FP_CHECK(!s.contains(key), "json_schema: '", key, "' at ", path,
                 " needs a 'type' (string, number or integer) beside it: without one it would let any other type through");
      if (s.contains("properties")) return object(s, name, path);
      if (s.contains("items")) return array(s, name, path);
      return "value";
    }
    const ojson& t = s["type"];
    if (t.is_array()) {
      FP_CHECK(!t.empty(), "json_schema: 'type' at ", path, " is an empty list");
      // Each type once, on the same node: a copy per type with repeats made a schema nested
      // n deep with "type": ["object", "object"] take 2^n work.
      std::set<std::string> seen;
      std::string body;
      for (const auto& one : t) {
        FP_CHECK(one.is_string(), "json_schema: 'type' at ", path, " must list strings, not ", one.dump());
        const std::string type = one.get<std::string>();
        if (!seen.insert(type).second) continue;
        body += (body.empty() ? "" : " | ") + typed(s, type, name + "-" + type, path);
      }
      return add_rule(name, body);
    }
    FP_CHECK(t.is_string(), "json_schema: 'type' at ", path, " must be a string or a list of strings, not ", t.dump());
    return typed(s, t.get<std::string>(), name, path);
  }

  // The node read as one of its types.
  std::string typed(const ojson& s, const std::string& type, const std::string& name, const std::string& path) {
    if (type == "object") return object(s, name, path);
    if (type == "array") return array(s, name, path);
    if (type == "string") return string(s, name, path);
    if (type == "integer" || type == "number") return number(s, name, path, type == "integer");
    if (type == "boolean" || type == "null") return type;
    fail("json_schema: unknown type '", type, "' at ", path);
  }

  std::string string(const ojson& s, const std::string& name, const std::string& path) {
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern") || s.contains("format")) {
      FP_CHECK(!(s.contains("pattern") && s.contains("format")), "json_schema: 'pattern' beside 'format' at ", path,
               " is not supported (one of them per string)");
      FP_CHECK(!lengths, "json_schema: minLength/maxLength beside '", s.contains("pattern") ? "pattern" : "format", "' at ", path,
               " is not supported (write the length into the pattern, e.g. ^[a-z]{1,8}$)");
      std::string pattern;
      if (s.contains("pattern")) {
        FP_CHECK(s["pattern"].is_string(), "json_schema: 'pattern' at ", path, " must be a string");
        pattern = s["pattern"].get<std::string>();
      } else {
        FP_CHECK(s["format"].is_string(), "json_schema: 'format' at ", path, " must be a string");
        const std::string format = s["format"].get<std::string>();
        pattern = format_pattern(format);
        FP_CHECK(!pattern.empty(), "json_schema: format '", format, "' at ", path,
                 " is not supported (supported: date, time, date-time, duration, email, hostname, ipv4, ipv6, uri, uuid)");
      }
      try {
        return add_rule(name, pattern_to_gbnf(pattern));
      } catch (const Error& e) {
        fail("json_schema: at ", path, ": ", e.what());
      }
    }
    if (!lengths) return "string";
    const size_t lo = s.contains("minLength") ? count(s, "minLength", path) : 0;
    const int64_t hi = s.contains("maxLength") ? static_cast<int64_t>(count(s, "maxLength", path)) : -1;
    FP_CHECK(hi < 0 || static_cast<size_t>(hi) >= lo, "json_schema: maxLength below minLength at ", path);
    return add_rule(name, "\"\\\"\" " + repeat("char", lo, hi) + " \"\\\"\"");
  }

  // Bounds as JSON Schema writes them: minimum/maximum with exclusiveMinimum/exclusiveMaximum as
  // numbers (draft 6 on) or as booleans beside them (draft 4).
  static std::optional<NumberBound> bound(const ojson& s, const char* inclusive, const char* exclusive, const std::string& path) {
    std::optional<NumberBound> b;
    if (s.contains(inclusive)) {
      FP_CHECK(s[inclusive].is_number(), "json_schema: '", inclusive, "' at ", path, " must be a number, not ", s[inclusive].dump());
      b = NumberBound{s[inclusive].dump(), false};
    }
    if (s.contains(exclusive)) {
      const ojson& e = s[exclusive];
      if (e.is_boolean()) {
        FP_CHECK(!e.get<bool>() || b, "json_schema: '", exclusive, "' at ", path, " is true without '", inclusive, "'");
        if (b) b->exclusive = e.get<bool>();
      } else {
        FP_CHECK(e.is_number(), "json_schema: '", exclusive, "' at ", path, " must be a number or a boolean, not ", e.dump());
        FP_CHECK(!b, "json_schema: both '", inclusive, "' and '", exclusive, "' at ", path, " is not supported (use one)");
        b = NumberBound{e.dump(), true};
      }
    }
    return b;
  }

  std::string number(const ojson& s, const std::string& name, const std::string& path, bool integer_only) {
    const auto lower = bound(s, "minimum", "exclusiveMinimum", path);
    const auto upper = bound(s, "maximum", "exclusiveMaximum", path);
    const char* type = integer_only ? "integer" : "number";
    if (!lower && !upper) return type;
    const auto expr = number_range_gbnf(lower, upper, integer_only);
    FP_CHECK(expr, "json_schema: no ", type, " at ", path, " lies within its bounds (", lower ? lower->value : "-inf", ", ",
             upper ? upper->value : "inf", ") with at most 16 integer digits");
    return add_rule(name, *expr);
  }

  std::string reference(const ojson& ref, const std::string& path) {
    FP_CHECK(ref.is_string(), "json_schema: '$ref' at ", path, " must be a string");
    const std::string r = ref.get<std::string>();
    auto it = refs_.find(r);
    if (it != refs_.end()) return it->second;
    std::string key;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (r.rfind(prefix, 0) == 0) key = prefix;
    FP_CHECK(!key.empty(), "json_schema: '$ref' ", r, " at ", path, " is not supported (only #/$defs/NAME and #/definitions/NAME)");
    const std::string section = key == "#/$defs/" ? "$defs" : "definitions";
    const std::string target = r.substr(key.size());
    FP_CHECK(root_.contains(section) && root_[section].contains(target), "json_schema: '$ref' ", r, " at ", path,
             " names no schema in the document");
    // The rule is named before it is compiled, so that a schema may refer to itself.
    const std::string name = fresh_name("ref-" + target);
    refs_[r] = name;
    const std::string body = visit(root_[section][target], name + "-def", r);
    rules_.push_back({name, body});
    return name;
  }

  std::string array(const ojson& s, const std::string& name, const std::string& path) {
    const std::string item = visit(s.contains("items") ? s["items"] : any_schema(), name + "-item", path + "/items");
    const size_t lo = s.contains("minItems") ? count(s, "minItems", path) : 0;
    const int64_t hi = s.contains("maxItems") ? static_cast<int64_t>(count(s, "maxItems", path)) : -1;
    FP_CHECK(hi < 0 || static_cast<size_t>(hi) >= lo, "json_schema: maxItems below minItems at ", path);
    if (hi == 0) return add_rule(name, R"("[" ws "]")");
    const std::string more = "\",\" ws " + item + " ws";
    const std::string rest = repeat(more, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    if (lo == 0) return add_rule(name, "\"[\" ws (" + item + " ws " + rest + ")? \"]\"");
    return add_rule(name, "\"[\" ws " + item + " ws " + rest + " \"]\"");
  }

  std::string object(const ojson& s, const std::string& name, const std::string& path) {
    if (!s.contains("properties")) {
      const ojson& ap = s.contains("additionalProperties") ? s["additionalProperties"] : any_schema();
      if (ap.is_boolean() && !ap.get<bool>()) return add_rule(name, R"("{" ws "}")");
      const std::string v = visit(ap, name + "-value", path + "/additionalProperties");
      const std::string kv = "string ws \":\" ws " + v + " ws";
      return add_rule(name, "\"{\" ws (" + kv + " (\",\" ws " + kv + ")*)? \"}\"");
    }
    const ojson& props = s["properties"];
    FP_CHECK(props.is_object(), "json_schema: 'properties' at ", path, " must be an object");
    if (s.contains("additionalProperties")) {
      const ojson& ap = s["additionalProperties"];
      FP_CHECK(ap.is_boolean() && !ap.get<bool>(), "json_schema: 'additionalProperties' at ", path,
               " beside 'properties' is supported only as false (objects hold the listed properties only)");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      FP_CHECK(s["required"].is_array(), "json_schema: 'required' at ", path, " must be an array");
      for (const auto& r : s["required"]) {
        FP_CHECK(r.is_string() && props.contains(r.get<std::string>()), "json_schema: 'required' at ", path, " lists ", r.dump(),
                 ", which is not among the properties");
        required.insert(r.get<std::string>());
      }
    }
    // One "key": value rule per property, then the properties in order: head_i when none has
    // been written yet, tail_i after one has (a comma first). A required property must come.
    std::vector<std::string> kv;
    std::vector<bool> req;
    for (const auto& [key, sub] : props.items()) {
      const std::string v = visit(sub, name + "-" + key, path + "/properties/" + key);
      kv.push_back(add_rule(name + "-" + key + "-kv", gbnf_literal(ojson(key).dump()) + " ws \":\" ws " + v + " ws"));
      req.push_back(required.count(key) > 0);
    }
    const size_t n = kv.size();
    std::vector<std::string> tail(n + 1), head(n + 1);
    tail[n] = head[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string next_tail = tail[i + 1].empty() ? "" : " " + tail[i + 1];
      const std::string item = "\",\" ws " + kv[i] + next_tail;
      if (req[i]) tail[i] = add_rule(name + "-tail" + std::to_string(i), item);
      else tail[i] = add_rule(name + "-tail" + std::to_string(i), item + (tail[i + 1].empty() ? " | " : " | " + tail[i + 1]));
      const std::string first = kv[i] + next_tail;
      if (req[i] || head[i + 1].empty()) head[i] = add_rule(name + "-head" + std::to_string(i), first + (req[i] ? "" : " | "));
      else head[i] = add_rule(name + "-head" + std::to_string(i), first + " | " + head[i + 1]);
    }
    return add_rule(name, "\"{\" ws " + (n ? head[0] + " " : "") + "\"}\"");
  }
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) { return SchemaCompiler(schema).compile(); }

std::string json_object_gbnf() { return std::string(kPrimitives) + "root ::= object\n"; }

}  // namespace fp
