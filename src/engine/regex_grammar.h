// engine/regex_grammar.h — a JSON schema's `pattern` (an ECMAScript regular expression) compiled to
// a GBNF expression for the JSON string literals whose text matches it, so that constrained
// decoding writes only strings the pattern accepts; or, for a regex-constrained reply, for the
// plain text it matches. Also the `format`s that are regular
// languages (date, time, date-time, duration, uuid, email, hostname, ipv4, ipv6, uri), through patterns.
//
// Supported: literals, `.`, classes ([a-z], [^...], \d \w \s and their negations, \t \n \r \f
// \v \0 \xHH \uHHHH), groups ( ), (?: ), (?<name> ), alternation, the quantifiers * + ? {n}
// {n,} {n,m} (lazy forms taken as greedy: only the set of strings matters), and ^ / $ at the
// pattern's ends. As JSON Schema asks, a side without its anchor matches anything there. The
// text is matched before JSON escaping: a `"` in the pattern is written \" in the string; `.` and
// negated classes write characters that need escaping in one escaped form each.
// Refused, naming the construct and its offset: backreferences, lookaround, \b \B, \p{...},
// anchors inside the pattern, counts above 1000.
#pragma once
#include <string>

namespace fp {

// A GBNF expression (quotes included) for the JSON strings whose text matches `pattern` as
// JSON Schema reads it (a search, unless anchored). Throws fp::Error naming the problem.
std::string pattern_to_gbnf(const std::string& pattern);

// A GBNF expression for the text that `pattern` matches as a whole (the anchors are implied, as
// vLLM's guided_regex / structured_outputs.regex read it): any code point but NUL, unescaped.
// The same constructs as above. Throws fp::Error naming the problem.
std::string regex_text_gbnf(const std::string& pattern);

// The pattern for a `format` (anchored), or "" when the format is not one of the above.
std::string format_pattern(const std::string& format);

}  // namespace fp
