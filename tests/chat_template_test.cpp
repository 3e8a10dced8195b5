// tests/chat_template_test.cpp — the Jinja interpreter and chat templates against Python's jinja2:
// tests/golden/chat/*.json were rendered by jinja2 configured as transformers configures it
// (scripts/make_chat_golden.py); the real templates are read from the test data. Plus the limits:
// errors name line and column, deep nesting, runaway loops and recursion end in fp::Error.
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

namespace fp {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kGoldenDir = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/chat/";

ojson load_golden(const std::string& name) { return ojson::parse(test::read_file(kGoldenDir + name)); }

std::string render(const std::string& src, const ojson& vars = ojson::object(), const jinja::RenderLimits& lim = {}) {
  return jinja::Template(src, "t").render(vars, lim);
}

// ---- the interpreter, feature by feature (expected values from jinja2) ----

TEST(JinjaGolden, UnitCasesMatchJinja2) {
  const ojson golden = load_golden("unit.json");
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string src = c["template"].get<std::string>();
    if (c.contains("expected")) {
      try {
        EXPECT_EQ(render(src, c["vars"]), c["expected"].get<std::string>());
      } catch (const Error& e) {
        ADD_FAILURE() << "threw: " << e.what();
      }
    } else {
      EXPECT_THROW(render(src, c["vars"]), Error) << "jinja2 raised " << c["error"].get<std::string>();
    }
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(Jinja, ErrorsNameTemplateLineAndColumn) {
  test::expect_error([] { render("line one\n{% if true %}\n  {{ 1 + }}\n{% endif %}"); }, {"t:3:", "unexpected end of print statement"});
  test::expect_error([] { render("{% for m in messages %}\nx"); }, {"t:2:", "endfor", "'for' (line 1)"});
  test::expect_error([] { render("ok\n{{ 'never closed }}"); }, {"t:2:4", "unterminated string"});
  test::expect_error([] { render("{# no end"); }, {"t:1:1", "comment"});
  test::expect_error([] { render("a\n  {{ x|no_such_filter }}"); }, {"t:2:", "no filter named 'no_such_filter'"});
  test::expect_error([] { render("{% frobnicate %}"); }, {"t:1:", "frobnicate"});
  test::expect_error([] { render("{{ missing.attr }}"); }, {"'missing' is undefined"});
  test::expect_error([] { render("{{ [1, 2) }}"); }, {"unexpected ')'"});
}

TEST(Jinja, RaiseExceptionCarriesTheMessage) {
  test::expect_error(
      [] {
        render("{% for m in messages %}{% if m.role == 'bot' %}{{ raise_exception('Only user and assistant roles are "
               "supported!') }}{% endif %}{% endfor %}",
               {{"messages", ojson::array({{{"role", "bot"}, {"content", "x"}}})}});
      },
      {"Only user and assistant roles are supported!", "t:1:"});
}

TEST(Jinja, DeepNestingIsBounded) {
  const std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  test::expect_error([&] { render(parens); }, {"nested too deeply"});
  std::string blocks;
  for (int k = 0; k < 20000; ++k) blocks += "{% if true %}";
  test::expect_error([&] { render(blocks); }, {"nested too deeply"});
  std::string chain = "{{ 1";
  for (int k = 0; k < 100000; ++k) chain += " + 1";
  test::expect_error([&] { render(chain + " }}"); }, {"nested too deeply"});
  test::expect_error([] { render("{{ " + std::string(50000, '-') + "1 }}"); }, {"nested too deeply"});
  std::string nots = "{{ ";
  for (int k = 0; k < 50000; ++k) nots += "not ";
  test::expect_error([&] { render(nots + "1 }}"); }, {"nested too deeply"});
  test::expect_error([] { render("{{ " + std::string(50000, '[') + " }}"); }, {});
  // Deeply nested data (a hostile request body) cannot overflow the stack either.
  const ojson deep = ojson::parse(std::string(2000, '[') + "1" + std::string(2000, ']'));
  test::expect_error([&] { render("{{ x|tojson }}", {{"x", deep}}); }, {"nested deeper"});
  // Modest nesting still works.
  EXPECT_EQ(render("{{ " + std::string(40, '(') + "7" + std::string(40, ')') + " }}"), "7");
}

TEST(Jinja, RunawayTemplatesHitTheLimits) {
  jinja::RenderLimits lim;
  lim.max_output_bytes = 1 << 20;
  test::expect_error([&] { render("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", ojson::object(), lim); },
               {"output exceeds"});
  lim.max_steps = 200'000;
  test::expect_error([&] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                            ojson::object(), lim); },
               {"work limit"});
  test::expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, {"macro calls nested deeper"});
  test::expect_error([] { render("{{ 'x' * 100000000000 }}"); }, {"too long"});
  test::expect_error([] { render("{{ 2 ** 100 }}"); }, {"overflow"});
  test::expect_error([] { render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"); },
               {"too long"});
}

TEST(Jinja, StrftimeNowFormatsTheLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  const std::string year = std::to_string(tm.tm_year + 1900);
  const std::string got = render("{{ strftime_now('%Y') }}");
  EXPECT_TRUE(got == year || got == std::to_string(tm.tm_year + 1901)) << got;  // a new year may begin meanwhile
}

TEST(Jinja, TemplatesAreReusableAndThreadSafeToRender) {
  const jinja::Template t("{% set ns = namespace(n=0) %}{% for m in messages %}{{ m.content }};"
                          "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                          "t");
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(t.render({{"messages", ojson::array({{{"content", std::to_string(k)}}})}}), std::to_string(k) + ";1");
  EXPECT_THROW(t.render(ojson::array()), Error);  // variables must be an object
  // One parsed template rendered from several threads at once (the server's case).
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (size_t k = 0; k < outs.size(); ++k)
    threads.emplace_back([&, k] {
      ojson msgs = ojson::array();
      for (size_t j = 0; j <= k; ++j) msgs.push_back({{"content", std::to_string(j)}});
      for (int rep = 0; rep < 200; ++rep) outs[k] = t.render({{"messages", msgs}});
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(outs[0], "0;1");
  EXPECT_EQ(outs[3], "0;1;2;3;4");
}

// Every prefix and many byte-mutated copies of the real templates: each renders or throws
// fp::Error; none crashes or hangs.
TEST(Jinja, MangledRealTemplatesNeverCrash) {
  std::vector<std::string> sources;
  for (const char* tok : {"llama3", "qwen3", "deepseek_v3"}) {
    const std::string path = test::testdata(std::string("tokenizers/") + tok + "/tokenizer_config.json");
    if (file_exists(path)) sources.push_back(ojson::parse(test::read_file(path))["chat_template"].get<std::string>());
  }
  if (sources.empty()) GTEST_SKIP() << "test data missing: " << test::testdata("tokenizers");
  const ojson vars = {{"messages", ojson::array({{{"role", "system"}, {"content", "s"}},
                                                 {{"role", "user"}, {"content", "u"}}})},
                      {"add_generation_prompt", true},
                      {"bos_token", "<s>"}};
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+()[]'\".|~ \n";
  int rendered = 0, failed = 0;
  for (const auto& src : sources) {
    std::vector<std::string> variants;
    for (size_t cut = 0; cut < src.size(); cut += 13) variants.push_back(src.substr(0, cut));
    for (int k = 0; k < 300; ++k) {
      std::string m = src;
      for (int e = 0; e < 3; ++e) m[rng() % m.size()] = alphabet[rng() % alphabet.size()];
      variants.push_back(std::move(m));
    }
    for (const auto& v : variants) {
      try {
        render(v, vars);
        ++rendered;
      } catch (const Error&) {
        ++failed;
      }
    }
  }
  EXPECT_GT(rendered, 0);
  EXPECT_GT(failed, 0);
}

// ---- real chat templates against jinja2 ----

void expect_matches_golden(const std::string& tokenizer) {
  const ojson golden = load_golden(tokenizer + ".json");
  const std::string cfg = test::testdata(golden["config"].get<std::string>());
  FP_REQUIRE_FILE(cfg);
  const ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(cfg);
  ASSERT_FALSE(tmpl.is_fallback());
  EXPECT_EQ(tmpl.special_tokens(), golden["special_tokens"]);
  int matched = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(tokenizer + " / " + name);
    const ojson extra = c.contains("extra") ? c["extra"] : ojson::object();
    const bool gen = c["add_generation_prompt"].get<bool>();
    if (c.contains("error")) {
      EXPECT_THROW(tmpl.render(c["messages"], gen, extra), Error) << "jinja2 raised " << c["error"].get<std::string>();
      continue;
    }
    try {
      const std::string got = tmpl.render(c["messages"], gen, extra);
      EXPECT_EQ(got, c["expected"].get<std::string>());
      matched += got == c["expected"].get<std::string>();
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
  std::printf("%s: %d renderings equal jinja2's\n", tokenizer.c_str(), matched);
}

TEST(ChatTemplate, Llama3MatchesJinja2) { expect_matches_golden("llama3"); }
TEST(ChatTemplate, Qwen3MatchesJinja2) { expect_matches_golden("qwen3"); }
TEST(ChatTemplate, DeepSeekV3MatchesJinja2) { expect_matches_golden("deepseek_v3"); }

// gpt-oss's harmony template (tests/golden/chat/gpt_oss.jinja, the model's own): system and
// developer messages, reasoning effort, the `thinking` field, tool calls and results, and the
// errors it raises. It prints today's date, which the golden fixed: that date becomes today's.
TEST(ChatTemplate, GptOssHarmonyMatchesJinja2) {
  const ojson golden = load_golden("gpt_oss.json");
  const ChatTemplate tmpl(test::read_file(kGoldenDir + golden["template"].get<std::string>()), golden["special_tokens"],
                          "gpt_oss.jinja");
  char today[16];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof today, "%Y-%m-%d", &local);
  const std::string fixed = "Current date: " + golden["date"].get<std::string>(), real = std::string("Current date: ") + today;
  int matched = 0, raised = 0;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ojson extra = c.contains("extra") ? c["extra"] : ojson::object();
    const bool gen = c["add_generation_prompt"].get<bool>();
    if (c.contains("error")) {
      EXPECT_THROW(tmpl.render(c["messages"], gen, extra), Error) << "jinja2 raised " << c["error"].get<std::string>();
      ++raised;
      continue;
    }
    std::string want = c["expected"].get<std::string>();
    for (size_t at = want.find(fixed); at != std::string::npos; at = want.find(fixed, at + real.size()))
      want.replace(at, fixed.size(), real);
    try {
      const std::string got = tmpl.render(c["messages"], gen, extra);
      EXPECT_EQ(got, want);
      matched += got == want;
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
  EXPECT_GE(matched, 30);
  EXPECT_GE(raised, 1);
}

TEST(ChatTemplate, RenderChatWithExplicitTokens) {
  const std::string cfg = test::testdata("tokenizers/llama3/tokenizer_config.json");
  FP_REQUIRE_FILE(cfg);
  const std::string src = ojson::parse(test::read_file(cfg))["chat_template"].get<std::string>();
  const ojson msgs = to_json({{"user", " hi ", ojson::object()}});
  EXPECT_EQ(render_chat(src, msgs, true, "<|begin_of_text|>", "<|end_of_text|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, FromPathFindsTheTemplate) {
  const std::string dir = test::testdata("tokenizers/qwen3");
  FP_REQUIRE_FILE(dir + "/tokenizer_config.json");
  for (const std::string& p : {dir, dir + "/tokenizer_config.json", dir + "/tokenizer.json"}) {
    const ChatTemplate t = ChatTemplate::from_path(p);
    EXPECT_FALSE(t.is_fallback()) << p;
    EXPECT_EQ(t.special_tokens().value("eos_token", ""), "<|im_end|>");
    EXPECT_FALSE(t.special_tokens().contains("bos_token"));  // null in the config: left undefined
  }
}

TEST(ChatTemplate, NamedTemplatesAndChatTemplateJinja) {
  const std::string dir = test::temp_dir("chat_named");
  ojson cfg = {{"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
               {"eos_token", "<E>"},
               {"chat_template", ojson::array({{{"name", "tool_use"}, {"template", "TOOLS"}},
                                               {{"name", "default"}, {"template", "{{ bos_token }}D{{ eos_token }}"}}})}};
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
  EXPECT_EQ(ChatTemplate::from_path(dir).render(ojson::array(), false), "<B>D<E>");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json", "tool_use").render(ojson::array(), true),
            "TOOLS");
  test::expect_error([&] { ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json", "nope"); },
               {"no chat template named 'nope'", "tool_use, default"});
  // transformers' newer layout: chat_template.jinja beside the config wins.
  std::ofstream(dir + "/chat_template.jinja") << "J{{ messages|length }}{{ eos_token }}\n";
  EXPECT_EQ(ChatTemplate::from_path(dir).render(ojson::array({1, 2}), false), "J2<E>");
}

TEST(ChatTemplate, GgufMetadataTemplate) {
  const std::string dir = test::temp_dir("chat_gguf");
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_string("tokenizer.chat_template",
               "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
               "{% if add_generation_prompt %}[assistant]{% endif %}");
  w.write(dir + "/m.gguf");
  const ChatTemplate t = ChatTemplate::from_path(dir + "/m.gguf");
  ASSERT_FALSE(t.is_fallback());
  EXPECT_EQ(t.render(to_json({{"user", "hi", ojson::object()}}), true), "<s>[user] hi</s>[assistant]");
}

TEST(ChatTemplate, PlainFallbackWithoutTemplate) {
  const std::string model = default_model_path();
  FP_REQUIRE_FILE(model);
  const ChatTemplate t = ChatTemplate::from_path(model);  // stories260K carries no chat template
  EXPECT_TRUE(t.is_fallback());
  const ojson msgs = ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", ojson::array({{{"type", "text"}, {"text", "Hi"}}})}},
                                   {{"role", "assistant"}, {"content", nullptr}}});
  EXPECT_EQ(t.render(msgs, true), "system: Be brief.\nuser: Hi\nassistant: \nassistant: ");
  EXPECT_EQ(render_plain_chat(msgs, false), "system: Be brief.\nuser: Hi\nassistant: \n");
}

}  // namespace
}  // namespace fp
