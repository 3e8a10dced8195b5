// tests/mpi/mpi_test_util.h — the world communicator of the MPI test binary, a skip for tests
// that need several ranks, and the small MoE shapes the split tests share.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "parallel/communicator.h"

namespace fp::test {

// The communicator main() opened (MPI under mpirun, single otherwise).
inline std::shared_ptr<Communicator> world_comm() { return open_world(launched_world_size()); }

#define FP_REQUIRE_RANKS(n)                                                                   \
  do {                                                                                        \
    if (::fp::launched_world_size() < (n)) GTEST_SKIP() << "needs mpirun -np " << (n) << " or more"; \
  } while (0)

// Small MoE shapes: qwen3moe (GQA 12 / 6 heads, a dense layer) and DeepSeek (MLA with q_lora,
// a shared expert, a dense first layer).
inline nlohmann::json moe_config(const std::string& arch) {
  if (arch == "qwen3_moe")
    return {{"hidden_size", 64},  {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 256}, {"num_experts", 6},
            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96}, {"mlp_only_layers", {1}}};
  return {{"hidden_size", 64}, {"num_attention_heads", 2}, {"intermediate_size", 96}, {"num_hidden_layers", 3},
          {"vocab_size", 256}, {"n_routed_experts", 6}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96},
          {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"q_lora_rank", 32}, {"kv_lora_rank", 32},
          {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};
}

}  // namespace fp::test
