// kernels/ops_moe.h — op signatures of the Mixture-of-Experts and MLA (multi-head latent
// attention) layers: expert routing, the expert FFN over a routed batch, and MLA attention over
// a latent KV cache. Kept apart from ops.h; same conventions (F32 contiguous activations,
// weights as Tensor views in any dtype the matmul kernels take).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace fp {

enum class MoeScoring { Softmax, Sigmoid };
// How a group of experts is scored for group-limited routing: DeepSeek-V2 takes the largest
// expert score of the group, DeepSeek-V3 the sum of its two largest (bias included).
enum class MoeGroupScore { Max, Top2Sum };

// Routes each token of logits[n, n_expert] to k experts.
//   probs = softmax(logits) or sigmoid(logits); choice = probs + bias (bias optional, [n_expert]).
//   With n_group > 1: groups of n_expert / n_group consecutive experts are scored, only the best
//   topk_group groups stay eligible (the others' choice scores become `masked`).
//   ids = the k largest choice scores (ties: lower id first); weights = the unbiased probs of those,
//   divided by their sum when norm_topk (+ norm_eps), then multiplied by scale.
// ids[n, k] and weights[n, k] come out in descending choice order.
struct MoeRouteArgs {
  static constexpr const char* kName = "moe_route";
  const float* logits = nullptr;
  int64_t n = 0, n_expert = 0, k = 0;
  MoeScoring scoring = MoeScoring::Softmax;
  const float* bias = nullptr;
  int64_t n_group = 1, topk_group = 1;
  MoeGroupScore group_score = MoeGroupScore::Max;
  float masked = 0.0f;  // choice score given to experts of dropped groups (HF V2: 0, V3: -inf)
  bool norm_topk = false;
  float norm_eps = 0.0f;
  float scale = 1.0f;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  std::string shape_class() const;
};

// The expert FFN's gated activation of g = gate · x and u = up · x:
//   Silu: silu(g) * u (SwiGLU);
//   SwigluClamped (gpt-oss): g' = min(g, limit), u' = clamp(u, -limit, limit),
//     g' * sigmoid(alpha * g') * (u' + 1).
enum class MoeActivation { Silu, SwigluClamped };

// out[n, dim] = sum_j weights[i, j] * FFN_{ids[i, j]}(x[i]) + sum_s FFN_shared(x[i])
// where FFN_e(x) = down_e · act(gate_e · x + gate_bias_e, up_e · x + up_bias_e) + down_bias_e
// (the biases optional, gpt-oss's; act as `activation` says; the shared expert has no biases).
// gate/up/down point at n_expert 2-D views each: gate_e, up_e [ff, dim], down_e [dim, ff].
// The shared expert (optional: shared_gate null) has width shared_ff and weight 1, or with
// shared_logits (Qwen2-MoE's shared_expert_gate · x, [n]) weight sigmoid(shared_logits[i]).
// Expert parallel: a rank holds only experts [expert_begin, expert_end) (the other entries of
// gate/up/down are never read and may be empty); selections of other experts contribute nothing
// here, so out is this rank's partial sum, completed by an all-reduce over the ranks. The
// default range (0, -1) means every expert.
struct MoeFfnArgs {
  static constexpr const char* kName = "moe_ffn";
  const float* x = nullptr;
  int64_t n = 0, dim = 0;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int64_t k = 0;
  int64_t n_expert = 0, ff = 0;
  const Tensor* gate = nullptr;
  const Tensor* up = nullptr;
  const Tensor* down = nullptr;
  const Tensor* shared_gate = nullptr;
  const Tensor* shared_up = nullptr;
  const Tensor* shared_down = nullptr;
  int64_t shared_ff = 0;
  const float* shared_logits = nullptr;  // [n] or null (weight 1)
  int64_t expert_begin = 0, expert_end = -1;
  MoeActivation activation = MoeActivation::Silu;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;  // SwigluClamped
  const float* gate_bias = nullptr;  // [n_expert, ff] or null (also up_bias)
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;  // [n_expert, dim] or null
  float* out = nullptr;
  std::string shape_class() const;  // expert weight dtype, gemv/gemm (tokens per expert), shared, local range, activation
  // Whether the experts are plain SwiGLU without biases (what every kernel takes).
  bool plain_swiglu() const { return activation == MoeActivation::Silu && !gate_bias && !up_bias && !down_bias; }
  int64_t local_end() const { return expert_end < 0 ? n_expert : expert_end; }
  // The shared expert's weight for token i.
  float shared_weight(int64_t i) const { return shared_logits ? 1.0f / (1.0f + std::exp(-shared_logits[i])) : 1.0f; }
  // Whether expert e's selections are computed here (held by this rank).
  bool is_local(int32_t e) const { return e >= expert_begin && e < local_end(); }
};
// g[i] = act(g[i], u[i]) for i < count, as a's activation says (plain scalar code).
void moe_gated_activation(const MoeFfnArgs& a, float* g, const float* u, int64_t count);

// MLA attention of a varlen batch against a latent KV cache (DeepSeek-V2/V3).
// q[n, H, nope + rope]: per head [q_nope | q_pe], RoPE already applied to q_pe.
// The cache row of position t of sequence s (slot as in AttentionArgs) is
//   elements slot * latent_stride.. of latent_pool = [c (kv_lora, normalised) | k_pe (rope, RoPE applied)],
//   stored as kv_dtype (F32, F16 or BF16; each kernel declares which it reads).
// Head h sees key [W_UK_h c | k_pe] and value W_UV_h c, with per-head weights
//   wk[h]   [nope, kv_lora]  (latent -> k_nope; the expanded form),
//   wk_t[h] [kv_lora, nope]  (q_nope -> latent query; the absorbed form: q_nope·W_UK_h c = (W_UK_h^T q_nope)·c),
//   wv[h]   [v_dim, kv_lora] (latent -> value).
// out[n, H, v_dim] = softmax(q·k * scale) over positions 0..pos (causal) weighted sum of values.
struct MlaAttentionArgs {
  static constexpr const char* kName = "mla_attention";
  const float* q = nullptr;
  const int32_t* pos = nullptr;
  int64_t n = 0;
  int64_t n_seqs = 0;
  const int32_t* seq_indptr = nullptr;
  int64_t n_heads = 0, nope = 0, rope = 0, v_dim = 0, kv_lora = 0;
  const void* latent_pool = nullptr;
  int64_t latent_stride = 0;  // elements between slots
  DType kv_dtype = DType::F32;
  int64_t page_size = 1;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_ids = nullptr;
  const int32_t* kv_len = nullptr;
  const Tensor* wk = nullptr;
  const Tensor* wk_t = nullptr;
  const Tensor* wv = nullptr;
  float scale = 1.0f;
  float* out = nullptr;
  std::string shape_class() const;
  int64_t slot(int64_t s, int64_t t) const {
    return static_cast<int64_t>(page_ids[page_indptr[s] + t / page_size]) * page_size + t % page_size;
  }
};

}  // namespace fp
