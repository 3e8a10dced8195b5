// tests/tokenizer_hf_test.cpp — Hugging Face tokenizer.json loading (Qwen3, DeepSeek-V3, Llama-3):
// round trips over varied text, added/special tokens, tokenizer_config.json, load_timed time.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

const std::vector<std::string>& round_trip_texts() {
  static const std::vector<std::string> texts = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog. I'm sure they'll've DONE it!",
      "int main(int argc, char** argv) {\n    for (int i = 0; i < 10; ++i) printf(\"%d\\n\", i);\n    return 0;\n}\n",
      "def f(x):\n\treturn x ** 2  # square\n",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",  // 你好，世界！ こんにちは 한국어
      "emoji: \xf0\x9f\xa6\x99\xf0\x9f\x9a\x80 \xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f \xe2\x9c\x85",
      "numbers 1 12 123 1234 12345 3.14159 1e-9 -42 0x1F",
      "   leading, trailing and    inner   runs   \n\n\n\t\t  \r\n",
      "",
      " ",
      "\n",
      "\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 \xd0\x91\xd1\x8a\xd0\xbb\xd0\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0\xba\xd0\xb8 C\xe1\xbb\xad\xd0\xb0 Vi\xe1\xbb\x87t",
  };
  return texts;
}

struct Loaded {
  std::unique_ptr<Tokenizer> tok;
  double seconds = 0;
};
Loaded load_timed(const std::string& rel) {
  const auto t0 = std::chrono::steady_clock::now();
  Loaded l{Tokenizer::from_hf_json(test::testdata(rel)), 0};
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l;
}

// A 150k-entry tokenizer.json loads well under a second in an optimized build (3 s leaves room
// for a busy machine); debug and sanitizer builds are not timed.
void expect_fast_load(const Loaded& l) {
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(l.seconds, 3.0) << "loading took " << l.seconds << " s";
#else
  (void)l;
#endif
}

TEST(TokenizerHf, Qwen3) {
  const std::string path = test::testdata("tokenizers/qwen3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  const Loaded l = load_timed("tokenizers/qwen3/tokenizer.json");
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.n_vocab(), 151669);
  EXPECT_EQ(tok.spec().normalizer, "NFC");
  for (const auto& t : round_trip_texts()) EXPECT_EQ(tok.decode(tok.encode(t, false, false)), t) << t;
  EXPECT_EQ(tok.encode("Hello world", false, false), (std::vector<int32_t>{9707, 1879}));
  // Qwen splits numbers into single digits.
  EXPECT_EQ(tok.encode("123", false, false).size(), 3u);
  // Special tokens: single ids with parse_special, plain text without.
  const int32_t im_start = tok.find_token("<|im_start|>"), im_end = tok.find_token("<|im_end|>");
  EXPECT_EQ(im_start, 151644);
  EXPECT_EQ(im_end, 151645);
  EXPECT_EQ(tok.encode("<|im_start|>", false, true), (std::vector<int32_t>{151644}));
  EXPECT_GT(tok.encode("<|im_start|>", false, false).size(), 1u);
  const auto chat = tok.encode("<|im_start|>user\nHi<|im_end|>\n", false, true);
  EXPECT_EQ(chat.front(), 151644);
  EXPECT_EQ(std::count(chat.begin(), chat.end(), 151645), 1);
  EXPECT_EQ(tok.decode(chat, true), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(tok.decode(chat), "user\nHi\n");
  // <think> is a non-special added token: matched even without parse_special.
  EXPECT_EQ(tok.encode("<think>", false, false), (std::vector<int32_t>{151667}));
  // tokenizer_config.json: no BOS, EOS <|im_end|>.
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_TRUE(tok.is_eog(151645));
  EXPECT_TRUE(tok.is_eog(151643));  // <|endoftext|>
  EXPECT_EQ(tok.encode("hi", true, false), tok.encode("hi", false, false));
  // NFC: a decomposed é encodes like the composed one.
  EXPECT_EQ(tok.encode("caf\x65\xcc\x81", false, false), tok.encode("caf\xc3\xa9", false, false));
  expect_fast_load(l);
}

TEST(TokenizerHf, DeepSeekV3) {
  const std::string path = test::testdata("tokenizers/deepseek_v3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  const Loaded l = load_timed("tokenizers/deepseek_v3/tokenizer.json");
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.n_vocab(), 128815);
  for (const auto& t : round_trip_texts()) EXPECT_EQ(tok.decode(tok.encode(t, false, false)), t) << t;
  const std::string bos = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.find_token(bos), 0);
  EXPECT_EQ(tok.encode(bos, false, true), (std::vector<int32_t>{0}));
  EXPECT_NE(tok.encode(bos, false, false), (std::vector<int32_t>{0}));
  // add_bos_token is true in its tokenizer_config.json.
  const auto with_bos = tok.encode("Hello", true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos.front(), 0);
  // Digits come in groups of at most three.
  EXPECT_EQ(tok.encode("1234567", false, false).size(), 3u);
  expect_fast_load(l);
}

TEST(TokenizerHf, Llama3SpecialTokensAndBos) {
  const std::string path = test::testdata("tokenizers/llama3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  const Loaded l = load_timed("tokenizers/llama3/tokenizer.json");
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.n_vocab(), 128256);
  EXPECT_EQ(tok.bos_id(), 128000);
  EXPECT_EQ(tok.encode("Hello world", true, false), (std::vector<int32_t>{128000, 9906, 1917}));
  EXPECT_EQ(tok.encode("<|start_header_id|>user<|end_header_id|>", false, true),
            (std::vector<int32_t>{128006, 882, 128007}));
  EXPECT_TRUE(tok.is_eog(128009));  // <|eot_id|>
  EXPECT_TRUE(tok.is_eog(128001));  // <|end_of_text|>
  for (const auto& t : round_trip_texts()) EXPECT_EQ(tok.decode(tok.encode(t, false, false)), t) << t;
  expect_fast_load(l);
}

// Qwen3-Embedding's tokenizer.json appends <|endoftext|> through its post-processor, the token
// whose final hidden state its last-token pooling reads; the chat EOS (tokenizer_config.json's
// <|im_end|>) stays what it is, and text encoded without special tokens gets nothing appended.
TEST(TokenizerHf, TemplateProcessingAppendsItsTrailingToken) {
  const std::string src = test::testdata("tokenizers/qwen3");
  FP_REQUIRE_FILE(src + "/tokenizer.json");
  nlohmann::json j;
  std::ifstream(src + "/tokenizer.json") >> j;
  nlohmann::json appends = nlohmann::json::parse(R"({"type": "TemplateProcessing",
      "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
      "pair": [], "special_tokens": {}})");
  j["post_processor"] = {{"type", "Sequence"}, {"processors", nlohmann::json::array({j["post_processor"], appends})}};
  const std::string dir = test::temp_dir("tok_appends");
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  std::filesystem::copy_file(src + "/tokenizer_config.json", dir + "/tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const auto tok = Tokenizer::from_path(dir);
  EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{9707, 1879, 151643}));
  EXPECT_EQ(tok->encode("Hello world", false, false), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok->eos_id(), 151645) << "the chat EOS is tokenizer_config.json's";
  EXPECT_NE(tok->describe().find("appends=151643"), std::string::npos) << tok->describe();
  j["post_processor"]["processors"][1]["single"][1]["SpecialToken"]["id"] = "<|no such token|>";
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  EXPECT_THROW(Tokenizer::from_path(dir), Error);
}

TEST(TokenizerHf, FromPathAcceptsADirectory) {
  const std::string dir = test::testdata("tokenizers/qwen3");
  FP_REQUIRE_FILE(dir + "/tokenizer.json");
  const auto tok = Tokenizer::from_path(dir);
  EXPECT_EQ(tok->n_vocab(), 151669);
  EXPECT_NE(tok->describe().find("gpt2"), std::string::npos);
}

}  // namespace
}  // namespace fp
