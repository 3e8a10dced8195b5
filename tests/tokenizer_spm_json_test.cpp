// tests/tokenizer_spm_json_test.cpp — SentencePiece-style tokenizer.json files (BPE with byte
// fallback and "▁" for spaces: Gemma's, and Llama 2's / Mistral's legacy and Metaspace forms)
// against the ids Hugging Face's tokenizers library gives. The files in tests/golden/tokenizers/
// were made by transformers' own converters from SentencePiece models trained on this repo's docs
// (scripts/make_spm_tokenizer_golden.py); expected.json holds each text's ids and decoding.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

const std::string kDir = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/tokenizers/";

void expect_hf_ids(const std::string& name) {
  SCOPED_TRACE(name);
  const auto tok = Tokenizer::from_hf_json(kDir + name + "/tokenizer.json");
  EXPECT_EQ(tok->spec().model, "llama") << tok->describe();
  std::ifstream in(kDir + name + "/expected.json");
  ASSERT_TRUE(in);
  const auto expected = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text, /*add_special=*/false, /*parse_special=*/true), ids) << "text: '" << text << "'";
    EXPECT_EQ(tok->decode(ids, /*render_special=*/true), c["decoded"].get<std::string>()) << "text: '" << text << "'";
    ++checked;
  }
  EXPECT_GE(checked, 18);
}

// Gemma: Replace(" " -> "▁"), no prefix, turn markers as special added tokens.
TEST(TokenizerSpmJson, GemmaStyleMatchesHfTokenizers) {
  expect_hf_ids("spm_gemma");
  const auto tok = Tokenizer::from_hf_json(kDir + "spm_gemma/tokenizer.json");
  const int32_t eot = tok->find_token("<end_of_turn>");
  ASSERT_GE(eot, 0);
  EXPECT_TRUE(tok->is_eog(eot)) << "a chat reply ends at <end_of_turn>";
  EXPECT_EQ(tok->token_type(tok->find_token("<0x0A>")), TokenType::Byte);
}

// Llama 2 / Mistral, legacy: Prepend("▁") + Replace normalizers (a "▁" before every run of text).
TEST(TokenizerSpmJson, LlamaLegacyStyleMatchesHfTokenizers) { expect_hf_ids("spm_llama_legacy"); }

// Llama 2 / Mistral, non-legacy: Metaspace(prepend_scheme first): a "▁" before the text's first
// run only, and none before a run that already starts with a space.
TEST(TokenizerSpmJson, LlamaMetaspaceStyleMatchesHfTokenizers) { expect_hf_ids("spm_llama"); }

// Parts of a SentencePiece-style file this reader does not implement are named, not ignored.
TEST(TokenizerSpmJson, UnsupportedPartsAreNamed) {
  std::ifstream in(kDir + "spm_llama/tokenizer.json");
  auto j = nlohmann::json::parse(in);
  j["pre_tokenizer"]["split"] = true;
  const std::string dir = test::temp_dir("spm_json_split");
  test::write_file(dir + "/tokenizer.json", j.dump());
  try {
    Tokenizer::from_hf_json(dir + "/tokenizer.json");
    ADD_FAILURE() << "loaded a Metaspace with split: true";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("split: true"), std::string::npos) << e.what();
  }
  j["pre_tokenizer"]["split"] = false;
  j["normalizer"] = {{"type", "Lowercase"}};
  test::write_file(dir + "/tokenizer.json", j.dump());
  try {
    Tokenizer::from_hf_json(dir + "/tokenizer.json");
    ADD_FAILURE() << "loaded a Lowercase normalizer";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Lowercase"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp
