// engine/json_schema.h — JSON schemas (OpenAI's response_format json_schema, llama.cpp's
// json_schema) compiled to GBNF (engine/grammar.h), so that constrained decoding can only write
// JSON the schema accepts.
//
// Supported: type (one or a list: object, array, string, number, integer, boolean, null),
// properties + required (properties written in the schema's order; optional ones may be left
// out; no other properties, as OpenAI's strict mode asks), additionalProperties (a schema for
// the values of an object without properties), items + minItems + maxItems, minLength +
// maxLength, pattern and format (engine/regex_grammar.h), minimum, maximum, exclusiveMinimum and
// exclusiveMaximum (engine/number_range_grammar.h), enum, const, anyOf, oneOf (taken as anyOf),
// allOf of one schema, $ref to #/$defs/... or #/definitions/... (recursion allowed), and
// annotations (title, description, default, examples, ...), which are ignored. Anything else
// (multipleOf, an unknown format, ...) is refused with the keyword and where it is, never
// silently loosened.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace fp {

// GBNF whose rule `root` matches the JSON texts the schema accepts (with bounded whitespace
// between tokens). Throws fp::Error naming the keyword and its path in the schema.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// GBNF for any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace fp
