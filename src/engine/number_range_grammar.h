// engine/number_range_grammar.h — JSON numbers within bounds (a JSON schema's minimum, maximum,
// exclusiveMinimum, exclusiveMaximum) as a GBNF expression, exactly: the bounds are taken as
// written in decimal, never through a float, and the expression is built digit by digit (the
// integer part by length and digit ranges, the fraction by comparing with the bound's digits), so
// that every number it matches lies within the bounds and every number within them that fits
// the grammar's shape (at most 16 integer digits, no exponent) is matched.
#pragma once
#include <optional>
#include <string>

namespace fp {

struct NumberBound {
  std::string value;  // a JSON number as written, e.g. "-2.5", "1e3"
  bool exclusive = false;
};

// A GBNF expression (no rules of its own) for the JSON numbers x with lower <= x <= upper (< or >
// where exclusive); integers only when `integer_only`. Numbers are written without an exponent and
// without "-0". nullopt when no such number can be written. Throws fp::Error on a bound that is
// not a JSON number.
std::optional<std::string> number_range_gbnf(const std::optional<NumberBound>& lower,
                                             const std::optional<NumberBound>& upper, bool integer_only);

}  // namespace fp
