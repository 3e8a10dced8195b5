// tests/reasoning_test.cpp — a reply's <think> block apart from its answer: whole replies, the
// same replies cut into random pieces (the streamed split must equal the whole one), the prompt
// that opens the block (DeepSeek-R1), and the real Qwen3 and DeepSeek-V3 templates.
#include <gtest/gtest.h>

#include <random>

#include "engine/grammar.h"
#include "server/reasoning.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace fp {
namespace {

TEST(Reasoning, WholeRepliesSplitAtTheirThinkBlock) {
  struct Case {
    std::string text;
    bool inside;
    std::string reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>\nLet me see.\n</think>\n\nIt is 4.", false, "\nLet me see.\n", "It is 4."},
      {"  <think>a</think>b", false, "a", "b"},
      {"No block here.", false, "", "No block here."},
      {"\n\nPlain, after blanks", false, "", "\n\nPlain, after blanks"},
      {"x <think>not at the start</think> y", false, "", "x <think>not at the start</think> y"},
      {"<think>cut off by max_tokens", false, "cut off by max_tokens", ""},
      {"<think>cut in the tag </thi", false, "cut in the tag </thi", ""},
      {"Opened by the prompt.</think>The answer.", true, "Opened by the prompt.", "The answer."},
      {"</think>\n\n", true, "", ""},
      {"<thin", false, "", "<thin"},  // ends before it could be the tag: text
      {"<think></think>", false, "", ""},
  };
  for (const Case& c : cases) {
    const ReasoningPiece p = ReasoningSplitter::split(c.text, c.inside);
    EXPECT_EQ(p.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(p.content, c.content) << c.text;
  }
}

TEST(Reasoning, StreamedPiecesSplitAsTheWholeReply) {
  const std::vector<std::pair<std::string, bool>> replies = {
      {"<think>\nStep 1: < is not a tag. </thinking> neither.\n</think>\n\nAnswer: <b>4</b>.", false},
      {"Thinking from the prompt on </ still </think>done", true},
      {"  plain <think> text", false},
  };
  std::mt19937 rng(5);
  for (const auto& [text, inside] : replies) {
    const ReasoningPiece whole = ReasoningSplitter::split(text, inside);
    for (int trial = 0; trial < 300; ++trial) {
      ReasoningSplitter s(inside);
      ReasoningPiece got;
      for (size_t at = 0; at < text.size();) {
        const size_t n = 1 + rng() % 7;
        const ReasoningPiece p = s.push(text.substr(at, n));
        // Nothing of a tag ever goes out.
        EXPECT_EQ(p.reasoning.find("</think>"), std::string::npos) << text;
        got.reasoning += p.reasoning;
        got.content += p.content;
        at += n;
      }
      const ReasoningPiece rest = s.finish();
      ASSERT_EQ(got.reasoning + rest.reasoning, whole.reasoning) << text;
      ASSERT_EQ(got.content + rest.content, whole.content) << text;
    }
  }
}

TEST(Reasoning, TemplatesThatThinkAndPromptsThatOpenTheBlock) {
  EXPECT_TRUE(template_thinks("{{ '<think>\\n' + reasoning + '\\n</think>' }}"));
  EXPECT_FALSE(template_thinks("{{ messages[0]['content'] }}"));
  EXPECT_TRUE(prompt_opens_thinking("<|Assistant|><think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // Qwen3, thinking off
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  const std::string qwen3 = test::testdata("tokenizers/qwen3/tokenizer_config.json");
  if (!file_exists(qwen3)) GTEST_SKIP() << "test data missing: " << qwen3;
  const ChatTemplate t = ChatTemplate::from_tokenizer_config(qwen3);
  EXPECT_TRUE(template_thinks(t.source()));
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "2+2?"}])");
  EXPECT_FALSE(prompt_opens_thinking(t.render(msgs, true, nlohmann::ordered_json::object())));  // the model opens it
  const std::string off = t.render(msgs, true, nlohmann::ordered_json{{"enable_thinking", false}});
  EXPECT_NE(off.find("</think>"), std::string::npos) << off;  // an empty block: nothing to split
  EXPECT_FALSE(prompt_opens_thinking(off));
}

bool grammar_takes(const Grammar& g, const std::string& text) {
  GrammarState s = grammar_start(g);
  return grammar_accepts_prefix(g, s, text) && s.complete();
}

// A constrained answer after free thinking: the block may hold any text but its closing tag
// (checked against a plain search on random strings over the tag's letters), then the answer.
TEST(Reasoning, ThinkFirstGrammarFreesTheBlockAndConstrainsTheAnswer) {
  const std::string answer = R"(root ::= "yes" | "no")";
  const auto optional_block = Grammar::parse(think_first_gbnf(answer, false), kThinkFirstRoot);
  for (const char* ok : {"yes", "<think>hm</think>\n\nno", "\n<think></think>yes", "<think>a<b</thi</thin</think>yes"})
    EXPECT_TRUE(grammar_takes(*optional_block, ok)) << ok;
  for (const char* no : {"maybe", "<think>yes", "<think>a</think>b</think>yes", "<think>a</think>yess", "hm</think>yes"})
    EXPECT_FALSE(grammar_takes(*optional_block, no)) << no;
  const auto opened = Grammar::parse(think_first_gbnf(answer, true), kThinkFirstRoot);
  EXPECT_TRUE(grammar_takes(*opened, "hm</think> yes"));
  EXPECT_FALSE(grammar_takes(*opened, "yes"));  // the block is open: it must close first
  std::mt19937 rng(9);
  const std::string letters = "</thinka>";
  int closed_early = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const size_t len = rng() % 24;
    for (size_t i = 0; i < len; ++i) text += letters[rng() % letters.size()];
    if (rng() % 4 == 0) text.insert(rng() % (text.size() + 1), "</think>");
    const bool free_of_tag = text.find("</think>") == std::string::npos;
    closed_early += !free_of_tag;
    EXPECT_EQ(grammar_takes(*opened, text + "</think>no"), free_of_tag) << text;
  }
  EXPECT_GT(closed_early, 300);
}

}  // namespace
}  // namespace fp
