// tests/synth_model_test.cpp — models written by `synth` as GGUF and as safetensors give the
// same logits through both loaders (llama with its q/k permutation, qwen2 biases, qwen3 q/k
// norms, llama3 RoPE scaling, F32/F16/BF16), quantized GGUF types stay within their format's
// error, and FP8 block-scaled safetensors load.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/model.h"
#include "core/thread_pool.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {


double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0, mx = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    e = std::max(e, static_cast<double>(std::fabs(a[i] - b[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
  }
  return e / mx;
}

std::string write_synth(const std::string& dir, const std::string& arch, const nlohmann::json& cfg, DType t, const std::string& out) {
  SynthOptions o;
  o.arch = arch;
  o.config = cfg;
  o.type = t;
  o.seed = 7;
  o.out = dir + "/" + out;
  synth_model(o);
  return o.out;
}

const std::vector<int32_t> kPromptIds = {1, 17, 300, 5, 99, 42, 260, 7, 511, 3, 128};

struct Case {
  std::string arch;
  nlohmann::json cfg;
};

TEST(SynthModel, GgufAndSafetensorsGiveTheSameLogits) {
  std::string dir = test::temp_dir("synth_same");
  std::vector<Case> cases = {
      {"llama", {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96}, {"vocab_size", 512}}},
      {"llama", {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 4}, {"vocab_size", 512}, {"tie_word_embeddings", true},
                 {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 64}}}}},
      {"llama", {{"hidden_size", 64}, {"num_attention_heads", 2}, {"vocab_size", 512}, {"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}}},
      {"qwen2", {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 512}}},
      {"qwen3", {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32}, {"vocab_size", 512}}},
  };
  int k = 0;
  for (auto& c : cases) {
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      std::string tag = c.arch + std::to_string(k) + dtype_name(t);
      auto g = test::all_position_logits(write_synth(dir, c.arch, c.cfg, t, tag + ".gguf"), kPromptIds);
      auto s = test::all_position_logits(write_synth(dir, c.arch, c.cfg, t, tag + "_hf"), kPromptIds);
      // Same values; the Llama GGUF permutes q/k rows, so dot products sum in another order.
      EXPECT_LT(rel_diff(g, s), 1e-5) << tag;
      double mx = 0;
      for (float v : g) mx = std::max(mx, static_cast<double>(std::fabs(v)));
      EXPECT_GT(mx, 0.1) << tag << ": logits should not be degenerate";
    }
    ++k;
  }
}

TEST(SynthModel, QuantizedGgufStaysWithinFormatError) {
  std::string dir = test::temp_dir("synth_quant");
  nlohmann::json cfg = {{"hidden_size", 256}, {"num_attention_heads", 4}, {"intermediate_size", 512}, {"vocab_size", 512},
                        {"num_hidden_layers", 2}};
  auto f32 = test::all_position_logits(write_synth(dir, "llama", cfg, DType::F32, "f32.gguf"), kPromptIds);
  struct Q { DType t; double bound; };
  for (auto q : {Q{DType::Q8_0, 0.03}, Q{DType::Q6_K, 0.08}, Q{DType::Q5_K, 0.15}, Q{DType::Q5_0, 0.15}, Q{DType::Q5_1, 0.15},
                 Q{DType::Q4_0, 0.3}, Q{DType::Q4_1, 0.3}, Q{DType::Q4_K, 0.3}, Q{DType::Q3_K, 0.6}, Q{DType::Q2_K, 1.0},
                 Q{DType::IQ4_NL, 0.3}, Q{DType::IQ4_XS, 0.3}}) {
    auto got = test::all_position_logits(write_synth(dir, "llama", cfg, q.t, std::string(dtype_name(q.t)) + ".gguf"), kPromptIds);
    double e = rel_diff(got, f32);
    EXPECT_LT(e, q.bound) << dtype_name(q.t);
    EXPECT_GT(e, 0.0) << dtype_name(q.t);
  }
}

TEST(SynthModel, Fp8BlockScaledSafetensorsLoadAndStayClose) {
  std::string dir = test::temp_dir("synth_fp8");
  nlohmann::json cfg = {{"hidden_size", 256}, {"num_attention_heads", 4}, {"intermediate_size", 320}, {"vocab_size", 512}};
  auto f32 = test::all_position_logits(write_synth(dir, "llama", cfg, DType::F32, "f32_hf"), kPromptIds);
  auto fp8 = test::all_position_logits(write_synth(dir, "llama", cfg, DType::F8_E4M3, "fp8_hf"), kPromptIds);
  double e = rel_diff(fp8, f32);
  EXPECT_LT(e, 0.1);
  EXPECT_GT(e, 0.0);
}

TEST(SynthModel, BadConfigsAreRejectedWithTheField) {
  std::string dir = test::temp_dir("synth_bad");
  try {
    write_synth(dir, "llama", {{"hidden_size", 64}, {"num_attention_heads", 3}, {"num_key_value_heads", 2}}, DType::F32, "x.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv head count"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_synth(dir, "mamba", {}, DType::F32, "x.gguf"), Error);
  EXPECT_THROW(write_synth(dir, "llama", {{"hidden_size", 64}}, DType::Q4_K, "y.gguf"), Error);  // 64 % 256 != 0
  EXPECT_THROW(write_synth(dir, "llama", {{"hidden_size", 64}}, DType::Q8_0, "z_hf"), Error);    // no Q8_0 in safetensors
}

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// --fast-fill draws values from a counter, in parallel: the same file at any thread count, and
// values that look like the default draws (mean ~0, unit-ish spread, nothing non-finite).
TEST(Synth, FastFillIsTheSameAtAnyThreadCount) {
  const std::string dir = test::temp_dir("synth_fast_fill");
  std::vector<std::string> files;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    SynthOptions o;
    o.arch = "llama";
    o.config = nlohmann::json::parse(R"({"hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":300})");
    o.type = DType::F32;
    o.fast_fill = true;
    o.out = dir + "/t" + std::to_string(threads) + ".gguf";
    synth_model(o);
    files.push_back(test::read_file(o.out));
  }
  set_num_threads(0);
  ASSERT_FALSE(files[0].empty());
  EXPECT_EQ(files[0], files[1]);
  auto m = load_model(dir + "/t1.gguf");
  const Tensor* w = m->file().find("blk.0.ffn_up.weight");
  ASSERT_TRUE(w);
  const float* v = static_cast<const float*>(w->data);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < w->numel(); ++i) {
    ASSERT_TRUE(std::isfinite(v[i]));
    sum += v[i];
    sq += static_cast<double>(v[i]) * v[i];
  }
  const double mean = sum / static_cast<double>(w->numel()), sd = std::sqrt(sq / static_cast<double>(w->numel()) - mean * mean);
  EXPECT_LT(std::abs(mean), 0.2 * sd);
  EXPECT_GT(sd, 0.0);
}

}  // namespace
}  // namespace fp
