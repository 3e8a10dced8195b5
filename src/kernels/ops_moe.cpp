// kernels/ops_moe.cpp — shape classes of the MoE and MLA ops.
#include "kernels/ops_moe.h"

#include <algorithm>
#include <cmath>

namespace fp {

std::string MoeRouteArgs::shape_class() const {
  return std::string(scoring == MoeScoring::Sigmoid ? "sigmoid" : "softmax") + " e=" + std::to_string(n_expert) +
         " k=" + std::to_string(k) + (n_group > 1 ? " grouped" : "") + (bias ? " +bias" : "");
}

std::string MoeFfnArgs::shape_class() const {
  // Tokens per active expert decide between GEMV and GEMM paths of the matmul kernels.
  const Tensor& g = gate[expert_begin];  // the first expert this rank holds
  std::string s = std::string("w=") + dtype_name(g.dtype) + (n <= 4 ? " gemv" : " gemm");
  if (g.block_scale) s += " block-scaled";
  if (shared_gate) s += shared_logits ? " +gated-shared" : " +shared";
  if (activation == MoeActivation::SwigluClamped) s += " swiglu-clamped";
  if (gate_bias || up_bias || down_bias) s += " +bias";
  if (expert_begin > 0 || local_end() < n_expert)
    s += " experts " + std::to_string(expert_begin) + ".." + std::to_string(local_end() - 1) + " of " + std::to_string(n_expert);
  return s;
}

void moe_gated_activation(const MoeFfnArgs& a, float* g, const float* u, int64_t count) {
  if (a.activation == MoeActivation::Silu) {
    for (int64_t i = 0; i < count; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return;
  }
  const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
  for (int64_t i = 0; i < count; ++i) {
    const float gc = std::min(g[i], lim), uc = std::clamp(u[i], -lim, lim);
    g[i] = gc / (1.0f + std::exp(-alpha * gc)) * (uc + 1.0f);
  }
}

std::string MlaAttentionArgs::shape_class() const {
  return "lora=" + std::to_string(kv_lora) + " rope=" + std::to_string(rope) + " nope=" + std::to_string(nope) +
         " v=" + std::to_string(v_dim) + (n == n_seqs ? " decode" : " prefill") + " page=" + std::to_string(page_size) +
         " kv=" + dtype_name(kv_dtype);
}

}  // namespace fp
