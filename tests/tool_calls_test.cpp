// tests/tool_calls_test.cpp — tool calls in free text (tool_choice auto; Hermes, Llama-3 JSON,
// DeepSeek-V3, GLM-4.5, Qwen3-Coder XML and Mistral formats): a reply split into text and calls, and the same split while
// streaming, piece by piece.
#include <gtest/gtest.h>

#include <random>

#include "server/tool_calls.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

TEST(HermesToolCalls, RepliesSplitIntoTextAndCalls) {
  SplitReply r = split_tool_calls(ToolCallFormat::Hermes, "Sure, let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(r.content, "Sure, let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  // Two calls, no text; arguments left out mean none.
  r = split_tool_calls(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  // What is not a call stays text: no tags, bad JSON, no name, arguments not an object.
  for (const std::string text : {"just text", "<tool_call>{not json}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                 "<tool_call>{\"name\": \"a\", \"arguments\": \"x\"}</tool_call>"}) {
    r = split_tool_calls(ToolCallFormat::Hermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A call cut off before its closing tag still parses when its JSON is whole.
  r = split_tool_calls(ToolCallFormat::Hermes, "x <tool_call>{\"name\": \"a\", \"arguments\": {\"k\": 1}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "x");
}

TEST(HermesToolCalls, StreamingSendsTextAtOnceAndHoldsCalls) {
  const std::string reply = "I will call it < now <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {  // the reply cut into random pieces
    ToolCallStream s(ToolCallFormat::Hermes);
    std::string sent;
    for (size_t at = 0; at < reply.size();) {
      const size_t n = 1 + rng() % 6;
      sent += s.push(reply.substr(at, n));
      at += n;
      // Nothing of the call goes out; before the tag, only what may start it is held.
      ASSERT_EQ(sent.find('{'), std::string::npos) << sent;
      if (at <= 21) {
        ASSERT_EQ(sent + s.held(), reply.substr(0, at));
        ASSERT_LE(s.held().size(), 10u) << "held '" << s.held() << "'";
      }
    }
    EXPECT_EQ(sent, "I will call it < now ");
    EXPECT_EQ(sent + s.held(), reply);
    const SplitReply split = split_tool_calls(ToolCallFormat::Hermes, s.held());
    ASSERT_EQ(split.calls.size(), 1u);
    EXPECT_EQ(split.calls[0].arguments, R"({"x":1})");
  }
  // Text that only looked like the start of a tag goes out once it cannot be one.
  ToolCallStream s(ToolCallFormat::Hermes);
  EXPECT_EQ(s.push("a <tool"), "a ");
  EXPECT_EQ(s.push("s> b"), "<tools> b");
  EXPECT_EQ(s.held(), "");
}

TEST(Llama3JsonToolCalls, AReplyThatIsJsonCallsIsCalls) {
  SplitReply r = split_tool_calls(ToolCallFormat::Llama3Json, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b}\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"a;b}"})");
  EXPECT_EQ(r.content, "");
  r = split_tool_calls(ToolCallFormat::Llama3Json, R"({"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": [1]}})");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, R"({"x":[1]})");
  // Text, or JSON that is not calls, stays text.
  for (const std::string text : {"It is sunny.", R"({"weather": "sunny"})", R"({"name": "a", "parameters": {}}; oops)", "{broken"}) {
    r = split_tool_calls(ToolCallFormat::Llama3Json, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // Streaming: a reply that starts with '{' is held whole; any other goes out as it comes.
  ToolCallStream s(ToolCallFormat::Llama3Json);
  EXPECT_EQ(s.push("  "), "");
  EXPECT_EQ(s.push("{\"na"), "");
  EXPECT_EQ(s.push("me\": \"f\"}"), "");
  EXPECT_EQ(split_tool_calls(ToolCallFormat::Llama3Json, s.held()).calls.size(), 1u);
  ToolCallStream t(ToolCallFormat::Llama3Json);
  EXPECT_EQ(t.push("\n"), "");
  EXPECT_EQ(t.push("It {is}"), "\nIt {is}");
  EXPECT_EQ(t.push(" sunny"), " sunny");
  EXPECT_EQ(t.held(), "");
}

TEST(ToolCallFormats, ChosenFromTheChatTemplate) {
  EXPECT_EQ(tool_call_format_of("{{- '<tool_call>\\n' }}"), ToolCallFormat::Hermes);
  EXPECT_EQ(tool_call_format_of("{{- '<|python_tag|>' + tool_call.name }}"), ToolCallFormat::Llama3Json);
  EXPECT_EQ(tool_call_format_of("{{ messages[0]['content'] }}"), ToolCallFormat::None);
  const std::string qwen3 = test::testdata("tokenizers/qwen3/tokenizer_config.json");
  if (file_exists(qwen3)) {
    EXPECT_EQ(tool_call_format_of(ChatTemplate::from_tokenizer_config(qwen3).source()), ToolCallFormat::Hermes);
  }
}

TEST(DeepSeekV3ToolCalls, CallsBetweenTheirTokensAreCalls) {
  const std::string reply =
      "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>play\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  SplitReply r = split_tool_calls(ToolCallFormat::DeepSeekV3, reply);
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(r.calls[1].name, "play");
  // A call whose arguments do not parse leaves the whole reply as text.
  const std::string bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{oops\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  r = split_tool_calls(ToolCallFormat::DeepSeekV3, bad);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, bad);
  // Streaming holds from the opening token on, even when it arrives in pieces.
  ToolCallStream s(ToolCallFormat::DeepSeekV3);
  std::string sent;
  for (size_t at = 0; at < reply.size(); at += 5) sent += s.push(reply.substr(at, 5));
  EXPECT_EQ(sent, "Let me look.");
  EXPECT_EQ(split_tool_calls(ToolCallFormat::DeepSeekV3, s.held()).calls.size(), 2u);
  // The real DeepSeek-V3 template writes these tokens, and its tokenizer keeps them as text.
  const std::string cfg = test::testdata("tokenizers/deepseek_v3/tokenizer_config.json");
  if (file_exists(cfg)) {
    EXPECT_EQ(tool_call_format_of(ChatTemplate::from_tokenizer_config(cfg).source()), ToolCallFormat::DeepSeekV3);
    auto tok = Tokenizer::from_path(test::testdata("tokenizers/deepseek_v3/tokenizer.json"));
    EXPECT_EQ(split_tool_calls(ToolCallFormat::DeepSeekV3, tok->decode(tok->encode(reply, false, true))).calls.size(), 2u);
  }
}

// Qwen3 writes its tags as added tokens that are not special, so they reach the reply's text.
TEST(HermesToolCalls, Qwen3TagsAreTextInTheReply) {
  const std::string path = test::testdata("tokenizers/qwen3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  auto tok = Tokenizer::from_path(path);
  const std::vector<int32_t> ids = tok->encode("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", false, true);
  ASSERT_EQ(tok->token_to_bytes(ids.front()), "<tool_call>");
  const SplitReply r = split_tool_calls(ToolCallFormat::Hermes, tok->decode(ids));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
}

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// GLM-4.5's calls: the name, then key/value pairs in tags; values typed by the tool's schema.
TEST(Glm45ToolCalls, PairsBecomeTypedArguments) {
  EXPECT_EQ(tool_call_format_of("{{ '<tool_call>' + tc.name }}{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>"),
            ToolCallFormat::Glm45);
  const nlohmann::json tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"},
      "unit": {"enum": ["c", "f"]}, "note": {"type": ["string", "null"]},
      "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}])");
  const std::string reply =
      "Let me look.\n<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>code</arg_key><arg_value>42</arg_value>\n"
      "<arg_key>unit</arg_key><arg_value>true</arg_value><arg_key>note</arg_key><arg_value> two\nlines </arg_value>\n"
      "<arg_key>opts</arg_key><arg_value>{\"a\": [1, 2]}</arg_value><arg_key>tag</arg_key><arg_value>7</arg_value>\n</tool_call>\n"
      "<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call> done";
  SplitReply split = split_tool_calls(ToolCallFormat::Glm45, reply, tools);
  ASSERT_EQ(split.calls.size(), 2u) << split.content;
  EXPECT_EQ(split.calls[0].name, "weather");
  // Declared strings stay as written ("42", "true", blanks kept); the rest is JSON where it parses.
  EXPECT_EQ(split.calls[0].arguments, R"({"city":"Paris","days":3,"code":"42","unit":"true","note":" two\nlines ","opts":{"a":[1,2]},"tag":"7"})");
  EXPECT_EQ(split.calls[1].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(split.content, "Let me look.\n\n done");
  // Without the tools, values that parse as JSON are JSON.
  split = split_tool_calls(ToolCallFormat::Glm45, "<tool_call>f<arg_key>n</arg_key><arg_value>42</arg_value></tool_call>");
  ASSERT_EQ(split.calls.size(), 1u);
  EXPECT_EQ(split.calls[0].arguments, R"({"n":42})");
  split = split_tool_calls(ToolCallFormat::Glm45, "<tool_call>ping</tool_call>");
  ASSERT_EQ(split.calls.size(), 1u);
  EXPECT_EQ(split.calls[0].arguments, "{}");
  // What is not a well-formed call stays text, whole.
  for (const std::string bad : {"<tool_call>f<arg_key>n</arg_key><arg_value>1</tool_call>",
                                "<tool_call>f<arg_key>n</arg_key>junk<arg_value>1</arg_value></tool_call>",
                                "<tool_call>f<arg_key>n</arg_key><arg_value>1</arg_value>junk</tool_call>",
                                "<tool_call><arg_key>n</arg_key><arg_value>1</arg_value></tool_call>",
                                "<tool_call>two words</tool_call>", "<tool_call>f<arg_key>n</arg_key><arg_value>1</arg_value>"}) {
    split = split_tool_calls(ToolCallFormat::Glm45, "a " + bad, tools);
    EXPECT_TRUE(split.calls.empty()) << bad;
    EXPECT_EQ(split.content, "a " + bad);
  }
  // Streamed: text at once, the call held from its tag.
  ToolCallStream s(ToolCallFormat::Glm45);
  std::string sent;
  for (size_t at = 0; at < reply.size(); at += 5) sent += s.push(reply.substr(at, 5));
  EXPECT_EQ(sent, "Let me look.\n");
  EXPECT_EQ(split_tool_calls(ToolCallFormat::Glm45, s.held(), tools).calls.size(), 2u);
}

// Qwen3-Coder's calls: <function=NAME> and multi-line <parameter=KEY> blocks; values typed by
// the tool's schema (strings as written, less the newline at each end).
TEST(Qwen3CoderToolCalls, FunctionBlocksBecomeTypedArguments) {
  EXPECT_EQ(tool_call_format_of("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{%- for args_name, args_value in "
                                "tool_call.arguments|items %}{{- '<parameter=' + args_name + '>\\n' }}"),
            ToolCallFormat::Qwen3CoderXml);
  EXPECT_STREQ(to_string(ToolCallFormat::Qwen3CoderXml), "qwen3_coder");
  const nlohmann::json tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "write_file", "parameters": {
      "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"},
      "append": {"type": "boolean"}, "tags": {"type": "array"}}}}}])");
  const std::string reply =
      "I'll write it.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
      "<parameter=content>\ndef f():\n    return 42\n\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
      "<parameter=append>\nfalse\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=write_file>\n<parameter=path>\n42\n</parameter>\n</function>\n</tool_call>";
  SplitReply split = split_tool_calls(ToolCallFormat::Qwen3CoderXml, reply, tools);
  ASSERT_EQ(split.calls.size(), 2u) << split.content;
  EXPECT_EQ(split.content, "I'll write it.");
  EXPECT_EQ(split.calls[0].name, "write_file");
  // The code keeps its own indentation and its trailing blank line; one newline comes off each end.
  EXPECT_EQ(split.calls[0].arguments,
            R"({"path":"/tmp/a.py","content":"def f():\n    return 42\n","mode":420,"append":false,"tags":["a","b"]})");
  EXPECT_EQ(split.calls[1].arguments, R"({"path":"42"})") << "a declared string stays a string";
  // Without the tools, values that parse as JSON are JSON; a call without parameters has none.
  split = split_tool_calls(ToolCallFormat::Qwen3CoderXml, "<tool_call><function=f><parameter=n>7</parameter><parameter=s>hi there</parameter></function></tool_call>");
  ASSERT_EQ(split.calls.size(), 1u);
  EXPECT_EQ(split.calls[0].arguments, R"({"n":7,"s":"hi there"})");
  split = split_tool_calls(ToolCallFormat::Qwen3CoderXml, "<tool_call>\n<function=list_files>\n</function>\n</tool_call>");
  ASSERT_EQ(split.calls.size(), 1u);
  EXPECT_EQ(split.calls[0].arguments, "{}");
  // A reply cut short (max_tokens): the open parameter ends the call, as far as it got.
  split = split_tool_calls(ToolCallFormat::Qwen3CoderXml, "x <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\npart");
  ASSERT_EQ(split.calls.size(), 1u);
  EXPECT_EQ(split.calls[0].arguments, R"({"a":1,"b":"part"})");
  EXPECT_EQ(split.content, "x");
  // What is not a call stays text, whole: no function, a bad name, text between the blocks or after them.
  for (const std::string bad : {"<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call><function=two words></function></tool_call>",
                                "<tool_call><function=f>junk<parameter=a>1</parameter></function></tool_call>",
                                "<tool_call><function=f><parameter=a>1</parameter></function>junk</tool_call>",
                                "<tool_call><function=f><parameter=>1</parameter></function></tool_call>"}) {
    split = split_tool_calls(ToolCallFormat::Qwen3CoderXml, "a " + bad, tools);
    EXPECT_TRUE(split.calls.empty()) << bad;
    EXPECT_EQ(split.content, "a " + bad);
  }
  // Streamed: text at once, the calls held from the first tag.
  ToolCallStream s(ToolCallFormat::Qwen3CoderXml);
  std::string sent;
  for (size_t at = 0; at < reply.size(); at += 3) sent += s.push(reply.substr(at, 3));
  EXPECT_EQ(sent, "I'll write it.\n\n");
  EXPECT_EQ(split_tool_calls(ToolCallFormat::Qwen3CoderXml, s.held(), tools).calls.size(), 2u);
  // Hermes' own template (a JSON object per call) is not taken for this one.
  EXPECT_EQ(tool_call_format_of("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"),
            ToolCallFormat::Hermes);
}

// Mistral's calls after its [TOOL_CALLS] control token: a JSON array (7B v0.3, Nemo, Small 3.1)
// or NAME[ARGS]{...} per marker (the v11+ tokenizers), content before them.
TEST(MistralToolCalls, BothFormsAfterTheMarkerAreCalls) {
  EXPECT_EQ(tool_call_format_of("{%- if message.tool_calls %}{{- \"[TOOL_CALLS] [\" }}{%- for tool_call in message.tool_calls %}"),
            ToolCallFormat::Mistral);
  EXPECT_STREQ(to_string(ToolCallFormat::Mistral), "mistral");
  // The array form, with a space after the marker (v0.3) and without (Nemo), one or two calls.
  SplitReply r = split_tool_calls(ToolCallFormat::Mistral,
                                  "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","days":2})");
  r = split_tool_calls(ToolCallFormat::Mistral,
                       "Checking both.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcdefghi\"}, "
                       "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, \\\"]\\\"]}\"}]");
  EXPECT_EQ(r.content, "Checking both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, R"({"x":[1,"]"]})") << "arguments written as a JSON string holding an object";
  // The v11 form: a marker per call, the name, [ARGS] and the object (an optional [CALL_ID] first).
  r = split_tool_calls(ToolCallFormat::Mistral,
                       "Let me look.\n[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\", \"note\": \"a } in text\"}"
                       "[TOOL_CALLS]search[CALL_ID]k3x9[ARGS] {\"q\": [\"x\"]}\n");
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo","note":"a } in text"})");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, R"({"q":["x"]})");
  // What is not a call leaves the whole reply as text.
  for (const std::string bad : {"no calls here", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}",
                                "[TOOL_CALLS][]", "[TOOL_CALLS][{\"arguments\": {}}]", "[TOOL_CALLS]two words[ARGS]{}",
                                "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f{}", "[TOOL_CALLS]f[ARGS]{} and then text",
                                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": \"not json\"}]"}) {
    r = split_tool_calls(ToolCallFormat::Mistral, "a " + bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
    EXPECT_EQ(r.content, "a " + bad);
  }
  // Streamed: the text before the marker goes out at once, the calls are held.
  const std::string reply = "On it. [TOOL_CALLS]f[ARGS]{\"k\": 1}";
  ToolCallStream s(ToolCallFormat::Mistral);
  std::string sent;
  for (size_t at = 0; at < reply.size(); at += 2) sent += s.push(reply.substr(at, 2));
  EXPECT_EQ(sent, "On it. ");
  EXPECT_EQ(split_tool_calls(ToolCallFormat::Mistral, s.held()).calls.size(), 1u);
}

}  // namespace
}  // namespace fp
