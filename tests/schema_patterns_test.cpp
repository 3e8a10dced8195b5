// tests/schema_patterns_test.cpp — the JSON schema keywords that need their own compilers:
// numeric bounds (checked against exact decimal arithmetic on random bounds and numbers),
// `pattern` (checked against std::regex's ECMAScript engine on random patterns and strings),
// `format` (valid and invalid examples of each), and their errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/number_range_grammar.h"
#include "engine/regex_grammar.h"
#include "test_util.h"

namespace fp {
namespace {

using ojson = nlohmann::ordered_json;

bool accepts(const Grammar& g, const std::string& text) {
  GrammarState s = grammar_start(g);
  return grammar_accepts_prefix(g, s, text) && s.complete();
}

// A decimal with at most 6 fraction digits as an exact integer count of millionths.
int64_t micros(const std::string& text) {
  size_t i = 0;
  const bool neg = text[0] == '-';
  if (neg) ++i;
  int64_t whole = 0, frac = 0;
  for (; i < text.size() && text[i] != '.'; ++i) whole = whole * 10 + (text[i] - '0');
  int64_t scale = 100000;
  if (i < text.size())
    for (++i; i < text.size(); ++i, scale /= 10) frac += (text[i] - '0') * scale;
  const int64_t v = whole * 1000000 + frac;
  return neg ? -v : v;
}

// A random decimal: integer part of 1-4 digits (often near `near`), 0-`max_frac` fraction digits.
std::string random_decimal(std::mt19937& rng, int max_frac, bool allow_negative) {
  std::string out;
  if (allow_negative && rng() % 2) out += "-";
  const int kind = static_cast<int>(rng() % 4);
  const uint32_t whole = kind == 0 ? 0 : kind == 1 ? rng() % 10 : kind == 2 ? rng() % 100 : rng() % 3000;
  out += std::to_string(whole);
  const int frac = static_cast<int>(rng() % static_cast<uint32_t>(max_frac + 1));
  if (frac > 0) {
    out += ".";
    for (int k = 0; k < frac; ++k) out += static_cast<char>('0' + rng() % 10);
  }
  return out;
}

TEST(NumberRange, MatchesExactlyTheNumbersWithinRandomBounds) {
  std::mt19937 rng(7);
  int checked = 0, inside = 0, empty_ranges = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool integer_only = trial % 3 == 0;
    std::optional<NumberBound> lo, hi;
    if (rng() % 4) lo = NumberBound{random_decimal(rng, 3, true), rng() % 2 == 0};
    if (rng() % 4) hi = NumberBound{random_decimal(rng, 3, true), rng() % 2 == 0};
    const auto expr = number_range_gbnf(lo, hi, integer_only);
    auto within = [&](const std::string& x) {
      const int64_t v = micros(x);
      if (lo && (lo->exclusive ? v <= micros(lo->value) : v < micros(lo->value))) return false;
      if (hi && (hi->exclusive ? v >= micros(hi->value) : v > micros(hi->value))) return false;
      return true;
    };
    // Candidates: random numbers, and each bound's neighbours (the same integer part with other
    // fractions, trailing zeros, the next integers).
    std::vector<std::string> xs;
    for (int k = 0; k < 60; ++k) xs.push_back(random_decimal(rng, integer_only ? 0 : 4, true));
    for (const auto& b : {lo, hi}) {
      if (!b) continue;
      const std::string v = b->value;
      xs.push_back(v);
      if (v.find('.') == std::string::npos) {
        if (!integer_only) xs.push_back(v + ".0"), xs.push_back(v + ".001"), xs.push_back(v + ".9999");
        const int64_t n = micros(v) / 1000000;
        for (int64_t d : {-1, 1}) xs.push_back(std::to_string(n + d));
      } else if (!integer_only) {
        xs.push_back(v + "0"), xs.push_back(v + "1"), xs.push_back(v.substr(0, v.size() - 1));
      }
    }
    for (std::string x : xs) {
      if (x == "-0" || x.rfind("-0.", 0) == 0) continue;  // "-0" is never written; checked below
      if (integer_only && x.find('.') != std::string::npos) continue;
      if (x.find('.') != std::string::npos && x.back() == '.') continue;
      const bool want = within(x);
      inside += want;
      ++checked;
      if (!expr) {
        EXPECT_FALSE(want) << x << " lies within bounds judged empty";
        continue;
      }
      const auto g = Grammar::parse("root ::= " + *expr);
      EXPECT_EQ(accepts(*g, x), want) << x << " in [" << (lo ? lo->value : "-inf") << (lo && lo->exclusive ? " excl" : "")
                                      << ", " << (hi ? hi->value : "inf") << (hi && hi->exclusive ? " excl" : "") << "]"
                                      << (integer_only ? " integers" : "") << "\n" << *expr;
    }
    empty_ranges += !expr;
  }
  EXPECT_GT(checked, 20000);
  EXPECT_GT(inside, checked / 10);  // both answers are well exercised
  EXPECT_GT(empty_ranges, 5);
}

TEST(NumberRange, ShapeExponentsAndExtremeBounds) {
  auto g = [](std::optional<NumberBound> lo, std::optional<NumberBound> hi, bool integer_only) {
    const auto e = number_range_gbnf(lo, hi, integer_only);
    return e ? Grammar::parse("root ::= " + *e) : nullptr;
  };
  const auto unit = g(NumberBound{"0", false}, NumberBound{"1", false}, false);
  for (const char* ok : {"0", "0.5", "1", "1.000", "0.0001"}) EXPECT_TRUE(accepts(*unit, ok)) << ok;
  for (const char* no : {"-0", "-0.0", "1.0001", "2", "5e-1", "01", "0.", ".5"}) EXPECT_FALSE(accepts(*unit, no)) << no;
  // Bounds with exponents are read exactly: 1e-1 is 0.1, 25e1 is 250.
  const auto tenth = g(NumberBound{"1e-1", true}, NumberBound{"25e1", false}, false);
  EXPECT_FALSE(accepts(*tenth, "0.1"));
  EXPECT_TRUE(accepts(*tenth, "0.10000001"));
  EXPECT_TRUE(accepts(*tenth, "250"));
  EXPECT_FALSE(accepts(*tenth, "250.01"));
  // A bound beyond 16 digits: no integer reaches it from below, every one is under it from above.
  EXPECT_EQ(g(NumberBound{"1e20", false}, std::nullopt, true), nullptr);
  const auto huge = g(std::nullopt, NumberBound{"1e300", false}, true);
  EXPECT_TRUE(accepts(*huge, "9999999999999999"));
  EXPECT_TRUE(accepts(*huge, "-42"));
  EXPECT_FALSE(accepts(*huge, "99999999999999999"));  // 17 digits: beyond what any integer rule writes
  // Empty ranges.
  EXPECT_EQ(g(NumberBound{"0.2", false}, NumberBound{"0.8", false}, true), nullptr);
  EXPECT_EQ(g(NumberBound{"3", true}, NumberBound{"3", false}, false), nullptr);
  EXPECT_EQ(g(NumberBound{"5", false}, NumberBound{"4", false}, false), nullptr);
  const auto point = g(NumberBound{"-2.5", false}, NumberBound{"-2.5", false}, false);
  EXPECT_TRUE(accepts(*point, "-2.5"));
  EXPECT_TRUE(accepts(*point, "-2.50"));
  EXPECT_FALSE(accepts(*point, "-2.51"));
  test::expect_error([] { number_range_gbnf(NumberBound{"1.2.3", false}, std::nullopt, false); }, {"1.2.3", "not a JSON number"});
}

// JSON-encodes a text the way the pattern grammar writes escapes.
std::string json_string(const std::string& text) { return nlohmann::json(text).dump(); }

// A random pattern over a few atoms, quantifiers, nested alternations and anchors. Groups are
// not starred: std::regex backtracks exponentially on (x*|y)*; nullable repetitions have their
// own test below.
std::string random_pattern(std::mt19937& rng) {
  static const std::vector<std::string> atoms = {"a", "b", "1", ".", "[ab]", "[^a]", "[a-c1]", "\\d", "\\w", "\\s", "\\.", "\"", "\\\\", "-", "[\\d\"]", "\\D", "\\S"};
  static const std::vector<std::string> quants = {"", "", "", "*", "+", "?", "{2}", "{1,2}", "{0,}", "*?"};
  static const std::vector<std::string> group_quants = {"", "", "?", "{2}", "{0,1}"};
  std::function<std::string(int)> gen = [&](int depth) {
    std::string out;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      std::string atom;
      if (depth < 2 && rng() % 5 == 0) {
        atom.assign(1, '(');
        atom.append(gen(depth + 1));
        atom.push_back('|');
        atom.append(gen(depth + 1));
        atom.push_back(')');
        atom += group_quants[rng() % group_quants.size()];
      } else {
        atom = atoms[rng() % atoms.size()];
        atom += quants[rng() % quants.size()];
      }
      out += atom;
    }
    return out;
  };
  std::string pattern = gen(0);
  if (rng() % 2) pattern = "^" + pattern;
  if (rng() % 2) pattern += "$";
  return pattern;
}

std::string random_text(std::mt19937& rng) {
  static const std::string alphabet = "ab1 .\"\\\n-z_";
  std::string text;
  const size_t len = rng() % 7;
  for (size_t c = 0; c < len; ++c) text += alphabet[rng() % alphabet.size()];
  return text;
}

TEST(Pattern, AgreesWithStdRegexOnRandomPatternsAndStrings) {
  std::mt19937 rng(11);
  int matched = 0, total = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string pattern = random_pattern(rng);
    const std::regex re(pattern, std::regex::ECMAScript);
    const auto g = Grammar::parse("root ::= " + pattern_to_gbnf(pattern));
    for (int k = 0; k < 60; ++k) {
      const std::string text = random_text(rng);
      const bool want = std::regex_search(text, re);
      matched += want;
      ++total;
      EXPECT_EQ(accepts(*g, json_string(text)), want) << "pattern " << pattern << " on " << json_string(text);
    }
  }
  EXPECT_GT(matched, total / 10);
  EXPECT_LT(matched, total * 9 / 10);
}

// A reply constrained by a regular expression (vLLM's guided_regex): the plain text, unescaped,
// matched as a whole (std::regex_match), anchors or not.
TEST(Pattern, TextTargetMatchesTheWholeTextAsStdRegex) {
  std::mt19937 rng(12);
  int matched = 0, total = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string pattern = random_pattern(rng);
    const std::regex re(pattern, std::regex::ECMAScript);
    const auto g = Grammar::parse("root ::= " + regex_text_gbnf(pattern));
    for (int k = 0; k < 60; ++k) {
      const std::string text = random_text(rng);
      const bool want = std::regex_match(text, re);
      matched += want;
      ++total;
      EXPECT_EQ(accepts(*g, text), want) << "pattern " << pattern << " on '" << text << "'";
    }
  }
  EXPECT_GT(matched, total / 50);
  EXPECT_LT(matched, total * 9 / 10);
  // Any character, multi-byte ones too, but never NUL.
  const auto any = Grammar::parse("root ::= " + regex_text_gbnf("[^a]{2}"));
  EXPECT_TRUE(accepts(*any, "\xC3\xA9\xF0\x9F\x98\x80"));  // é and an emoji
  EXPECT_FALSE(accepts(*any, std::string("x\0", 2)));
  EXPECT_FALSE(accepts(*any, "ab"));
  test::expect_error([] { regex_text_gbnf("(?=a)"); }, {"lookaround"});
  test::expect_error([] { regex_text_gbnf("[^\\s\\S]"); }, {"matches no character"});
}

// A repetition of something that can match nothing would be left-recursive in the grammar: the
// compiler repeats its non-empty part instead. Every string over {a, b, c} up to length 5.
TEST(Pattern, RepeatedNullablePiecesMatchAsStdRegexDoes) {
  const std::vector<std::string> patterns = {"^(a*)*b$", "^(a?|b)+$", "^(|c)*a$", "^(a*b?)*c$", "^((a|)(b|)){2,}$",
                                             "^(a{0,2}){3}b$", "^(a*|b*)+?c?$", "^(?:()|a)*$", "^(a?){0}b$"};
  std::vector<std::string> texts = {""};
  for (size_t start = 0; start < texts.size(); ++start)
    if (texts[start].size() < 5)
      for (char c : std::string("abc")) texts.push_back(texts[start] + c);
  for (const std::string& p : patterns) {
    const std::regex re(p, std::regex::ECMAScript);
    const auto g = Grammar::parse("root ::= " + pattern_to_gbnf(p));
    for (const std::string& t : texts) EXPECT_EQ(accepts(*g, json_string(t)), std::regex_search(t, re)) << p << " on '" << t << "'";
  }
}

TEST(Pattern, EscapesUnicodeAndErrors) {
  const auto g = Grammar::parse("root ::= " + pattern_to_gbnf(R"(^[A-Z]{2}-\d{3,4}$)"));
  EXPECT_TRUE(accepts(*g, "\"AB-123\""));
  EXPECT_TRUE(accepts(*g, "\"XY-1234\""));
  EXPECT_FALSE(accepts(*g, "\"AB-12\""));
  EXPECT_FALSE(accepts(*g, "\"ab-123\""));
  const auto uni = Grammar::parse("root ::= " + pattern_to_gbnf("^[é-ü]+ \\u00e9$"));
  EXPECT_TRUE(accepts(*uni, "\"éü é\""));
  EXPECT_FALSE(accepts(*uni, "\"e é\""));
  const auto unanchored = Grammar::parse("root ::= " + pattern_to_gbnf("ab"));
  EXPECT_TRUE(accepts(*unanchored, "\"x\\n\\u0041abz\""));  // escapes around the match are fine
  EXPECT_FALSE(accepts(*unanchored, "\"a b\""));
  test::expect_error([] { pattern_to_gbnf("a(?=b)"); }, {"offset 1", "lookaround"});
  test::expect_error([] { pattern_to_gbnf("(a)\\1"); }, {"backreferences"});
  test::expect_error([] { pattern_to_gbnf("\\bword"); }, {"word boundary"});
  test::expect_error([] { pattern_to_gbnf("a^b"); }, {"'^'", "start"});
  test::expect_error([] { pattern_to_gbnf("(a$)"); }, {"'$'"});
  test::expect_error([] { pattern_to_gbnf("(ab"); }, {"unmatched '('"});
  test::expect_error([] { pattern_to_gbnf("ab)"); }, {"unmatched ')'"});
  test::expect_error([] { pattern_to_gbnf("[z-a]"); }, {"backwards"});
  test::expect_error([] { pattern_to_gbnf("a{5000}"); }, {"above 1000"});
  test::expect_error([] { pattern_to_gbnf("*a"); }, {"nothing to repeat"});
  test::expect_error([] { pattern_to_gbnf("[abc"); }, {"unterminated class"});
  test::expect_error([] { pattern_to_gbnf("\\p{L}"); }, {"\\p{...}"});
  test::expect_error([] { pattern_to_gbnf("\\uD83D"); }, {"lone surrogate"});
  test::expect_error([] { pattern_to_gbnf("[^\\s\\S]"); }, {"matches no character"});
  test::expect_error([] { pattern_to_gbnf(std::string(5000, 'a')); }, {"longer than 4096"});
  std::string optional_pieces = "^(";
  for (int i = 0; i < 2000; ++i) optional_pieces.append("a?");
  optional_pieces.append(")*$");
  test::expect_error([&] { pattern_to_gbnf(optional_pieces); }, {"grows past 1 MiB"});
  // A character past U+FFFF written as JavaScript writes it, a surrogate pair.
  const auto emoji = Grammar::parse("root ::= " + pattern_to_gbnf("^\\uD83D\\uDE00+$"));
  EXPECT_TRUE(accepts(*emoji, "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(*emoji, "\"\xF0\x9F\x98\x81\""));
}

TEST(Format, EachFormatTakesValidValuesAndRefusesInvalidOnes) {
  struct Case {
    const char* format;
    std::vector<const char*> valid, invalid;
  };
  const std::vector<Case> cases = {
      {"date", {"2024-02-29", "2000-02-29", "1999-12-31", "2023-04-30", "0001-01-01"},
       {"2024-13-01", "2024-1-01", "24-01-01", "2024-01-32", "2023-02-29", "1900-02-29", "2024-04-31", "0000-01-01"}},
      {"time", {"23:59:59Z", "08:30:00.123456+05:30", "00:00:00-00:00"}, {"24:00:00Z", "12:00:00", "12:60:00Z", "23:59:60Z", "00:00:00.1234567Z"}},
      {"date-time", {"2024-01-01T12:00:00Z", "2024-06-30T23:15:00.5-07:00"}, {"2024-01-01 12:00:00Z", "2024-01-01T12:00Z", "2024-06-31T00:00:00Z"}},
      {"duration", {"P3D", "PT1H30M", "P1Y2M", "P1Y2M3DT4H5M6S", "P2W", "P1DT2H", "PT36S"},
       {"P", "PT", "P1H", "1D", "P1Y2W", "P1Y3D", "PT1H1S", "PT0.5S"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"email", {"a.b+c@example.com", "x@sub.example.org"}, {"a@b", "@example.com", "a..b@example.com", "a b@example.com"}},
      {"hostname", {"example.com", "a-b.c", "localhost"}, {"-a.com", "a-.com", "a..b"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "1.2.3", "01.2.3.4"}},
      {"ipv6", {"::1", "::", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "fe80::"}, {"1::2::3", "1:2:3:4:5:6:7:8:9", "12345::", ":1"}},
      {"uri", {"https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c"}, {"example.com", "1http://x", "http://a b"}},
  };
  for (const Case& c : cases) {
    const std::string pattern = format_pattern(c.format);
    ASSERT_FALSE(pattern.empty()) << c.format;
    const std::regex re(pattern, std::regex::ECMAScript);
    const auto g = Grammar::parse("root ::= " + pattern_to_gbnf(pattern));
    for (const char* v : c.valid) {
      EXPECT_TRUE(std::regex_search(std::string(v), re)) << c.format << " " << v;
      EXPECT_TRUE(accepts(*g, json_string(v))) << c.format << " " << v;
    }
    for (const char* v : c.invalid) {
      EXPECT_FALSE(std::regex_search(std::string(v), re)) << c.format << " " << v;
      EXPECT_FALSE(accepts(*g, json_string(v))) << c.format << " " << v;
    }
  }
  EXPECT_EQ(format_pattern("color"), "");
}

// Every day of some years (leap, not, centuries, the ends of the range) against std::chrono's calendar.
TEST(Format, DatesAreExactlyTheCalendarsDays) {
  const auto g = Grammar::parse("root ::= " + pattern_to_gbnf(format_pattern("date")));
  int valid = 0;
  for (int y : {0, 1, 4, 100, 400, 1900, 1996, 2000, 2023, 2024, 2100, 9996, 9999})
    for (unsigned m = 0; m <= 13; ++m)
      for (unsigned d = 0; d <= 32; ++d) {
        char text[32];
        std::snprintf(text, sizeof text, "\"%04d-%02u-%02u\"", y, m, d);
        const bool real = y >= 1 && std::chrono::year_month_day(std::chrono::year(y), std::chrono::month(m), std::chrono::day(d)).ok();
        valid += real;
        EXPECT_EQ(accepts(*g, text), real) << text;
      }
  EXPECT_EQ(valid, 12 * 365 + 6);  // 12 years 0001-9999 here, 6 of them leap (4, 400, 1996, 2000, 2024, 9996; not 100, 1900, 2100)
}

TEST(JsonSchema, BoundsPatternsAndFormatsInSchemas) {
  const ojson schema = ojson::parse(R"({
    "type": "object",
    "properties": {
      "month": {"type": "integer", "minimum": 1, "maximum": 12},
      "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
      "old": {"type": "number", "minimum": 10, "exclusiveMinimum": true},
      "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
      "day": {"type": "string", "format": "date"},
      "maybe": {"type": ["integer", "null"], "minimum": 0}
    },
    "required": ["month", "score", "old", "code", "day", "maybe"]
  })");
  const auto g = Grammar::parse(json_schema_to_gbnf(schema));
  auto doc = [](const std::string& month, const std::string& score, const std::string& old, const std::string& code,
                const std::string& day, const std::string& maybe) {
    return R"({"month": )" + month + R"(, "score": )" + score + R"(, "old": )" + old + R"(, "code": ")" + code + R"(", "day": ")" +
           day + R"(", "maybe": )" + maybe + "}";
  };
  EXPECT_TRUE(accepts(*g, doc("7", "0.25", "10.5", "ABC", "2024-05-06", "null")));
  EXPECT_TRUE(accepts(*g, doc("12", "1", "11", "XYZ", "2024-05-06", "3")));
  EXPECT_FALSE(accepts(*g, doc("13", "0.25", "10.5", "ABC", "2024-05-06", "null")));
  EXPECT_FALSE(accepts(*g, doc("7", "0", "10.5", "ABC", "2024-05-06", "null")));
  EXPECT_FALSE(accepts(*g, doc("7", "0.25", "10", "ABC", "2024-05-06", "null")));
  EXPECT_FALSE(accepts(*g, doc("7", "0.25", "10.5", "ABCD", "2024-05-06", "null")));
  EXPECT_FALSE(accepts(*g, doc("7", "0.25", "10.5", "ABC", "2024-5-6", "null")));
  EXPECT_FALSE(accepts(*g, doc("7", "0.25", "10.5", "ABC", "2024-05-06", "-1")));

  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "integer", "minimum": 5, "maximum": 4})")); },
                     {"no integer", "#", "bounds"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "number", "minimum": 1, "exclusiveMinimum": 2})")); },
                     {"both 'minimum' and 'exclusiveMinimum'"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "integer", "maximum": "9"})")); }, {"'maximum'", "number"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"properties": {"s": {"type": "string", "format": "color"}}})")); },
                     {"format 'color'", "#/properties/s", "supported:"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"x({"type": "string", "pattern": "a(?!b)"})x")); },
                     {"at #", "pattern 'a(?!b)'", "lookaround"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "string", "pattern": "^a+$", "maxLength": 3})")); },
                     {"maxLength", "'pattern'"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"minimum": 0})")); }, {"'minimum'", "needs a 'type'"});
}

}  // namespace
}  // namespace fp
