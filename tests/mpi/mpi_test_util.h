// tests/mpi/mpi_test_util.h — the world communicator of the MPI test binary, a skip for tests
// that need several ranks, the small MoE shapes the split tests share, and their checks (logits
// of a prompt and decode steps, greedy tokens, relative difference).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace fp::test {

// The communicator main() opened (MPI under mpirun, single otherwise).
inline std::shared_ptr<Communicator> world_comm() { return open_world(launched_world_size()); }

#define FP_REQUIRE_RANKS(n)                                                                   \
  do {                                                                                        \
    if (::fp::launched_world_size() < (n)) GTEST_SKIP() << "needs mpirun -np " << (n) << " or more"; \
  } while (0)

// Small MoE shapes: qwen3moe (GQA 12 / 6 heads, a dense layer), Qwen2-MoE (the same with q/k/v
// biases and a gated shared expert), Mixtral (every layer sparse), GraniteMoeShared (Mixtral's
// experts beside an ungated shared one, Granite's multipliers), MiniMax-M2 (q/k norms over the
// whole projection, sigmoid routing with a bias), ERNIE 4.5 MoE (softmax routing with a bias,
// shared experts, adjacent rotary pairs), Llama 4 (top-1 experts with the score on their input
// beside a shared expert, chunked attention, a NoPE layer), GLM-4.5 (GQA 12 / 6 heads with
// q/k/v biases, half of each head rotated, grouped sigmoid routing, a shared expert, a dense
// first layer) and DeepSeek (MLA with q_lora, a shared expert, a dense first layer).
inline nlohmann::json moe_config(const std::string& arch) {
  if (arch == "qwen3_moe")
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_experts", 6},
            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96}, {"mlp_only_layers", {1}}};
  if (arch == "qwen2_moe")  // q/k/v biases, a dense layer, a gated shared expert of width 96
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_experts", 6},
            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96}, {"shared_expert_intermediate_size", 96},
            {"mlp_only_layers", {1}}};
  if (arch == "mixtral")  // every layer MoE, experts as wide as intermediate_size
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_local_experts", 6},
            {"num_experts_per_tok", 2}};
  if (arch == "granitemoeshared")  // Mixtral's experts, an ungated shared expert of width 96, Granite's multipliers
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_local_experts", 6},
            {"num_experts_per_tok", 2}, {"shared_intermediate_size", 96}, {"embedding_multiplier", 12.0},
            {"residual_multiplier", 0.22}, {"attention_multiplier", 0.0625}, {"logits_scaling", 6.0}};
  if (arch == "minimax_m2")  // q/k norms over the whole projection (summed across ranks), RoPE on half of each head
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_local_experts", 6},
            {"num_experts_per_tok", 2}, {"rotary_dim", 8}};
  if (arch == "ernie4_5_moe")  // adjacent rotary pairs, a dense first layer, a softmax router with a selection bias, 2 shared experts
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"moe_num_experts", 6},
            {"moe_k", 2}, {"moe_intermediate_size", 96}, {"moe_num_shared_experts", 2}, {"moe_layer_start_index", 1}};
  if (arch == "hunyuan_v1_moe")  // q/k norms after RoPE, every layer sparse, a shared MLP of intermediate_size
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_experts", 6}, {"moe_topk", 2}};
  if (arch == "llama4_text")  // layers 1 and 3 sparse (top-1, score on the input, a shared expert); 0-2 chunked, 3 NoPE
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"intermediate_size_mlp", 64}, {"num_hidden_layers", 4}, {"vocab_size", 256},
            {"num_local_experts", 6}, {"interleave_moe_layer_step", 2}, {"attention_chunk_size", 3}, {"floor_scale", 4},
            {"attn_scale", 0.5}};
  if (arch == "gpt_oss")  // every layer MoE; biases, sinks; layers 0 and 2 windowed
    return {{"hidden_size", 64},     {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3},   {"vocab_size", 256},        {"num_local_experts", 6},
            {"num_experts_per_tok", 2}, {"sliding_window", 4}};
  if (arch == "glm4_moe")
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"n_routed_experts", 6},
            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96}, {"n_shared_experts", 1},
            {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}, {"routed_scaling_factor", 2.5},
            {"num_nextn_predict_layers", 1}};
  return {{"hidden_size", 64}, {"num_attention_heads", 2}, {"intermediate_size", 96}, {"num_hidden_layers", 3},
          {"vocab_size", 256}, {"n_routed_experts", 6}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96},
          {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"q_lora_rank", 32}, {"kv_lora_rank", 32},
          {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};
}

// The largest absolute difference of a from b relative to b's largest magnitude (1e30 when the
// sizes differ or b is all zeros).
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, mx = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    e = std::max(e, static_cast<double>(std::fabs(a[i] - b[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
  }
  return a.size() == b.size() && mx > 0 ? e / mx : 1e30;
}

// Logits of a prompt fed as one batch (every position), then of `decode` tokens fed one by one
// (on a device the first decode step is recorded as a graph, the later ones replay it).
inline std::vector<float> run_logits(Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& decode,
                                     DType kv = DType::F32) {
  const int64_t V = m.config().n_vocab, n = static_cast<int64_t>(prompt.size());
  auto cache = m.new_cache(n + static_cast<int64_t>(decode.size()), 0, kv);
  std::vector<float> out(static_cast<size_t>((n + static_cast<int64_t>(decode.size())) * V));
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  m.forward(prompt.data(), pos.data(), n, *cache, out.data(), true);
  for (size_t i = 0; i < decode.size(); ++i) {
    int32_t p = static_cast<int32_t>(n + static_cast<int64_t>(i));
    m.forward(&decode[i], &p, 1, *cache, out.data() + p * V, false);
  }
  return out;
}

// n greedy tokens after the prompt (end-of-generation tokens do not stop it).
inline std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  GenerateRequest r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.stop_at_eog = false;
  return generate(m, r).tokens;
}

}  // namespace fp::test
