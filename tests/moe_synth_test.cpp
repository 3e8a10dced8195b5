// tests/moe_synth_test.cpp — synth's streaming GGUF writer (used for models too big to hold as
// f32, e.g. the DeepSeek-V2-Lite-shaped benchmark model) writes the same model as the in-memory
// writer: same logits for MoE, MLA (both kv_b forms), Llama (permuted q/k rows; llama3 rope scaling)
// and gpt-oss (stacked expert biases, MXFP4 experts beside F32 attention), F16 and Q8_0 / MXFP4.
#include <gtest/gtest.h>

#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

TEST(MoeSynth, StreamingGgufEqualsInMemory) {
  const std::string dir = test::temp_dir("moe_synth_stream");
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42};
  struct Case {
    std::string arch;
    nlohmann::json config;
    bool split;
  };
  const nlohmann::json ds = {{"hidden_size", 64}, {"num_attention_heads", 2}, {"intermediate_size", 64}, {"num_hidden_layers", 2},
                             {"vocab_size", 512}, {"n_routed_experts", 4}, {"moe_intermediate_size", 32}, {"kv_lora_rank", 32},
                             {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};
  const nlohmann::json qm = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                             {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_experts", 4},
                             {"moe_intermediate_size", 32}};
  const nlohmann::json ll = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_hidden_layers", 2},
                             {"vocab_size", 512}};
  nlohmann::json ll3 = ll;  // llama3 rope scaling: rope_freqs.weight is computed, not drawn
  ll3["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  const nlohmann::json go = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                             {"intermediate_size", 32}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_local_experts", 4},
                             {"sliding_window", 3}};
  int n = 0;
  for (const Case& c : {Case{"deepseek_v3", ds, false}, Case{"deepseek_v2", ds, true}, Case{"qwen3_moe", qm, false}, Case{"llama", ll, false},
                        Case{"llama", ll3, false}, Case{"gpt_oss", go, false}})
    for (DType type : {DType::F16, c.arch == "gpt_oss" ? DType::MXFP4 : DType::Q8_0}) {
      ++n;
      std::vector<float> logits[2];
      for (int stream = 0; stream < 2; ++stream) {
        SynthOptions o;
        o.arch = c.arch;
        o.config = c.config;
        o.type = type;
        o.split_kv_b = c.split;
        o.stream = stream == 1;
        o.out = dir + "/" + c.arch + std::to_string(n) + "_" + std::to_string(stream) + ".gguf";
        synth_model(o);
        logits[stream] = test::all_position_logits(o.out, ids);
      }
      EXPECT_EQ(logits[0], logits[1]) << c.arch << " " << c.config.dump() << " " << dtype_name(type);
    }
}

}  // namespace
}  // namespace fp
