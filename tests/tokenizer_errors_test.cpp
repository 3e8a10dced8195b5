// tests/tokenizer_errors_test.cpp — malformed inputs throw fp::Error naming the file (and field),
// never crash: truncated llama2.c vocabularies, bad JSON, missing fields, ids out of range.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

TEST(TokenizerErrors, TruncatedLlama2cVocabulary) {
  const std::string src = test::testdata("models/stories260K/tok512.bin");
  FP_REQUIRE_FILE(src);
  const std::string bytes = test::read_file(src);
  const std::string dir = test::temp_dir("tok_truncated");
  for (size_t cut : {size_t(0), size_t(2), size_t(4), size_t(7), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
    const std::string path = dir + "/tok512_cut" + std::to_string(cut) + ".bin";
    test::write_file(path, bytes.substr(0, cut));
    test::expect_error([&] { Tokenizer::from_llama2c(path, 512); }, {path});
  }
  // Asking for more tokens than the file holds is the same truncation.
  const std::string whole = dir + "/tok512.bin";
  test::write_file(whole, bytes);
  test::expect_error([&] { Tokenizer::from_llama2c(whole, 513); }, {whole, "token 512"});
  test::expect_error([&] { Tokenizer::from_llama2c(whole, 0); }, {whole});
  test::expect_error([&] { Tokenizer::from_llama2c(whole, 2000000000); }, {whole, "truncated"});
  // A corrupt length field.
  std::string bad = bytes;
  bad[8] = '\x7f';  // first token's length byte 0 -> huge
  test::write_file(dir + "/badlen.bin", bad);
  test::expect_error([&] { Tokenizer::from_llama2c(dir + "/badlen.bin", 512); }, {"badlen.bin", "token 0"});
  test::expect_error([&] { Tokenizer::from_llama2c(dir + "/missing.bin", 512); }, {"missing.bin"});
}

TEST(TokenizerErrors, BadTokenizerJson) {
  const std::string dir = test::temp_dir("tok_json");
  const std::string bad = dir + "/bad.json";
  test::write_file(bad, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}");
  test::expect_error([&] { Tokenizer::from_hf_json(bad); }, {bad, "invalid JSON"});

  const std::string no_model = dir + "/no_model.json";
  test::write_file(no_model, R"({"added_tokens": [], "pre_tokenizer": null})");
  test::expect_error([&] { Tokenizer::from_hf_json(no_model); }, {no_model, "model"});

  const std::string no_vocab = dir + "/no_vocab.json";
  test::write_file(no_vocab, R"({"model": {"type": "BPE", "merges": []}})");
  test::expect_error([&] { Tokenizer::from_hf_json(no_vocab); }, {no_vocab, "model.vocab"});

  const std::string wordpiece = dir + "/wordpiece.json";
  test::write_file(wordpiece, R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  test::expect_error([&] { Tokenizer::from_hf_json(wordpiece); }, {wordpiece, "WordPiece"});

  const std::string neg_id = dir + "/neg.json";
  test::write_file(neg_id, R"({"model": {"type": "BPE", "vocab": {"a": -5}, "merges": []}, "decoder": {"type": "ByteLevel"}})");
  test::expect_error([&] { Tokenizer::from_hf_json(neg_id); }, {neg_id, "out of range"});

  const std::string huge_id = dir + "/huge_id.json";
  test::write_file(huge_id, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "ByteLevel"},
      "added_tokens": [{"id": 2000000000, "content": "<x>", "special": true}]})");
  test::expect_error([&] { Tokenizer::from_hf_json(huge_id); }, {huge_id, "added_tokens", "out of range"});

  const std::string bad_type = dir + "/bad_type.json";
  test::write_file(bad_type, R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}, "decoder": {"type": "ByteLevel"}})");
  test::expect_error([&] { Tokenizer::from_hf_json(bad_type); }, {bad_type});

  const std::string bad_regex = dir + "/bad_regex.json";
  test::write_file(bad_regex, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
      "decoder": {"type": "ByteLevel"}})");
  test::expect_error([&] { Tokenizer::from_hf_json(bad_regex); }, {"regex"});

  test::expect_error([&] { Tokenizer::from_hf_json(dir + "/missing.json"); }, {"missing.json"});
  test::expect_error([&] { Tokenizer::from_path(dir + "/nothing_here"); }, {"nothing_here"});
}

TEST(TokenizerErrors, BadSpec) {
  TokenizerSpec s;
  s.source = "unit-spec";
  test::expect_error([&] { Tokenizer::from_spec(s); }, {"unit-spec", "empty"});
  s.tokens = {"a", "b"};
  s.bos_id = 7;
  test::expect_error([&] { Tokenizer::from_spec(s); }, {"unit-spec", "bos", "7"});
  s.bos_id = -1;
  s.model = "wordpiece";
  test::expect_error([&] { Tokenizer::from_spec(s); }, {"unit-spec", "wordpiece"});
  s.model = "gpt2";
  s.pre = "no-such-pre";
  test::expect_error([&] { Tokenizer::from_spec(s); }, {"unit-spec", "no-such-pre"});
  s.model = "llama";
  s.scores = {1.0f};
  test::expect_error([&] { Tokenizer::from_spec(s); }, {"unit-spec", "scores"});
}

}  // namespace
}  // namespace fp
