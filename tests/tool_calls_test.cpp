// tests/tool_calls_test.cpp — tool calls in free text (tool_choice auto, Hermes format): a reply
// split into text and calls, and the same split while streaming, piece by piece.
#include <gtest/gtest.h>

#include <random>

#include "server/tool_calls.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

TEST(HermesToolCalls, RepliesSplitIntoTextAndCalls) {
  SplitReply r = split_hermes_tool_calls("Sure, let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(r.content, "Sure, let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  // Two calls, no text; arguments left out mean none.
  r = split_hermes_tool_calls("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  // What is not a call stays text: no tags, bad JSON, no name, arguments not an object.
  for (const std::string text : {"just text", "<tool_call>{not json}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                 "<tool_call>{\"name\": \"a\", \"arguments\": \"x\"}</tool_call>"}) {
    r = split_hermes_tool_calls(text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A call cut off before its closing tag still parses when its JSON is whole.
  r = split_hermes_tool_calls("x <tool_call>{\"name\": \"a\", \"arguments\": {\"k\": 1}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "x");
}

TEST(HermesToolCalls, StreamingSendsTextAtOnceAndHoldsCalls) {
  const std::string reply = "I will call it < now <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {  // the reply cut into random pieces
    HermesToolStream s;
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
    const SplitReply split = split_hermes_tool_calls(s.held());
    ASSERT_EQ(split.calls.size(), 1u);
    EXPECT_EQ(split.calls[0].arguments, R"({"x":1})");
  }
  // Text that only looked like the start of a tag goes out once it cannot be one.
  HermesToolStream s;
  EXPECT_EQ(s.push("a <tool"), "a ");
  EXPECT_EQ(s.push("s> b"), "<tools> b");
  EXPECT_EQ(s.held(), "");
}

// Qwen3 writes its tags as added tokens that are not special, so they reach the reply's text.
TEST(HermesToolCalls, Qwen3TagsAreTextInTheReply) {
  const std::string path = test::testdata("tokenizers/qwen3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  auto tok = Tokenizer::from_path(path);
  const std::vector<int32_t> ids = tok->encode("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", false, true);
  ASSERT_EQ(tok->token_to_bytes(ids.front()), "<tool_call>");
  const SplitReply r = split_hermes_tool_calls(tok->decode(ids));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
}

}  // namespace
}  // namespace fp
