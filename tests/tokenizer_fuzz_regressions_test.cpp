// tests/tokenizer_fuzz_regressions_test.cpp — inputs the tokenizer.json fuzzer found: a JSON
// value of the wrong type inside the model, an added token's id too large for any integer, and
// nesting deep enough to overflow a recursive walk.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

std::string write_case(const std::string& name, const std::string& text) {
  std::string path = test::temp_dir("tok_fuzz_regress") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

void expect_error_naming_file(const std::string& path, const std::string& what) {
  try {
    Tokenizer::from_hf_json(path);
    FAIL() << "expected an error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TokenizerFuzzRegressions, WrongJsonTypeIsAnErrorNotACrash) {
  expect_error_naming_file(write_case("type.json", R"({"model": {"type": 7, "vocab": {}, "merges": []}})"), "unexpected JSON structure");
  expect_error_naming_file(write_case("vocab.json", R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})"), "model.vocab");
}

// An id of 100 digits parses as a double (1.1e98); converting it to an integer was undefined
// behaviour (UBSan caught it in CI's fuzzing, 2026-12-01).
TEST(TokenizerFuzzRegressions, AddedTokenIdBeyondAnyIntegerIsAnError) {
  const std::string huge(100, '1');
  expect_error_naming_file(write_case("huge_id.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "added_tokens": [{"id": )" +
                                                     huge + R"(, "content": "<|x|>", "special": true}]})"),
                           "added_tokens id");
  expect_error_naming_file(write_case("float_id.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "added_tokens": [{"id": 2.5, "content": "x"}]})"),
                           "is not an integer id");
}

TEST(TokenizerFuzzRegressions, DeepNestingIsRejectedBeforeAnyRecursion) {
  std::string deep = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": )";
  for (int i = 0; i < 50000; ++i) deep += R"({"type": "Sequence", "pretokenizers": [)";
  for (int i = 0; i < 50000; ++i) deep += "]}";
  deep += "}";
  expect_error_naming_file(write_case("deep.json", deep), "levels deep");
}

}  // namespace
}  // namespace fp
