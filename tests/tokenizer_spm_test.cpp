// tests/tokenizer_spm_test.cpp — SentencePiece-style BPE: llama2.c's tok512.bin and the same
// vocabulary in stories260K.gguf encode like llama2.c's run.c; byte fallback; decoding.
#include <sstream>

#include "formats/gguf.h"
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

const char* kTok512 = "models/stories260K/tok512.bin";
const char* kStoriesGguf = "models/stories260K/stories260K.gguf";

TEST(TokenizerSpm, Llama2cOnceUponATime) {
  const std::string path = test::testdata(kTok512);
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_llama2c(path, 512);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->encode("Once upon a time", true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->encode("Once upon a time", false, false), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_TRUE(tok->encode("", false, false).empty());
  EXPECT_EQ(tok->encode("", true, false), (std::vector<int32_t>{1}));
  EXPECT_TRUE(tok->is_eog(2));
}

TEST(TokenizerSpm, Llama2cReferenceSequenceDecodes) {
  const std::string path = test::testdata(kTok512);
  const std::string ref = test::testdata("models/stories260K/stories260K_once_upon_a_time_64_tokens.txt");
  FP_REQUIRE_FILE(path);
  FP_REQUIRE_FILE(ref);
  const auto tok = Tokenizer::from_llama2c(path, 512);
  const std::string text = test::read_file(ref);
  const size_t at = text.find("sequence:");
  ASSERT_NE(at, std::string::npos);
  std::vector<int32_t> seq;
  std::istringstream in(text.substr(at + 9));
  for (int32_t id; in >> id;) seq.push_back(id);
  ASSERT_GE(seq.size(), 64u);  // 64 positions, then the last prediction
  const std::string decoded = tok->decode(seq);
  EXPECT_EQ(decoded.rfind("Once upon a time", 0), 0u) << decoded;
}

TEST(TokenizerSpm, GgufVocabularyMatchesLlama2c) {
  const std::string bin = test::testdata(kTok512), gguf = test::testdata(kStoriesGguf);
  FP_REQUIRE_FILE(bin);
  FP_REQUIRE_FILE(gguf);
  const auto a = Tokenizer::from_llama2c(bin, 512);
  const auto b = Tokenizer::from_gguf(*GgufFile::open(gguf));
  ASSERT_EQ(a->n_vocab(), b->n_vocab());
  for (int32_t i = 3; i < a->n_vocab(); ++i) EXPECT_EQ(a->spec().tokens[i], b->spec().tokens[i]) << "token " << i;
  EXPECT_EQ(b->encode("Once upon a time", true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const std::string greedy = test::testdata("models/stories260K/stories260K_greedy_BOS_256.txt");
  FP_REQUIRE_FILE(greedy);
  const std::string story = test::read_file(greedy);
  for (const std::string& text : {story, std::string("Lily's mom said, \"Don't worry!\"\n\nThe end. 123 \xC3\xA9t\xC3\xA9")}) {
    const auto ids = a->encode(text, true, false);
    EXPECT_EQ(b->encode(text, true, false), ids);
    EXPECT_EQ(a->decode(ids), text);
  }
}

TEST(TokenizerSpm, ByteFallbackAndSpecialTokens) {
  const std::string path = test::testdata("tokenizers/vocab/ggml-vocab-llama-spm.gguf");
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
  EXPECT_EQ(tok->n_vocab(), 32000);
  // "\t" has no piece: "▁" then the byte token <0x09> (id 3 + 9).
  EXPECT_EQ(tok->encode("\t", false, false), (std::vector<int32_t>{29871, 12}));
  EXPECT_EQ(tok->token_to_bytes(12), "\t");
  EXPECT_EQ(tok->token_to_bytes(1), "");
  EXPECT_EQ(tok->token_to_bytes(1, true), "<s>");
  // Control tokens are text unless parse_special.
  const auto plain = tok->encode("<s>", false, false);
  EXPECT_NE(plain, (std::vector<int32_t>{1}));
  const auto special = tok->encode("<s>hi", false, true);
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(special[0], 1);
  EXPECT_EQ(tok->decode(special), "hi");
  EXPECT_THROW(tok->token_to_bytes(32000), Error);
  EXPECT_THROW(tok->token_to_bytes(-1), Error);
  EXPECT_NE(tok->describe().find("vocab=32000"), std::string::npos) << tok->describe();
}

}  // namespace
}  // namespace fp
