// tests/constrained_decoding_test.cpp — constrained decoding: the GBNF parser and matcher, the
// JSON grammar checked against a JSON parser on random documents and mutations, JSON schemas
// compiled to grammars (instances accepted, violations refused, unsupported keywords named),
// the vocabulary mask against a token-by-token check on real tokenizers, random sampling under
// the mask writing schema-valid JSON, and the engine writing valid JSON beside unconstrained
// requests that stay as they were. Also a gate that holds the grammar back until the reply has
// spelled it (gpt-oss's harmony answers after <|channel|>final<|message|>).
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/regex_grammar.h"
#include "engine/token_constraint.h"
#include "model/model.h"
#include "server/openai_api.h"
#include "test_util.h"
#include "tokenizer/models.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// Whether the grammar takes the whole text as a complete sentence.
bool accepts(const Grammar& g, const std::string& text) {
  GrammarState s = grammar_start(g);
  return grammar_accepts_prefix(g, s, text) && s.complete();
}
// Whether the text can still be continued into a sentence (or is one).
bool live_prefix(const Grammar& g, const std::string& text) {
  GrammarState s = grammar_start(g);
  return grammar_accepts_prefix(g, s, text);
}

TEST(Grammar, ParsesGbnfAndMatchesWhatItDescribes) {
  struct Case {
    const char* gbnf;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {R"g(root ::= "ab" | "c")g", {"ab", "c"}, {"", "a", "abc", "b", "ac"}},
      {R"g(root ::= [a-c]+ "!")g", {"a!", "abcabc!"}, {"!", "ad!", "abc"}},
      {R"g(root ::= [^a-c]*)g", {"", "xyz", "\xce\xb1"}, {"a", "xb"}},
      {R"g(root ::= "x"{2,3} "y"?)g", {"xx", "xxx", "xxy", "xxxy"}, {"x", "xxxx", "xxyy", "y"}},
      {R"g(root ::= "x"{2,})g", {"xx", "xxxxxxx"}, {"x", ""}},
      {R"g(root ::= "x"{0})g", {""}, {"x"}},
      {R"g(root ::= item ("," item)*  # a comment
          item ::= [0-9]
                 | "(" root ")")g",
       {"1", "1,2,3", "(1,2),3", "((4))"}, {"", "1,", "(1", "1)", "12"}},
      {"root ::= [\\u03b1-\\u03c9] \"\\x41\" \"\\n\" [\\]]", {"\xce\xb2" "A\n]"}, {"bA\n]", "\xce\xb2" "A\n["}},
      {R"g(root ::= "é" .)g", {"\xc3\xa9z", "\xc3\xa9\xe2\x82\xac"}, {"e\xcc\x81z", "\xc3\xa9"}},
  };
  for (const Case& c : cases) {
    auto g = Grammar::parse(c.gbnf);
    for (const auto& y : c.yes) EXPECT_TRUE(accepts(*g, y)) << c.gbnf << " should take '" << y << "'";
    for (const auto& n : c.no) EXPECT_FALSE(accepts(*g, n)) << c.gbnf << " should refuse '" << n << "'";
  }
  // A character split across steps is judged by what it can still become: "α" is CE B1; CE
  // starts U+0380..U+03BF (some Greek letters), C3 starts U+00C0..U+00FF (none).
  auto greek = Grammar::parse(R"(root ::= [α-ω])");
  GrammarState s = grammar_start(*greek);
  EXPECT_TRUE(grammar_advance(*greek, s, 0xCE));
  EXPECT_FALSE(s.complete());
  EXPECT_TRUE(grammar_advance(*greek, s, 0xB1));
  EXPECT_TRUE(s.complete());
  s = grammar_start(*greek);
  EXPECT_FALSE(grammar_advance(*greek, s, 0xC3));
  s = grammar_start(*greek);
  EXPECT_FALSE(grammar_advance(*greek, s, 0x80)) << "a continuation byte without a lead";
  // Overlong encodings (E0 80 BA and C0 BA spell ':' the long way) and surrogates are not characters.
  auto colon = Grammar::parse(R"(root ::= ":" | [^a])");
  EXPECT_TRUE(accepts(*colon, ":"));
  EXPECT_FALSE(live_prefix(*colon, "\xe0\x80\xba"));
  EXPECT_FALSE(live_prefix(*colon, "\xc0\xba"));
  EXPECT_FALSE(live_prefix(*colon, "\xed\xa0\x80"));
  EXPECT_FALSE(live_prefix(*colon, "\xf4\x90\x80\x80")) << "beyond U+10FFFF";
  EXPECT_TRUE(accepts(*colon, "\xf4\x8f\xbf\xbf"));
  // Right recursion keeps one flat stack however long the text.
  auto many = Grammar::parse(R"(root ::= "a"*)");
  GrammarState m = grammar_start(*many);
  ASSERT_TRUE(grammar_accepts_prefix(*many, m, std::string(1000, 'a')));
  EXPECT_EQ(m.key(), [&] { GrammarState one = grammar_start(*many); grammar_accepts_prefix(*many, one, "a"); return one.key(); }());
}

TEST(Grammar, ErrorsNameTheProblem) {
  test::expect_error([] { Grammar::parse("root ::= item"); }, {"'item'", "never defined"});
  test::expect_error([] { Grammar::parse("root ::= root \"a\" | \"b\""); }, {"'root'", "left-recursive"});
  test::expect_error([] { Grammar::parse("root ::= x\nx ::= y? root \"a\"\ny ::= \"b\""); }, {"left-recursive"});
  test::expect_error([] { Grammar::parse("root ::= (\"\")*"); }, {"left-recursive"});
  test::expect_error([] { Grammar::parse("root ::= \"abc"); }, {"line 1", "unterminated literal"});
  test::expect_error([] { Grammar::parse("root ::= [a-"); }, {"unterminated character class"});
  test::expect_error([] { Grammar::parse("root ::= \"a\"\n\nx ::= ( \"b\""); }, {"line 3", "unmatched '('"});
  test::expect_error([] { Grammar::parse("other ::= \"a\""); }, {"no root rule 'root'"});
  test::expect_error([] { Grammar::parse("root ::= [z-a]"); }, {"runs backwards"});
  test::expect_error([] { Grammar::parse("root ::= \"\\q\""); }, {"unknown escape"});
  test::expect_error([] { Grammar::parse("root ::= \"a\"{3,2}"); }, {"runs backwards"});
  test::expect_error([] { Grammar::parse("root ::= \"a\"\nroot ::= \"b\""); }, {"defined twice"});
  test::expect_error([] { Grammar::parse(""); }, {"empty"});
  test::expect_error([] { Grammar::parse("root ::= \"\xc0\xba\""); }, {"line 1", "invalid UTF-8"});  // an overlong ':'
}

// A random JSON value, written with random (allowed) whitespace.
struct JsonWriter {
  std::mt19937_64 rng;
  int pick(int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); }
  std::string ws() {
    switch (pick(4)) {
      case 0: return " ";
      case 1: return std::string("\n").append(static_cast<size_t>(pick(5)), ' ');
      default: return "";
    }
  }
  std::string str() {
    static const std::vector<std::string> pieces = {"a", "Z", " ", "\\\"", "\\\\", "\\n", "\\u00e9", "\xc3\xa9", "\xe2\x82\xac",
                                                    "\xf0\x9f\x98\x80", "/", "\\/", "{", "]", ",", ":"};
    std::string s = "\"";
    for (int i = pick(6); i > 0; --i) s += pieces[static_cast<size_t>(pick(static_cast<int>(pieces.size())))];
    return s + "\"";
  }
  std::string number() {
    std::string s = pick(3) == 0 ? "-" : "";
    s += pick(4) == 0 ? "0" : std::to_string(1 + pick(99999));
    if (pick(2)) s.append(".").append(std::to_string(pick(1000)));
    if (pick(3) == 0) s.append(pick(2) ? "e" : "E").append(pick(2) ? "-" : "+").append(std::to_string(pick(10)));  // no overflow when a digit doubles
    return s;
  }
  std::string value(int depth) {
    const int k = pick(depth > 3 ? 5 : 7);
    switch (k) {
      case 0: return str();
      case 1: return number();
      case 2: return pick(2) ? "true" : "false";
      case 3: return "null";
      case 4: return std::to_string(pick(10));
      case 5: return object(depth + 1);
      default: {
        std::string s = "[";
        s += ws();
        for (int i = 0, n = pick(4); i < n; ++i) {
          if (i) s.append(",").append(ws());
          s.append(value(depth + 1)).append(ws());
        }
        return s + "]";
      }
    }
  }
  std::string object(int depth) {
    std::string s = "{";
    s += ws();
    for (int i = 0, n = pick(4); i < n; ++i) {
      if (i) s.append(",").append(ws());
      s.append(str()).append(ws()).append(":").append(ws()).append(value(depth + 1)).append(ws());
    }
    return s + "}";
  }
};

TEST(Grammar, JsonGrammarAgreesWithAJsonParser) {
  auto g = Grammar::parse(json_object_gbnf());
  JsonWriter w{std::mt19937_64(7)};
  int accepted_mutants = 0;
  for (int i = 0; i < (test::kSanitized ? 150 : 600); ++i) {
    const std::string doc = w.object(0);
    ASSERT_TRUE(json::accept(doc)) << "the writer made bad JSON: " << doc;
    EXPECT_TRUE(accepts(*g, doc)) << doc;
    // Mutants: a byte changed, dropped or doubled. Whatever the grammar takes whole must be a
    // JSON object; whatever it refuses at some byte must not parse as JSON with that prefix kept
    // (checked through the parser on the mutant itself when the grammar refuses it outright).
    for (int m = 0; m < 4; ++m) {
      std::string mut = doc;
      const size_t at = static_cast<size_t>(w.pick(static_cast<int>(mut.size())));
      const char repl = "{}[]\",:0-.e \\a\n"[w.pick(15)];
      switch (w.pick(3)) {
        case 0: mut[at] = repl; break;
        case 1: mut.erase(at, 1); break;
        default: {
          const char ch = mut[at];
          mut.insert(mut.begin() + static_cast<std::ptrdiff_t>(at), ch);
          break;
        }
      }
      if (accepts(*g, mut)) {
        ++accepted_mutants;
        EXPECT_TRUE(json::accept(mut)) << "the grammar took invalid JSON: " << mut;
        EXPECT_TRUE(json::parse(mut).is_object()) << mut;
      }
    }
  }
  EXPECT_GT(accepted_mutants, 0);  // some mutants stay valid (a changed digit, a space)
  // Not objects, or beyond the grammar's bounds on purpose.
  for (const std::string bad : {"[]", "1", "\"x\"", "{\"a\" 1}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":\"\x01\"}",
                                "{\"a\":tru}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}"})
    EXPECT_FALSE(accepts(*g, bad)) << bad;
  EXPECT_FALSE(live_prefix(*g, "{\"a\":" + std::string(40, ' '))) << "whitespace is bounded";
  EXPECT_FALSE(live_prefix(*g, "{\"a\":1" + std::string(17, '0'))) << "integer digits are bounded";
}

const char* const kPersonSchema = R"({
  "title": "Person", "type": "object",
  "$defs": {
    "Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "friends": {"type": "array", "items": {"$ref": "#/$defs/Pet"}}},
            "required": ["kind"], "additionalProperties": false}
  },
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "a name"},
    "age": {"type": "integer"},
    "height": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    "ok": {"const": true},
    "extra": {"type": "object", "additionalProperties": {"type": "integer"}}
  },
  "required": ["name", "age", "tags"]
})";

TEST(JsonSchema, CompiledGrammarAcceptsInstancesAndRefusesViolations) {
  const std::string gbnf = json_schema_to_gbnf(ojson::parse(kPersonSchema));
  auto g = Grammar::parse(gbnf);
  const std::vector<std::string> valid = {
      R"({"name": "Ann", "age": 31, "tags": ["a"]})",
      R"({"name":"Bo","age":-2,"height":1.85,"tags":["x","y","z"],"pet":{"kind":"dog","friends":[{"kind":"cat"}]},"ok":true})",
      "{\n  \"name\": \"C\",\n  \"age\": 0,\n  \"height\": null,\n  \"tags\": [\"\"],\n  \"pet\": null,\n  \"extra\": {\"k\": 3}\n}",
      R"({"name": "Dee", "age": 1, "tags": ["q"], "extra": {}})",
  };
  const std::vector<std::string> invalid = {
      R"({"name": "Ann", "tags": ["a"]})",                                    // age is required
      R"({"name": "", "age": 1, "tags": ["a"]})",                             // minLength 1
      R"({"name": "Annabella", "age": 1, "tags": ["a"]})",                    // maxLength 8
      R"({"name": "Ann", "age": 1.5, "tags": ["a"]})",                        // an integer
      R"({"name": "Ann", "age": 1, "tags": []})",                             // minItems 1
      R"({"name": "Ann", "age": 1, "tags": ["a", "b", "c", "d"]})",           // maxItems 3
      R"({"name": "Ann", "age": 1, "tags": ["a"], "pet": {"kind": "cow"}})",  // not in the enum
      R"({"name": "Ann", "age": 1, "tags": ["a"], "pet": {"friends": []}})",  // kind is required
      R"({"name": "Ann", "age": 1, "tags": ["a"], "ok": false})",             // const
      R"({"name": "Ann", "age": 1, "tags": ["a"], "other": 1})",              // no other properties
      R"({"name": "Ann", "age": 1, "tags": ["a"], "extra": {"k": "v"}})",     // extra's values are integers
      R"({"name": "Ann", "age": 1, "tags": [1]})",                            // tags are strings
  };
  for (const auto& v : valid) {
    ASSERT_TRUE(json::accept(v)) << v;
    EXPECT_TRUE(accepts(*g, v)) << v << "\n" << gbnf;
  }
  for (const auto& v : invalid) {
    ASSERT_TRUE(json::accept(v)) << v;
    EXPECT_FALSE(accepts(*g, v)) << v;
  }
  // The schema's property order is the order written (the document's, not sorted).
  EXPECT_FALSE(accepts(*g, R"({"age": 31, "name": "Ann", "tags": ["a"]})"));
  // Other top-level shapes.
  EXPECT_TRUE(accepts(*Grammar::parse(json_schema_to_gbnf(ojson::parse(R"({"type": "string"})"))), "\"x\""));
  EXPECT_TRUE(accepts(*Grammar::parse(json_schema_to_gbnf(ojson::parse(R"({"enum": [1, "two", null]})"))), "\"two\""));
  EXPECT_TRUE(accepts(*Grammar::parse(json_schema_to_gbnf(ojson::parse("true"))), "[1, {\"a\": null}]"));
  EXPECT_FALSE(accepts(*Grammar::parse(json_schema_to_gbnf(ojson::parse(R"({"type": "object", "additionalProperties": false})"))),
                       "{\"a\": 1}"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamedNotIgnored) {
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "string", "contentEncoding": "base64"})")); },
                     {"'contentEncoding'", "#"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"properties": {"n": {"type": "integer", "multipleOf": 5}}})")); },
                     {"'multipleOf'", "#/properties/n"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"$ref": "#/$defs/Missing"})")); }, {"#/$defs/Missing", "names no schema"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"type": "strin"})")); }, {"unknown type 'strin'"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"properties": {"a": {}}, "required": ["b"]})")); }, {"\"b\"", "not among"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse(R"({"allOf": [{}, {}]})")); }, {"'allOf'", "one schema"});
  test::expect_error([] { json_schema_to_gbnf(ojson::parse("false")); }, {"accepts nothing"});
}

// The tokenizers the mask is checked on: stories260K's SPM vocabulary always, real BPE ones
// when the test data has them.
std::vector<std::unique_ptr<Tokenizer>> test_tokenizers() {
  std::vector<std::unique_ptr<Tokenizer>> out;
  for (const char* rel : {"models/stories260K/stories260K.gguf", "tokenizers/llama3/tokenizer.json", "tokenizers/qwen3/tokenizer.json"})
    if (file_exists(test::testdata(rel))) out.push_back(Tokenizer::from_path(test::testdata(rel)));
  return out;
}

// What the trie walk must give: every token checked one by one.
std::vector<uint64_t> mask_one_by_one(const TokenConstraint& c, const Tokenizer& tok, const GrammarState& s) {
  std::vector<uint64_t> bits((static_cast<size_t>(tok.n_vocab()) + 63) / 64, 0);
  bool any = false;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    GrammarState t = s;
    if (c.accept(t, id)) {
      bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
      any = true;
    }
  }
  if (s.complete() || !any)
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if (tok.is_eog(id)) bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  return bits;
}

std::vector<int32_t> ids_of(const std::vector<uint64_t>& bits, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i)
    if ((bits[static_cast<size_t>(i) / 64] >> (i % 64)) & 1) out.push_back(i);
  return out;
}

TEST(TokenConstraint, MaskEqualsATokenByTokenCheck) {
  auto toks = test_tokenizers();
  if (toks.empty()) GTEST_SKIP() << "test data missing: no tokenizer under " << test::testdata("");
  for (const auto& tok : toks) {
    const bool big = tok->n_vocab() > 10000;
    for (const std::string& gbnf : {json_schema_to_gbnf(ojson::parse(kPersonSchema)), std::string(R"(root ::= [α-ω]+ "." | "é"{2} [^a-z])")}) {
      TokenConstraint c(Grammar::parse(gbnf), *tok, "test");
      std::mt19937_64 rng(11);
      GrammarState s = c.start();
      const int steps = big ? (test::kSanitized ? 3 : 12) : 60;
      for (int step = 0; step < steps; ++step) {
        const std::vector<uint64_t> want = mask_one_by_one(c, *tok, s);
        const std::vector<uint64_t>& got = c.allowed(s);
        ASSERT_EQ(ids_of(got, tok->n_vocab()), ids_of(want, tok->n_vocab())) << tok->describe() << " step " << step;
        // Next: a random allowed token that is not an ending (prefer the short ones so the walk
        // covers structure, not one long string).
        std::vector<int32_t> next;
        for (int32_t id : ids_of(got, tok->n_vocab()))
          if (!tok->is_eog(id) && (tok->token_to_bytes(id).size() <= 2 || rng() % 8 == 0)) next.push_back(id);
        if (next.empty()) break;
        ASSERT_TRUE(c.accept(s, next[rng() % next.size()]));
      }
    }
  }
}

// A test-side check of kPersonSchema-like finite schemas: the fields and their kinds.
const char* const kFiniteSchema = R"({"type": "object", "properties": {
    "color": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}, "ok": {"type": "boolean"},
    "sizes": {"type": "array", "items": {"enum": ["S", "M", "L"]}, "maxItems": 3}, "note": {"type": "null"}},
  "required": ["color", "count", "ok"]})";

void expect_finite_schema_instance(const std::string& text) {
  ASSERT_TRUE(json::accept(text)) << text;
  const json j = json::parse(text);
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("color") && j.contains("count") && j.contains("ok")) << text;
  EXPECT_TRUE(j["color"] == "red" || j["color"] == "green" || j["color"] == "blue") << text;
  EXPECT_TRUE(j["count"].is_number_integer()) << text;
  EXPECT_TRUE(j["ok"].is_boolean()) << text;
  if (j.contains("sizes")) {
    EXPECT_TRUE(j["sizes"].is_array() && j["sizes"].size() <= 3) << text;
    for (const auto& x : j["sizes"]) {
      EXPECT_TRUE(x == "S" || x == "M" || x == "L") << text;
    }
  }
  if (j.contains("note")) {
    EXPECT_TRUE(j["note"].is_null()) << text;
  }
  for (const auto& [k, v] : j.items()) {
    (void)v;
    EXPECT_TRUE(k == "color" || k == "count" || k == "ok" || k == "sizes" || k == "note") << text;
  }
}

TEST(TokenConstraint, RandomSamplingUnderTheMaskWritesSchemaValidJson) {
  auto toks = test_tokenizers();
  if (toks.empty()) GTEST_SKIP() << "test data missing: no tokenizer under " << test::testdata("");
  for (const auto& tok : toks) {
    auto c = std::make_shared<TokenConstraint>(Grammar::parse(json_schema_to_gbnf(ojson::parse(kFiniteSchema))), *tok, "json_schema");
    std::mt19937_64 rng(5);
    int finished = 0;
    for (int doc = 0; doc < 8; ++doc) {
      GrammarState s = c->start();
      std::vector<int32_t> ids;
      for (int step = 0; step < 400; ++step) {
        const std::vector<int32_t> ok = ids_of(c->allowed(s), tok->n_vocab());
        ASSERT_FALSE(ok.empty());
        const int32_t id = ok[rng() % ok.size()];
        if (tok->is_eog(id)) break;
        ASSERT_TRUE(c->accept(s, id));
        ids.push_back(id);
        if (c->only_end(s)) break;
      }
      ASSERT_TRUE(s.complete()) << "the walk did not finish: " << tok->decode(ids);
      ++finished;
      std::string text;
      for (int32_t id : ids) text += tok->token_to_bytes(id);
      expect_finite_schema_instance(text);
    }
    EXPECT_EQ(finished, 8);
    EXPECT_GT(c->cache_size(), 0u);
  }
}

std::unique_ptr<Model> load_stories() { return load_model(test::stories_path()); }

// The model's unconstrained greedy continuation of `prompt` (generate(), no engine).
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int32_t n) {
  GenerateRequest g;
  g.prompt = prompt;
  g.max_new_tokens = n;
  g.sampling.temperature = 0;
  return generate(m, g).tokens;
}

// The engine: constrained requests (greedy, sampled, ignore_eos, any object with log-probabilities)
// beside a plain one, with and without speculative drafts. Drafts change no token: each draft row
// is judged under the grammar state its prefix reaches.
TEST(Engine, ConstrainedRequestsWriteValidJsonBesideUnchangedOthers) {
  FP_REQUIRE_FILE(test::stories_path());
  auto m = load_stories();
  const Tokenizer& tok = *m->tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a dog named", true, false);
  const std::vector<int32_t> plain = greedy(*m, prompt, 30);  // the unconstrained request alone, for comparison

  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::string> finish;
    std::vector<StepOutput> outs;
    SpeculativeStats spec;
    std::shared_ptr<TokenConstraint> object;
  };
  auto run = [&](bool drafts) {
    Run out;
    auto finite = std::make_shared<TokenConstraint>(Grammar::parse(json_schema_to_gbnf(ojson::parse(kFiniteSchema))), tok, "json_schema");
    out.object = std::make_shared<TokenConstraint>(Grammar::parse(json_object_gbnf()), tok, "json_object");
    EngineConfig cfg;
    cfg.page_size = 16;
    cfg.kv_cache_bytes = 12 << 20;
    cfg.max_model_len = 512;
    cfg.scheduler.chunked_prefill = true;
    cfg.scheduler.max_num_batched_tokens = 32;
    if (drafts) cfg.speculative = {3, 1, 3};
    Engine e(*m, cfg);
    std::vector<int64_t> ids;
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = 30;
    r.sampling.temperature = 0;
    ids.push_back(e.add_request(r));  // plain greedy
    r.max_new_tokens = 200;
    r.constraint = finite;
    ids.push_back(e.add_request(r));  // greedy, schema
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    for (uint64_t seed = 1; seed <= 4; ++seed) {  // sampled, schema (ignore_eos too: the grammar still ends them)
      r.sampling.seed = seed;
      r.stop_at_eog = seed % 2 == 0;
      ids.push_back(e.add_request(r));
    }
    r.constraint = out.object;
    r.max_new_tokens = 40;
    r.logprobs = 2;  // log-probabilities come from the model's own row
    ids.push_back(e.add_request(r));  // sampled, any object: may run out of tokens, but stays a live prefix
    for (int guard = 0; e.has_work() && guard < 10000; ++guard) {
      auto o = e.step();
      for (StepOutput& x : o) {
        for (size_t i = 0; i < ids.size(); ++i)
          if (x.id == ids[i]) x.id = static_cast<int64_t>(i);  // by request index
        out.outs.push_back(std::move(x));
      }
    }
    EXPECT_FALSE(e.has_work());
    for (int64_t id : ids) {
      const Sequence* sq = e.sequence(id);
      out.tokens.emplace_back(sq->tokens.begin() + sq->n_prompt, sq->tokens.end());
      out.finish.push_back(sq->finish_reason);
    }
    out.spec = e.stats().speculative;
    return out;
  };
  const Run base = run(false), drafted = run(true);
  EXPECT_EQ(drafted.tokens, base.tokens) << "drafts changed a token";
  EXPECT_EQ(drafted.finish, base.finish);
  EXPECT_GT(drafted.spec.accepted_tokens, 0);
  EXPECT_EQ(base.tokens[0], plain);
  for (size_t i = 1; i <= 5; ++i) {
    EXPECT_EQ(base.finish[i], "stop") << i;
    std::string text;
    for (int32_t t : base.tokens[i]) text += tok.token_to_bytes(t);
    expect_finite_schema_instance(text);
  }
  std::string text;
  for (int32_t t : base.tokens[6]) text += tok.token_to_bytes(t);
  auto g_obj = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(live_prefix(*g_obj, text)) << text;
  if (base.finish[6] == "stop") {
    EXPECT_TRUE(json::parse(text).is_object()) << text;
  }
  // The log-probabilities are the model's (before the mask): after "...a dog named" the model's
  // favourites for the first token are names, which an object cannot start with.
  const std::vector<uint64_t>& at_start = base.object->allowed(base.object->start());
  int refused_alternatives = 0;
  for (const StepOutput& o : base.outs)
    if (o.id == 6 && o.token >= 0) {
      ASSERT_FALSE(o.top_logprobs.empty());
      for (const auto& [alt, lp] : o.top_logprobs) {
        (void)lp;
        refused_alternatives += !((at_start[static_cast<size_t>(alt) / 64] >> (alt % 64)) & 1);
      }
      break;  // the first token only
    }
  EXPECT_GT(refused_alternatives, 0);
}

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// `generate --json-schema` / `--json` / `--grammar-file`, alone and with --batch-file; refusals.
TEST(GenerateCli, ConstrainedOutputAndRefusals) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("constrained_cli");
  test::write_file(dir + "/schema.json", kFiniteSchema);
  test::write_file(dir + "/yn.gbnf", "# yes or no\nroot ::= \"yes\" | \"no\"\n");
  const std::string base = test::fastpath_bin() + " generate -q -m " + test::stories_path() + " -n 200 ";
  int rc = -1;
  std::string out = test::run_command(base + "--temp 0 -p 'Lily' --json-schema " + dir + "/schema.json", &rc);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(out.empty());
  out.pop_back();  // the newline after the text
  expect_finite_schema_instance(out);
  out = test::run_command(base + "--temp 0 -p 'Is it?' --grammar-file " + dir + "/yn.gbnf", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(out == "yes\n" || out == "no\n") << out;
  // Speculative drafts (prompt lookup) change nothing: greedy and seeded sampling alike.
  for (const std::string sampling : {"--temp 0", "--temp 1 --top-k 0 --top-p 1 --min-p 0 -s 9"}) {
    const std::string cmd = base + sampling + " -p 'Lily' --json-schema " + dir + "/schema.json";
    const std::string plain_out = test::run_command(cmd, &rc);
    ASSERT_EQ(rc, 0) << plain_out;
    const std::string drafted_out = test::run_command(cmd + " --speculative-tokens 3 --prompt-lookup-min 1", &rc);
    ASSERT_EQ(rc, 0) << drafted_out;
    EXPECT_EQ(drafted_out, plain_out) << sampling;
  }
  // A batch: every line under the schema, sampled.
  test::write_file(dir + "/batch.jsonl", "{\"prompt\": \"Once\", \"temperature\": 1.0, \"seed\": 1}\n{\"prompt\": \"Tom\", \"temperature\": 1.0, \"seed\": 2}\n");
  out = test::run_command(base + "--batch-file " + dir + "/batch.jsonl --json-schema '" + std::string(kFiniteSchema) + "'", &rc);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const json r = json::parse(line);
    EXPECT_EQ(r["finish_reason"], "stop") << line;
    expect_finite_schema_instance(r["text"].get<std::string>());
  }
  EXPECT_EQ(n, 2);
  // Formats, patterns and bounds hold on what a real model writes, sampled.
  for (int seed = 1; seed <= 3; ++seed) {
    const std::string sampled = base + "--temp 1 -s " + std::to_string(seed) + " -p 'Once upon' --json-schema ";
    out = test::run_command(sampled + "'{\"type\": \"string\", \"format\": \"date\"}'", &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_TRUE(std::regex_match(out, std::regex(R"re("\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"\n)re"))) << out;
    out = test::run_command(sampled + "'{\"type\": \"integer\", \"minimum\": -5, \"exclusiveMaximum\": 40}'", &rc);
    ASSERT_EQ(rc, 0) << out;
    const long v = std::stol(out);
    EXPECT_TRUE(v >= -5 && v < 40 && out == std::to_string(v) + "\n") << out;
    out = test::run_command(sampled + "'{\"type\": \"string\", \"pattern\": \"^[A-Z][a-z]+ [0-9]{2}$\"}'", &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_TRUE(std::regex_match(out, std::regex(R"re("[A-Z][a-z]+ [0-9]{2}"\n)re"))) << out;
  }
  struct Bad {
    std::string args, needle;
  };
  for (const Bad& b : std::vector<Bad>{{"--json-schema '{\"type\": \"string\", \"format\": \"color\"}'", "format 'color'"},
                                       {"--json-schema " + dir + "/none.json", "cannot open"},
                                       {"--json --grammar-file " + dir + "/yn.gbnf", "give one"},
                                       {"--grammar-file " + dir + "/schema.json", "schema.json: grammar line 1"}}) {
    out = test::run_command(base + "-p x " + b.args + " 2>&1", &rc);
    EXPECT_NE(rc, 0) << b.args;
    EXPECT_NE(out.find(b.needle), std::string::npos) << b.args << ": " << out;
  }
}

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// Hostile grammars cost bounded time and memory: one that keeps 2^n parses alive is refused once
// more than 1024 are, and repetitions that would build 2M elements are refused at parse time.
TEST(Grammar, AmbiguityAndSizeAreBounded) {
  auto g = Grammar::parse(R"(root ::= "a" root "b" | "a" root "c" | "")");
  GrammarState s = grammar_start(*g);
  int taken = 0;
  while (taken < 40 && grammar_advance(*g, s, 'a')) ++taken;
  EXPECT_GE(taken, 7);   // each 'a' doubles the parses (3 * 2^k stacks after k)
  EXPECT_LE(taken, 10);  // past 1024: refused
  test::expect_error([] { Grammar::parse("root ::= \"" + std::string(200, 'a') + "\"{10000}"); }, {"grows past"});
  EXPECT_NO_THROW(Grammar::parse(R"(root ::= ("a"{10000}){10000})"));  // a group is one rule: 20000 elements
}

// Shapes a hostile request could send: each is refused with a message or matched in bounded
// time and memory, never a crash (the parser, the matcher and the compilers used to recurse
// once per level, so deep nesting overflowed the stack).
TEST(Grammar, DeepAndWideInputsAreRefusedOrBounded) {
  const size_t deep = 100000;
  test::expect_error([&] { Grammar::parse("root ::= " + std::string(deep, '(') + "\"a\"" + std::string(deep, ')')); },
                     {"nested deeper than"});
  // A chain of 100,000 rules, each starting with the next: left-recursion check and expansion.
  std::ostringstream chain;
  for (size_t i = 0; i < deep; ++i) chain << 'r' << i << " ::= r" << i + 1 << " \"b\"\n";
  chain << 'r' << deep << " ::= \"a\"\nroot ::= r0\n";
  auto g = Grammar::parse(chain.str());
  GrammarState s = grammar_start(*g);
  EXPECT_TRUE(grammar_accepts_prefix(*g, s, "abbb"));
  // Rules that fan out into each other: with two levels of 64 alternatives the start builds
  // 64^2 parses and works; with three, 64^3 would be built and the state is given up (dead: the
  // request can only end) rather than let one grammar take the engine's time and memory.
  auto fan_out = [](int levels) {
    std::ostringstream text;
    text << "root ::= l0 \"!\"\n";
    for (int l = 0; l < levels; ++l) {
      std::ostringstream next;
      if (l + 1 < levels) next << 'l' << l + 1;
      else next << "\"x\"";
      text << 'l' << l << " ::= " << next.str();
      for (int i = 1; i < 64; ++i) text << " | " << next.str();
      text << '\n';
    }
    return Grammar::parse(text.str());
  };
  g = fan_out(2);
  s = grammar_start(*g);
  EXPECT_TRUE(grammar_accepts_prefix(*g, s, "x!") && s.complete());
  g = fan_out(3);
  EXPECT_TRUE(grammar_start(*g).dead());
  test::expect_error([&] { pattern_to_gbnf(std::string(2000, '(') + "a" + std::string(2000, ')')); }, {"nested deeper than 100", "..."});
  test::expect_error([&] { pattern_to_gbnf(std::string(deep, '(') + "a" + std::string(deep, ')')); }, {"longer than 4096"});
  std::string schema;
  for (size_t i = 0; i < deep; ++i) schema.append(R"({"type": "array", "items": )");
  schema.append(R"({"type": "string"})");
  schema.append(deep, '}');
  test::expect_error([&] { json_schema_to_gbnf(ojson::parse(schema)); }, {"nested deeper than 128"});
  std::string deep_const = R"({"const": )";
  deep_const.append(deep, '[');
  deep_const.append(deep, ']');
  deep_const.append("}");
  test::expect_error([&] { json_schema_to_gbnf(ojson::parse(deep_const)); }, {"'const' value", "nested deeper than 128"});
  // A type listed twice at each of 40 levels: each type once per node, so linear, not 2^40.
  std::string twice;
  for (int i = 0; i < 40; ++i) twice.append(R"({"type": ["object", "object", "null"], "properties": {"a": )");
  twice.append(R"({"type": "integer"})");
  for (int i = 0; i < 40; ++i) twice.append("}}");
  EXPECT_LT(json_schema_to_gbnf(ojson::parse(twice)).size(), 100000u);
  // 5,000 properties with one long shared prefix: names stay short and distinct, in linear time.
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 5000; ++i) {
    std::string key(100, 'p');
    key.append(std::to_string(i));
    wide["properties"][key] = {{"type", "integer"}};
  }
  const std::string gbnf = json_schema_to_gbnf(wide);
  EXPECT_LT(gbnf.size(), 5000u * 600);
  EXPECT_NO_THROW(Grammar::parse(gbnf));
}

// A byte-level vocabulary (one token per byte, no merges) with gpt-oss's control tokens.
std::unique_ptr<Tokenizer> harmony_bytes_tokenizer() {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
    std::string piece;
    if (cp < 0x80) {
      piece += static_cast<char>(cp);
    } else {  // two bytes of UTF-8 (GPT-2's map stays below U+0800)
      piece += static_cast<char>(0xC0 | (cp >> 6));
      piece += static_cast<char>(0x80 | (cp & 0x3F));
    }
    spec.tokens.push_back(piece);
  }
  for (const char* t : {"<|return|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"}) spec.tokens.push_back(t);
  spec.types.assign(spec.tokens.size(), 1);
  for (size_t i = 256; i < spec.tokens.size(); ++i) spec.types[i] = 3;  // Control
  spec.eos_id = 256;
  spec.add_bos = false;
  return Tokenizer::from_spec(spec);
}

// The gate: every token may come until the reply has spelled <|channel|>final<|message|> (a
// partial match that breaks restarts, one that breaks on the gate's first token restarts there);
// then the grammar applies, and ends the reply when it is complete. Drafts are judged across it.
TEST(TokenConstraint, AGateHoldsTheGrammarBackUntilTheReplySpellsIt) {
  auto tok = harmony_bytes_tokenizer();
  const int32_t ret = 256, start = 257, channel = 258, message = 259, end = 260;
  const std::vector<int32_t> gate = harmony_gate(*tok);
  ASSERT_EQ(gate, (std::vector<int32_t>{channel, 'f', 'i', 'n', 'a', 'l', message}));
  TokenConstraint c(Grammar::parse(R"(root ::= "{\"a\":" [0-9] "}")"), *tok, "json_schema");
  c.set_gate(gate);
  GrammarState s = c.start();
  EXPECT_EQ(s.gate_left, 7u);
  auto allowed = [&](const GrammarState& st, int32_t id) { return (c.allowed(st)[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; };
  auto feed = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) ASSERT_TRUE(c.accept(s, id)) << id;
  };
  auto text = [](const std::string& t) { return std::vector<int32_t>(t.begin(), t.end()); };
  // Before the gate: anything, the control tokens and the end included; never only the end.
  for (int32_t id = 0; id < tok->n_vocab(); ++id) EXPECT_TRUE(allowed(s, id)) << id;
  std::vector<float> row(static_cast<size_t>(tok->n_vocab()) + 3, 0.0f);
  c.mask_logits(s, row.data(), static_cast<int64_t>(row.size()));
  for (size_t i = 0; i < row.size(); ++i) EXPECT_EQ(std::isinf(row[i]), i >= static_cast<size_t>(tok->n_vocab())) << i;
  EXPECT_FALSE(c.only_end(s));
  // The analysis channel, a broken match ("fin" then "x"), then the channel twice in a row.
  feed({channel});
  feed(text("analysis"));
  feed({message});
  feed(text("{not the answer} final"));
  feed({end, start});
  feed(text("assistant"));
  feed({channel});
  feed(text("finx"));
  EXPECT_EQ(s.gate_left, 7u) << "a broken match starts over";
  feed({channel, channel});
  EXPECT_EQ(s.gate_left, 6u) << "the second <|channel|> begins the gate again";
  feed(text("final"));
  EXPECT_EQ(s.gate_left, 1u);
  // A draft across the gate: its last token, then what the grammar allows, then what it does not.
  const std::vector<int32_t> draft = {message, '{', '"', 'x'};
  EXPECT_EQ(c.accepted_prefix(s, draft.data(), 4), 3);
  feed({message});
  EXPECT_EQ(s.gate_left, 0u);
  // The grammar now: '{' and nothing else (no end, no control token).
  EXPECT_TRUE(allowed(s, '{'));
  EXPECT_FALSE(allowed(s, 'x'));
  EXPECT_FALSE(allowed(s, ret));
  EXPECT_FALSE(allowed(s, channel));
  GrammarState t = s;
  EXPECT_FALSE(c.accept(t, 'x'));
  feed(text("{\"a\":7}"));
  EXPECT_TRUE(c.only_end(s));
  EXPECT_TRUE(allowed(s, ret));
  // Without a gate the same constraint starts in the grammar.
  TokenConstraint plain(Grammar::parse(R"(root ::= "{\"a\":" [0-9] "}")"), *tok, "json_schema");
  EXPECT_EQ(plain.start().gate_left, 0u);
  GrammarState p = plain.start();
  EXPECT_FALSE(plain.accept(p, channel));
  // A vocabulary without harmony's control tokens has no gate.
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt-2";
  spec.tokens = {"a", "b", "<|channel|>"};
  spec.types = {1, 1, 1};
  spec.eos_id = 0;
  EXPECT_TRUE(harmony_gate(*Tokenizer::from_spec(spec)).empty()) << "<|channel|> as plain text is no gate";
}

// The engine under a gate: greedy decoding writes what it writes unconstrained up to the gate
// (here three tokens the model was going to write anyway), then the grammar's text, and stops
// when that is complete; a gate the reply never spells leaves the reply as it was.
TEST(Engine, AGatedConstraintLetsTheReplyRunFreeUntilTheGate) {
  FP_REQUIRE_FILE(test::stories_path());
  auto m = load_stories();
  const Tokenizer& tok = *m->tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a dog named", true, false);
  const std::vector<int32_t> plain = greedy(*m, prompt, 24);
  ASSERT_GE(plain.size(), 12u);
  const std::vector<int32_t> gate(plain.begin() + 5, plain.begin() + 8);
  auto gated = [&](std::vector<int32_t> gt) {
    auto c = std::make_shared<TokenConstraint>(Grammar::parse(R"(root ::= " yes!")"), tok, "grammar");
    c->set_gate(std::move(gt));
    EngineConfig cfg;
    cfg.page_size = 16;
    cfg.kv_cache_bytes = 12 << 20;
    cfg.max_model_len = 512;
    Engine e(*m, cfg);
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = 24;
    r.sampling.temperature = 0;
    r.constraint = c;
    const int64_t id = e.add_request(r);
    for (int guard = 0; e.has_work() && guard < 1000; ++guard) e.step();
    const Sequence* sq = e.sequence(id);
    return std::make_pair(std::vector<int32_t>(sq->tokens.begin() + sq->n_prompt, sq->tokens.end()), sq->finish_reason);
  };
  const auto [tokens, finish] = gated(gate);
  ASSERT_GE(tokens.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 8), std::vector<int32_t>(plain.begin(), plain.begin() + 8));
  EXPECT_EQ(tok.decode(tokens), tok.decode(std::vector<int32_t>(plain.begin(), plain.begin() + 8)) + " yes!");
  EXPECT_EQ(finish, "stop");
  const auto [never, never_finish] = gated({tok.n_vocab() - 1, tok.n_vocab() - 2});
  EXPECT_EQ(never, plain);
}

}  // namespace
}  // namespace fp
