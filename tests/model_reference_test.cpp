// tests/model_reference_test.cpp — the forward pass against independent references:
// stories260K (llama2.c's run.c outputs) from GGUF and from the llama2.c checkpoint, and the
// llama-tiny-q8 fixture (llama.cpp's logits).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kernels/registry.h"
#include "model/model.h"
#include "test_util.h"

namespace fp {
namespace {

const std::string kStoriesDir = "models/stories260K/";

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  int32_t v;
  while (in >> v) ids.push_back(v);
  return ids;
}

// The 64-token sequence of the reference file ("sequence: 1 403 ...").
std::vector<int32_t> stories_sequence() {
  std::istringstream in(test::read_file(test::testdata(kStoriesDir + "stories260K_once_upon_a_time_64_tokens.txt")));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("sequence:", 0) == 0) return parse_ids(line.substr(9));
  return {};
}

std::vector<float> all_logits(Model& m, const std::vector<int32_t>& ids, bool incremental) {
  int64_t n = static_cast<int64_t>(ids.size()), V = m.config().n_vocab;
  auto cache = m.new_cache(n);
  std::vector<float> out(static_cast<size_t>(n * V));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  if (incremental) {
    for (int64_t i = 0; i < n; ++i) m.forward(&ids[static_cast<size_t>(i)], &pos[static_cast<size_t>(i)], 1, *cache, out.data() + i * V, false);
  } else {
    m.forward(ids.data(), pos.data(), n, *cache, out.data(), true);
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, static_cast<double>(std::fabs(a[i] - b[i])));
  return e;
}

class Stories : public ::testing::TestWithParam<std::string> {};

TEST_P(Stories, LogitsMatchLlama2cReference) {
  std::string path = test::testdata(kStoriesDir + GetParam());
  FP_REQUIRE_FILE(path);
  auto ref = test::read_f32_file(test::testdata(kStoriesDir + "stories260K_once_upon_a_time_64_logits.f32"));
  auto seq = stories_sequence();
  ASSERT_GE(seq.size(), 64u);
  seq.resize(64);
  ASSERT_EQ(ref.size(), 64u * 512);
  auto model = load_model(path);
  for (bool incremental : {false, true}) {
    auto got = all_logits(*model, seq, incremental);
    EXPECT_LT(max_abs_diff(got, ref, ref.size()), 1e-4) << (incremental ? "one token per forward" : "one batch");
  }
}

TEST_P(Stories, GreedyGenerationFromBosMatchesRunC) {
  std::string path = test::testdata(kStoriesDir + GetParam());
  FP_REQUIRE_FILE(path);
  std::string expected = test::read_file(test::testdata(kStoriesDir + "stories260K_greedy_BOS_256.txt"));
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " generate -q -n 256 --temp 0 -m " + path, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, expected);
}

INSTANTIATE_TEST_SUITE_P(BothFormats, Stories, ::testing::Values("stories260K.gguf", "stories260K.bin"),
                         [](const auto& p) { return p.param == "stories260K.gguf" ? std::string("gguf") : std::string("llama2c"); });

// The reference's 64 positions are the prompt and its greedy continuation.
TEST(Stories, GreedyContinuationOfPromptMatchesReferenceSequence) {
  std::string path = test::testdata(kStoriesDir + "stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto seq = stories_sequence();
  ASSERT_GE(seq.size(), 64u);
  auto model = load_model(path);
  std::vector<int32_t> cont(seq.begin() + 5, seq.begin() + 64);
  std::string expected = model->tokenizer()->decode(cont);
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " generate -q -p 'Once upon a time' -n 59 --temp 0 -m " + path, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, expected + "\n");
}

TEST(Stories, PromptTokensMatchReference) {
  std::string path = test::testdata(kStoriesDir + "stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto model = load_model(path);
  auto ids = model->tokenizer()->encode("Once upon a time", true, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

// llama-tiny-q8: the reference rounds activations to Q8_0 before every Q8_0 matmul.
double relative_error_vs_fixture(const std::string& forced_matmul) {
  std::string dir = test::testdata("models/fixtures/");
  auto model = load_model(dir + "llama-tiny-q8.gguf");
  auto ids = parse_ids(test::read_file(dir + "llama-tiny-q8.tokens.txt"));
  auto ref = test::read_f32_file(dir + "llama-tiny-q8.logits.f32");
  if (!forced_matmul.empty()) KernelOverrides::global().force("matmul", forced_matmul);
  auto got = all_logits(*model, ids, false);
  KernelOverrides::global().clear();
  EXPECT_EQ(got.size(), ref.size());
  double mx = 0;
  for (float r : ref) mx = std::max(mx, static_cast<double>(std::fabs(r)));
  return max_abs_diff(got, ref, std::min(got.size(), ref.size())) / mx;
}

TEST(LlamaTinyQ8, MatchesLlamaCppWithinFloatActivationError) {
  FP_REQUIRE_FILE(test::testdata("models/fixtures/llama-tiny-q8.gguf"));
  EXPECT_LT(relative_error_vs_fixture(""), 2e-2);
}

TEST(LlamaTinyQ8, Q8ActivationKernelMatchesLlamaCppClosely) {
  FP_REQUIRE_FILE(test::testdata("models/fixtures/llama-tiny-q8.gguf"));
  EXPECT_LT(relative_error_vs_fixture("ref_q8act"), 1e-3);
}

TEST(Cli, LogitsCommandWritesReferenceRows) {
  std::string path = test::testdata(kStoriesDir + "stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto seq = stories_sequence();
  seq.resize(64);
  std::string ids;
  for (auto t : seq) ids += std::to_string(t) + " ";
  auto ref = test::read_f32_file(test::testdata(kStoriesDir + "stories260K_once_upon_a_time_64_logits.f32"));
  for (const char* flags : {"", " --no-mmap", " --mmap"}) {
    std::string out = test::temp_dir("logits") + "/l.f32";
    int rc = -1;
    test::run_command(test::fastpath_bin() + " logits -q -m " + path + flags + " --tokens '" + ids + "' --out " + out, &rc);
    ASSERT_EQ(rc, 0) << flags;
    auto got = test::read_f32_file(out);
    ASSERT_EQ(got.size(), ref.size()) << flags;
    EXPECT_LT(max_abs_diff(got, ref, ref.size()), 1e-4) << flags;
  }
}

TEST(Cli, ErrorsAreCleanAndNameTheProblem) {
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " generate -m /nonexistent/model.gguf 2>&1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("/nonexistent/model.gguf"), std::string::npos) << out;
  out = test::run_command(test::fastpath_bin() + " logits -m /nonexistent.gguf --tokens 'x' --out /dev/null 2>&1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("'x' is not a token id"), std::string::npos) << out;
  std::string path = test::testdata(kStoriesDir + "stories260K.gguf");
  if (file_exists(path)) {
    out = test::run_command(test::fastpath_bin() + " generate -m " + path + " --kernel matmul=nope 2>&1", &rc);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("no kernel named 'nope'"), std::string::npos) << out;
    out = test::run_command(test::fastpath_bin() + " logits -m " + path + " --tokens '1 9999' --out /dev/null 2>&1", &rc);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("9999"), std::string::npos) << out;
  }
  for (const char* cmd : {"generate", "tokenize", "logits", "inspect", "synth"}) {
    out = test::run_command(test::fastpath_bin() + " " + cmd + " --help", &rc);
    EXPECT_EQ(rc, 0) << cmd;
    EXPECT_NE(out.find("--"), std::string::npos) << cmd;
  }
}

TEST(Cli, InspectDescribesStories) {
  std::string path = test::testdata(kStoriesDir + "stories260K.gguf");
  FP_REQUIRE_FILE(path);
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " inspect -m " + path, &rc);
  EXPECT_EQ(rc, 0);
  for (const char* want : {"arch llama", "vocab 512", "dim 64", "layers 5", "heads 8 (kv 4", "ffn 172", "untied output",
                           "blk.0.attn_q.weight", "F32", "[64, 64]", "tokenizer.ggml.model"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

}  // namespace
}  // namespace fp
