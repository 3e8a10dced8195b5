// tests/harmony_test.cpp — gpt-oss's harmony replies apart by channel (server/harmony.h): whole
// replies (thinking, answer, tool calls with the recipient before or after the channel,
// preambles, built-in tools, cut-off replies, replies that ignore the format), the same replies
// cut into random stream pieces (the streamed split must equal the whole one), the tool-call
// split of tool_choice auto, the template detection, and the end-of-generation tokens of a
// harmony vocabulary (<|end|> closes a message, not the reply).
#include <gtest/gtest.h>

#include <random>

#include "server/harmony.h"
#include "server/tool_calls.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

struct HarmonyCase {
  std::string text, reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

const std::vector<HarmonyCase>& cases() {
  static const std::vector<HarmonyCase> cs = {
      {"<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
       "User asks 2+2. Easy.", "It is 4.", {}},
      {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
       "<|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
       "Need weather.", "", {{"get_weather", "{\"city\":\"Paris\"}"}}},
      {" to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}<|call|>", "", "", {{"lookup", "{\"q\": 1}"}}},
      {"<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.f<|channel|>commentary "
       "<|constrain|>json<|message|>{}<|call|>",
       "", "Let me check.", {{"f", "{}"}}},
      {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>"
       "{\"x\":1}<|end|><|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"y\":2}<|call|>",
       "a", "", {{"a", "{\"x\":1}"}, {"b", "{\"y\":2}"}}},
      {"<|channel|>analysis<|message|>search first<|end|><|start|>assistant<|channel|>analysis to=browser.search "
       "<|constrain|>json<|message|>{\"query\":\"x\"}<|call|>",
       "search first\n{\"query\":\"x\"}", "", {}},  // a built-in tool's call is not the user's
      {"<|channel|>analysis<|message|>I will call it.<|end|><|start|>assistant<|channel|>analysis to=functions.get_weather "
       "<|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
       "I will call it.", "", {{"get_weather", "{\"city\":\"Oslo\"}"}}},  // a call on the analysis channel is still a call
      {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>", "a\nb", "", {}},
      {"<|channel|>analysis<|message|>go<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1",
       "go", "{\"x\": 1", {}},  // a call cut off by max_tokens is no call
      {"<|channel|>analysis<|message|>cut off by max_tok", "cut off by max_tok", "", {}},
      {"<|channel|>analysis<|message|>done<|end|><|start|>assistant<|channel|>final<|message|>partial answ", "done", "partial answ", {}},
      {"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan", "x", "", {}},  // cut inside a header
      {"Plain text from a model that ignores harmony.", "", "Plain text from a model that ignores harmony.", {}},
      {"<|channel|>final<|message|>a < b and <|not a marker|> stay<|return|>", "", "a < b and <|not a marker|> stay", {}},
      {"", "", "", {}},
      {"<|channel|>final<|message|>hi<|end|>" + std::string(300, 'z'), "", "hi" + std::string(300, 'z'), {}},  // no header after all
  };
  return cs;
}

void expect_calls(const std::vector<ToolCallText>& got, const HarmonyCase& c) {
  ASSERT_EQ(got.size(), c.calls.size()) << c.text;
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].name, c.calls[k].first) << c.text;
    EXPECT_EQ(got[k].arguments, c.calls[k].second) << c.text;
  }
}

TEST(Harmony, WholeRepliesSplitByChannel) {
  for (const HarmonyCase& c : cases()) {
    const HarmonyReply r = parse_harmony(c.text);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(r.content, c.content) << c.text;
    expect_calls(r.calls, c);
  }
}

TEST(Harmony, StreamedPiecesGiveTheWholeSplit) {
  std::mt19937 rng(7);
  for (const HarmonyCase& c : cases())
    for (int trial = 0; trial < 200; ++trial) {
      HarmonyStream s;
      ReasoningPiece sum;
      for (size_t at = 0; at < c.text.size();) {
        const size_t len = 1 + rng() % 9;
        const ReasoningPiece p = s.push(c.text.substr(at, len));
        sum.reasoning += p.reasoning;
        sum.content += p.content;
        at += len;
      }
      const ReasoningPiece p = s.finish();
      sum.reasoning += p.reasoning;
      sum.content += p.content;
      ASSERT_EQ(sum.reasoning, c.reasoning) << c.text << " (trial " << trial << ")";
      ASSERT_EQ(sum.content, c.content) << c.text << " (trial " << trial << ")";
      expect_calls(s.calls(), c);
    }
}

TEST(Harmony, MarkersAreNotSentBeforeTheyAreDecided) {
  HarmonyStream s;
  EXPECT_EQ(s.push("<|channel|>final<|message|>Hi <|").content, "Hi ");
  EXPECT_EQ(s.push("ret").content, "");
  const ReasoningPiece p = s.push("urn|>");
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(s.finish().content, "");
}

TEST(Harmony, ToolChoiceAutoSplitsTheCalls) {
  const std::string tmpl = "{{ '<|start|>assistant<|channel|>final<|message|>' }}";
  EXPECT_TRUE(template_is_harmony(tmpl));
  EXPECT_FALSE(template_is_harmony("<|im_start|>assistant<think>"));
  EXPECT_EQ(tool_call_format_of(tmpl), ToolCallFormat::Harmony);
  const SplitReply r = split_tool_calls(ToolCallFormat::Harmony, cases()[3].text);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
}

// A byte-level vocabulary with gpt-oss's control tokens: <|return|> and <|call|> end a reply,
// <|end|> (which closes the thinking before the answer) does not; in other vocabularies <|end|>
// still ends one (Phi-3's).
TEST(Harmony, EndOfGenerationTokensOfAHarmonyVocabulary) {
  auto make = [](std::vector<std::string> specials) {
    TokenizerSpec s;
    s.model = "gpt2";
    s.pre = "gpt-2";
    for (int b = 0; b < 256; ++b) {
      std::string piece = "t";  // (not "x" + std::to_string(b): GCC 12's -Wrestrict false positive)
      piece.append(std::to_string(b));
      s.tokens.push_back(piece);
    }
    for (auto& t : specials) s.tokens.push_back(t);
    s.types.assign(s.tokens.size(), 1);
    for (size_t i = 256; i < s.tokens.size(); ++i) s.types[i] = 3;  // Control
    s.eos_id = 256;
    s.add_bos = false;
    return Tokenizer::from_spec(s);
  };
  auto harmony = make({"<|return|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"});
  EXPECT_TRUE(harmony->is_eog(256));  // <|return|>
  EXPECT_TRUE(harmony->is_eog(261));  // <|call|>
  EXPECT_FALSE(harmony->is_eog(260)) << "<|end|> closes a harmony message, not the reply";
  auto other = make({"<|endoftext|>", "<|end|>"});
  EXPECT_TRUE(other->is_eog(257)) << "<|end|> ends a reply where there is no harmony";
}

}  // namespace
}  // namespace fp
