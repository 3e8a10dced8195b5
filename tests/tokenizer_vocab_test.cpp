// tests/tokenizer_vocab_test.cpp — the llama.cpp tokenizer test vectors (tokenizers/vocab/*.inp/.out):
// every text encodes, without BOS or special-token parsing, to exactly the expected ids, and
// decodes back to itself.
#include <sstream>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

struct VocabCase {
  std::string name;
  std::string tokenizer;  // relative to testdata
  std::string vectors;    // NAME.gguf, the prefix of .inp/.out
};

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// As llama.cpp's test-tokenizer-0: texts are separated by "\n__ggml_vocab_test__\n" (the file
// ends with one, leaving an empty tail that is not a test); the .out has one line of ids per text.
std::vector<Vector> load_vectors(const std::string& prefix) {
  const std::string inp = test::read_file(prefix + ".inp");
  const std::string out = test::read_file(prefix + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t at = inp.find(sep, pos);
    if (at == std::string::npos) break;
    texts.push_back(inp.substr(pos, at - pos));
    pos = at + sep.size();
  }
  std::vector<Vector> v;
  std::istringstream lines(out);
  std::string line;
  for (const auto& t : texts) {
    if (!std::getline(lines, line)) break;
    Vector x{t, {}};
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) x.ids.push_back(id);
    v.push_back(std::move(x));
  }
  EXPECT_EQ(v.size(), texts.size()) << prefix << ": .out has fewer lines than .inp has texts";
  return v;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") return Tokenizer::from_gguf(*GgufFile::open(path));
  return Tokenizer::from_path(path);
}

class TokenizerVocabTest : public ::testing::TestWithParam<VocabCase> {};

TEST_P(TokenizerVocabTest, EncodesTestVectorsExactly) {
  const VocabCase& c = GetParam();
  const std::string tok_path = test::testdata(c.tokenizer);
  const std::string prefix = test::testdata("tokenizers/vocab/" + c.vectors);
  FP_REQUIRE_FILE(tok_path);
  FP_REQUIRE_FILE(prefix + ".inp");
  FP_REQUIRE_FILE(prefix + ".out");
  const auto tok = load_tokenizer(tok_path);
  const auto vectors = load_vectors(prefix);
  ASSERT_EQ(vectors.size(), 46u);
  int failures = 0;
  for (const auto& v : vectors) {
    const auto ids = tok->encode(v.text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids, v.ids) << c.name << ": text '" << v.text << "'";
    failures += ids != v.ids;
  }
  EXPECT_EQ(failures, 0) << c.name << ": " << failures << " of " << vectors.size() << " texts differ";
}

TEST_P(TokenizerVocabTest, DecodeRoundTrips) {
  const VocabCase& c = GetParam();
  const std::string tok_path = test::testdata(c.tokenizer);
  const std::string prefix = test::testdata("tokenizers/vocab/" + c.vectors);
  FP_REQUIRE_FILE(tok_path);
  FP_REQUIRE_FILE(prefix + ".inp");
  const auto tok = load_tokenizer(tok_path);
  for (const auto& v : load_vectors(prefix)) {
    EXPECT_EQ(tok->decode(tok->encode(v.text, false, false)), v.text) << c.name;
    // With BOS added the text comes back the same (BOS renders as nothing).
    EXPECT_EQ(tok->decode(tok->encode(v.text, true, false)), v.text) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizer, TokenizerVocabTest,
    ::testing::Values(VocabCase{"llama_spm", "tokenizers/vocab/ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-spm.gguf"},
                      VocabCase{"gpt2", "tokenizers/vocab/ggml-vocab-gpt-2.gguf", "ggml-vocab-gpt-2.gguf"},
                      VocabCase{"deepseek_coder", "tokenizers/vocab/ggml-vocab-deepseek-coder.gguf",
                                "ggml-vocab-deepseek-coder.gguf"},
                      VocabCase{"llama3_json", "tokenizers/llama3/tokenizer.json", "ggml-vocab-llama-bpe.gguf"}),
    [](const ::testing::TestParamInfo<VocabCase>& p) { return p.param.name; });

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// deepseek-llm has no test vectors here: check it loads with its pre-tokenizer and round-trips.
TEST(TokenizerGguf, DeepSeekLlmLoadsAndRoundTrips) {
  const std::string path = test::testdata("tokenizers/vocab/ggml-vocab-deepseek-llm.gguf");
  FP_REQUIRE_FILE(path);
  const auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
  EXPECT_EQ(tok->n_vocab(), 102400);
  EXPECT_EQ(tok->spec().pre, "deepseek-llm");
  EXPECT_EQ(tok->bos_id(), 100000);
  const auto with_bos = tok->encode("Hello world", true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos.front(), 100000);
  const auto prefix = test::testdata("tokenizers/vocab/ggml-vocab-gpt-2.gguf");
  FP_REQUIRE_FILE(prefix + ".inp");
  for (const auto& v : load_vectors(prefix)) EXPECT_EQ(tok->decode(tok->encode(v.text, false, false)), v.text);
}

}  // namespace
}  // namespace fp
