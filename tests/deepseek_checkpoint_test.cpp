// tests/deepseek_checkpoint_test.cpp — FP8 checkpoints from `synth`: DeepSeek-V3's and
// MiniMax-M2's give the logits of their dequantized twins, and V3's matches its BF16 twin within
// FP8's error; malformed configs and incomplete FP8 checkpoints are refused naming the field;
// `inspect` prints the latent KV cache size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

const nlohmann::json kV3 = {{"hidden_size", 256}, {"num_attention_heads", 4}, {"intermediate_size", 256},
                            {"num_hidden_layers", 3}, {"vocab_size", 512}, {"n_routed_experts", 8},
                            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 128}, {"n_shared_experts", 1},
                            {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}, {"q_lora_rank", 128},
                            {"kv_lora_rank", 128}, {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};

std::string synth_v3(const std::string& out, DType type, const nlohmann::json& cfg = kV3) {
  SynthOptions o;
  o.arch = "deepseek_v3";
  o.config = cfg;
  o.seed = 41;
  o.type = type;
  o.out = out;
  synth_model(o);
  return out;
}

const std::vector<int32_t> kIds = {1, 17, 300, 5, 99, 42, 260, 7, 511, 3};

// The FP8 directory `src` rewritten with every FP8 weight dequantized (scales applied) to F32.
void dequantize_fp8_dir(const std::string& src, const std::string& dst) {
  std::filesystem::create_directories(dst);
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
  auto set = SafetensorsSet::open_dir(src);
  SafetensorsWriter w;
  for (auto& [name, t] : set->all()) {
    if (name.ends_with("_scale_inv")) continue;
    if (t->type != DType::F8_E4M3) {
      w.add(name, t->type, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes));
      continue;
    }
    const SafetensorsTensor* sc = set->find(name + "_scale_inv");
    ASSERT_TRUE(sc) << name;
    const int64_t rows = t->shape[0], cols = t->shape[1], scols = (cols + 127) / 128;
    std::vector<float> f(static_cast<size_t>(rows * cols));
    std::vector<float> scale(static_cast<size_t>(sc->nbytes / 4));
    std::memcpy(scale.data(), sc->data, sc->nbytes);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(DType::F8_E4M3, t->data + r * cols, f.data() + r * cols, cols);
      for (int64_t c = 0; c < cols; ++c) f[static_cast<size_t>(r * cols + c)] *= scale[static_cast<size_t>((r / 128) * scols + c / 128)];
    }
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    w.add(name, DType::F32, t->shape, std::move(bytes));
  }
  w.write(dst + "/model.safetensors");
}

TEST(DeepseekCheckpoint, Fp8BlockScaledMatchesItsDequantizedTwinAndBf16) {
  const std::string dir = test::temp_dir("ds_fp8");
  const std::string fp8_dir = synth_v3(dir + "/fp8", DType::F8_E4M3);
  LoadOptions lo;
  lo.prefault = false;
  auto mf = load_model_file(fp8_dir, lo);
  const Tensor& e = mf->get("blk.1.ffn_gate_exps.3.weight");
  EXPECT_EQ(e.dtype, DType::F8_E4M3);
  EXPECT_TRUE(e.block_scale) << "expert weights keep their 128x128 scales";
  // Exactly the FP8 values: the same logits as F32 weights holding the dequantized values.
  auto fp8 = test::all_position_logits(fp8_dir, kIds);
  dequantize_fp8_dir(fp8_dir, dir + "/deq");
  auto deq = test::all_position_logits(dir + "/deq", kIds);
  EXPECT_LT(test::rel_err(fp8, deq), 1e-4);

  // Against the BF16 twin: E4M3 keeps 3 mantissa bits (rounding error up to 1/16 per weight),
  // BF16 8. Every expert is selected here, so FP8 noise cannot flip a routing decision (with
  // top-k routing a flipped expert changes the output by far more than the weights' error).
  nlohmann::json all = kV3;
  all.merge_patch({{"num_experts_per_tok", 8}, {"n_group", 1}, {"topk_group", 1}});
  auto f32 = test::all_position_logits(synth_v3(dir + "/all_f32", DType::F32, all), kIds);
  auto bf16 = test::all_position_logits(synth_v3(dir + "/all_bf16", DType::BF16, all), kIds);
  auto fp8a = test::all_position_logits(synth_v3(dir + "/all_fp8", DType::F8_E4M3, all), kIds);
  const double e_fp8 = test::rel_err(fp8a, f32), e_bf16 = test::rel_err(bf16, f32);
  std::printf("vs F32: FP8 %.3g, BF16 %.3g (relative to max |logit|)\n", e_fp8, e_bf16);
  EXPECT_LT(test::rel_err(fp8a, bf16), 0.15);
  EXPECT_LT(e_bf16, 0.02);
}

// MiniMax-M2 ships FP8 block-scaled weights as DeepSeek-V3 does (attention and every expert):
// through the GQA MoE class they give exactly the logits of their dequantized values.
TEST(DeepseekCheckpoint, MiniMaxM2Fp8MatchesItsDequantizedTwin) {
  const std::string dir = test::temp_dir("minimax_fp8");
  SynthOptions o;
  o.arch = "minimax_m2";
  o.config = {{"hidden_size", 256}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
              {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_local_experts", 8},
              {"num_experts_per_tok", 2}, {"rotary_dim", 32}};
  o.seed = 43;
  o.type = DType::F8_E4M3;
  o.out = dir + "/fp8";
  synth_model(o);
  LoadOptions lo;
  lo.prefault = false;
  auto mf = load_model_file(o.out, lo);
  for (const char* name : {"blk.1.ffn_up_exps.5.weight", "blk.0.attn_q.weight"}) {
    const Tensor& t = mf->get(name);
    EXPECT_EQ(t.dtype, DType::F8_E4M3) << name;
    EXPECT_TRUE(t.block_scale) << name << " keeps its 128x128 scales";
  }
  auto fp8 = test::all_position_logits(o.out, kIds);
  dequantize_fp8_dir(o.out, dir + "/deq");
  auto deq = test::all_position_logits(dir + "/deq", kIds);
  EXPECT_LT(test::rel_err(fp8, deq), 1e-4);
}

// Writes config.json of `dir` with `patch` applied.
void patch_config(const std::string& dir, const nlohmann::json& patch) {
  std::ifstream in(dir + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  in.close();
  cfg.merge_patch(patch);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

std::string load_error(const std::string& path) {
  try {
    load_model(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeepseekCheckpoint, MalformedConfigsAreRefused) {
  const std::string dir = test::temp_dir("ds_bad");
  nlohmann::json small = kV3;
  small.merge_patch({{"hidden_size", 64}, {"q_lora_rank", 32}, {"kv_lora_rank", 32}, {"moe_intermediate_size", 32}});
  struct Case {
    nlohmann::json patch;
    std::string expect;
  };
  for (const Case& c : {Case{{{"num_experts_per_tok", 9}}, "experts per token = 9"},
                        Case{{{"n_group", 3}}, "expert group count = 3"},
                        Case{{{"topk_group", 4}}, "topk_group"},
                        Case{{{"qk_rope_head_dim", 7}}, "head dim = 39"},
                        Case{{{"kv_lora_rank", 48}}, "attn_kv_a_mqa"},
                        Case{{{"n_routed_experts", nullptr}}, "n_routed_experts"},
                        Case{{{"num_experts_per_tok", "two"}}, "num_experts_per_tok"}}) {
    const std::string d = synth_v3(dir + "/m", DType::F32, small);
    patch_config(d, c.patch);
    const std::string err = load_error(d);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.patch.dump() << " gave: '" << err << "'";
    EXPECT_NE(err.find(d), std::string::npos) << "names the model: " << err;
  }
}

TEST(DeepseekCheckpoint, Fp8WithoutScalesIsRefused) {
  const std::string dir = test::temp_dir("ds_noscale");
  const std::string src = synth_v3(dir + "/fp8", DType::F8_E4M3);
  const std::string dst = dir + "/cut";
  std::filesystem::create_directories(dst);
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
  {
    auto set = SafetensorsSet::open_dir(src);
    SafetensorsWriter w;
    for (auto& [name, t] : set->all())
      if (name != "model.layers.1.mlp.experts.2.up_proj.weight_scale_inv")
        w.add(name, t->type, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes));
    w.write(dst + "/model.safetensors");
  }
  const std::string err = load_error(dst);
  EXPECT_NE(err.find("blk.1.ffn_up_exps.2.weight' has no weight_scale_inv"), std::string::npos) << err;
}

// `inspect` says whether the file kept the multi-token-prediction layer it declares (some
// conversions drop it): a checkpoint with it, and the same config.json over a file without it.
TEST(DeepseekCheckpoint, InspectSaysWhetherTheMtpLayerIsThere) {
  nlohmann::json cfg = kV3;
  cfg["num_nextn_predict_layers"] = 1;
  const std::string dir = test::temp_dir("ds_inspect_mtp");
  const std::string with = synth_v3(dir + "/with", DType::F32, cfg);
  int rc = 0;
  std::string out = test::run_command(test::fastpath_bin() + " inspect -m " + with + " 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("mtp:          1 multi-token-prediction layer(s) after the " + std::to_string(kV3["num_hidden_layers"].get<int>()) +
                     "; the first drafts with --speculative-method mtp"),
            std::string::npos)
      << out;
  const std::string without = synth_v3(dir + "/without", DType::F32);
  test::write_file(without + "/config.json", nlohmann::json::parse(test::read_file(with + "/config.json")).dump());
  out = test::run_command(test::fastpath_bin() + " inspect -m " + without + " 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("declared, but blk."), std::string::npos) << out;
  EXPECT_NE(out.find("are not in the file: no MTP drafts"), std::string::npos) << out;
  out = test::run_command(test::fastpath_bin() + " generate -m " + without + " --tokenizer x -n 2 --speculative-method mtp 2>&1", &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("the conversion dropped them"), std::string::npos) << out;
}

TEST(DeepseekCheckpoint, InspectPrintsLatentKvBytesPerToken) {
  // DeepSeek-V3's attention shape (kv_lora 512, rope 64, nope 128, v 128), narrowed elsewhere.
  nlohmann::json cfg = kV3;
  cfg.merge_patch({{"hidden_size", 64}, {"num_hidden_layers", 2}, {"q_lora_rank", 32}, {"kv_lora_rank", 512},
                   {"qk_rope_head_dim", 64}, {"qk_nope_head_dim", 128}, {"v_head_dim", 128}, {"moe_intermediate_size", 32},
                   {"intermediate_size", 64}});
  const std::string d = synth_v3(test::temp_dir("ds_inspect") + "/m.gguf", DType::F16, cfg);
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " inspect -m " + d + " 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  // (512 + 64) values x 2 layers x 4 bytes; expanded K/V: 2 x 4 heads x (192 + 128) x 4.
  EXPECT_NE(out.find("kv cache:     4608 bytes per token (2 layers x 576 f32 values: MLA latent kv_lora 512 + rope 64; "
                     "expanded K/V would be 10240); 2304 in f16/bf16 (--kv-cache-dtype)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("MLA (q_lora 32, kv_lora 512, nope 128, rope 64, v 128)"), std::string::npos) << out;
  EXPECT_NE(out.find("MoE 8 experts top-2"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
