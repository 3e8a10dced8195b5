// kernels/ops_moe.cpp — shape classes of the MoE and MLA ops.
#include "kernels/ops_moe.h"

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
  if (shared_gate) s += " +shared";
  if (expert_begin > 0 || local_end() < n_expert)
    s += " experts " + std::to_string(expert_begin) + ".." + std::to_string(local_end() - 1) + " of " + std::to_string(n_expert);
  return s;
}

std::string MlaAttentionArgs::shape_class() const {
  return "lora=" + std::to_string(kv_lora) + " rope=" + std::to_string(rope) + " nope=" + std::to_string(nope) +
         " v=" + std::to_string(v_dim) + (n == n_seqs ? " decode" : " prefill") + " page=" + std::to_string(page_size) +
         " kv=" + dtype_name(kv_dtype);
}

}  // namespace fp
