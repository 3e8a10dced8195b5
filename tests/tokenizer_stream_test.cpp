// tests/tokenizer_stream_test.cpp — StreamDecoder never emits a broken UTF-8 character, whether the
// character is split across SPM byte-fallback tokens or byte-level BPE tokens.
#include "formats/gguf.h"
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fp {
namespace {

// Pushes ids one by one; every chunk must be valid UTF-8 and the whole must equal `expected`.
void expect_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& expected) {
  StreamDecoder dec(tok);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = dec.push(id);
    EXPECT_TRUE(uni::is_valid_utf8(chunk)) << "broken chunk after token " << id;
    all += chunk;
  }
  all += dec.flush();
  EXPECT_EQ(all, expected);
}

TEST(TokenizerStream, SpmByteFallbackSplitsACharacter) {
  const std::string path = test::testdata("tokenizers/vocab/ggml-vocab-llama-spm.gguf");
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
  // 🦙 (F0 9F A6 99) is not in Llama-2's vocabulary: four byte tokens.
  const std::string llama = "\xf0\x9f\xa6\x99";
  const auto ids = tok->encode("a " + llama + " b", true, false);
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += tok->token_type(id) == TokenType::Byte;
  EXPECT_EQ(byte_tokens, 4);
  // The stream starts with BOS, so the encoder's leading space is dropped as in decode().
  expect_stream(*tok, ids, "a " + llama + " b");

  // Nothing comes out until the last byte of the character arrives.
  StreamDecoder dec(*tok);
  const int32_t b0 = tok->find_token("<0xF0>"), b1 = tok->find_token("<0x9F>"), b2 = tok->find_token("<0xA6>"),
                b3 = tok->find_token("<0x99>");
  EXPECT_EQ(dec.push(b0), "");
  EXPECT_EQ(dec.push(b1), "");
  EXPECT_EQ(dec.push(b2), "");
  EXPECT_EQ(dec.push(b3), llama);
  // A lone lead byte then a normal token: the bad byte becomes U+FFFD, the rest is intact.
  EXPECT_EQ(dec.push(b0), "");
  EXPECT_EQ(dec.push(tok->find_token("\xe2\x96\x81the")), "\xef\xbf\xbd the");
  EXPECT_EQ(dec.push(b1), "\xef\xbf\xbd");  // a stray continuation byte can never complete
  EXPECT_EQ(dec.push(b0), "");
  EXPECT_EQ(dec.flush(), "\xef\xbf\xbd");
}

TEST(TokenizerStream, ByteLevelBpeSplitsACharacter) {
  const std::string path = test::testdata("tokenizers/vocab/ggml-vocab-gpt-2.gguf");
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
  // From the GPT-2 test vectors: " this is 🦙.cpp" -> 428 318 12520 99 247 13 20322, where
  // 12520 99 247 carry the llama's four bytes between them.
  const std::vector<int32_t> ids = {428, 318, 12520, 99, 247, 13, 20322};
  EXPECT_EQ(tok->encode(" this is \xf0\x9f\xa6\x99.cpp", false, false), ids);
  EXPECT_FALSE(uni::is_valid_utf8(tok->token_to_bytes(12520)));
  expect_stream(*tok, ids, " this is \xf0\x9f\xa6\x99.cpp");
  StreamDecoder dec(*tok);
  EXPECT_EQ(dec.push(428), " this");
  EXPECT_EQ(dec.push(318), " is");
  EXPECT_EQ(dec.push(12520), " ");  // the space, not the half character
  EXPECT_EQ(dec.push(99), "");
  EXPECT_EQ(dec.push(247), "\xf0\x9f\xa6\x99");
}

TEST(TokenizerStream, QwenChineseAndEmoji) {
  const std::string path = test::testdata("tokenizers/qwen3/tokenizer.json");
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_hf_json(path);
  const std::string text = "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple\xe5\xb7\xa5\xe4\xbd\x9c \xf0\x9f\x98\x81\xf0\x9f\xa6\x99!";
  expect_stream(*tok, tok->encode(text, false, false), text);
}

}  // namespace
}  // namespace fp
