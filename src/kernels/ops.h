// kernels/ops.h — the op signatures. Each op is an argument struct; call it with
// dispatch(args) and the registry picks the kernel. Activations are F32 and contiguous;
// weights are Tensor views in any supported dtype. Shapes are given per field.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/tensor.h"

namespace fp {

// out[n, dim] = table[ids[i], :] (table is [vocab, dim] in any dtype).
struct EmbeddingArgs {
  static constexpr const char* kName = "embedding";
  const Tensor* table = nullptr;
  const int32_t* ids = nullptr;
  int64_t n = 0;
  float* out = nullptr;
  float scale = 1.0f;  // rows multiplied by it (Gemma: sqrt(dim)); kernels that cannot, refuse
  std::string shape_class() const;
};

// y[n, out] = x[n, in] · W^T (+ bias[out]); W is [out, in] in any supported dtype.
struct MatMulArgs {
  static constexpr const char* kName = "matmul";
  const float* x = nullptr;
  int64_t n = 0;  // rows of x (tokens)
  const Tensor* w = nullptr;
  const float* bias = nullptr;  // optional
  float* y = nullptr;
  // Optional: x already quantized to Q8_0 (n rows of K/32 blocks, as quantize_act_q8_0 makes
  // them; a fused rmsnorm writes it). Kernels that dot Q8_0/Q4_0 weights with 8-bit
  // activations use it instead of quantizing x again; the others ignore it.
  const BlockQ8_0* xq = nullptr;
  // Optional: x already as BF16 (n packed rows of K, rounded to nearest even; a fused RMSNorm
  // or SiLU-and-multiply writes it). Kernels that would convert x to BF16 first use it instead;
  // the others ignore it. Must hold exactly x's values rounded.
  const uint16_t* xb = nullptr;
  std::string shape_class() const;  // weight dtype and gemv (n <= 4) / gemv8 / gemm32 / gemm128 / gemm256 / gemm
};

// out[n, d] = x / sqrt(mean(x^2) + eps) * weight; out may alias x. Rows of x and out lie `stride`
// floats apart (0: d), so the first d values of wider rows normalise in place (DeepSeek's latent
// c inside the [c | k_pe] row).
struct RmsNormArgs {
  static constexpr const char* kName = "rmsnorm";
  const float* x = nullptr;
  const float* weight = nullptr;  // [d]
  int64_t n = 0, d = 0;
  float eps = 1e-5f;
  float* out = nullptr;
  // Optional: also out's rows quantized to Q8_0 (d % 32 == 0), written while each row is in
  // L1 — the activations of the Q8_0/Q4_0 matmuls that follow (MatMulArgs::xq), quantized once.
  BlockQ8_0* q8 = nullptr;
  int64_t stride = 0;
  // Optional residual connection fused in: the rows normalised are x + add (same row stride),
  // and that sum is written to `sum` (which may alias x) before out (which may alias add) —
  // "x += h; h = norm(x)" in one pass. Both or neither.
  const float* add = nullptr;
  float* sum = nullptr;
  // Optional: also out's rows as BF16 (n packed rows of d, rounded to nearest even) — the
  // activations of the BF16 GEMMs that follow (MatMulArgs::xb), converted once.
  uint16_t* bf16 = nullptr;
  int64_t row_stride() const { return stride ? stride : d; }
  std::string shape_class() const;
};

enum class RopeStyle { Adjacent, NeoX };  // pairs (2i, 2i+1) vs. halves (i, i + rot/2)

// Rotates x[n, n_heads, head_dim] in place: the first rot_dim values of every head, by
// angle pos[t] * inv_freq[i], i < rot_dim/2. cos/sin are multiplied by mscale (YaRN; 1 otherwise).
struct RopeArgs {
  static constexpr const char* kName = "rope";
  float* x = nullptr;
  const int32_t* pos = nullptr;  // [n]
  int64_t n = 0, n_heads = 0, head_dim = 0, rot_dim = 0;
  int64_t row_stride = 0;  // floats between tokens (>= n_heads * head_dim)
  const float* inv_freq = nullptr;  // [rot_dim / 2]
  float mscale = 1.0f;
  RopeStyle style = RopeStyle::Adjacent;
  std::string shape_class() const;
};

// Causal attention of a varlen batch of query tokens against a paged KV cache.
// The n tokens belong to n_seqs sequences: sequence s owns tokens [seq_indptr[s], seq_indptr[s+1]).
// q[n, n_heads, head_dim]; out[n, n_heads, v_dim]. Query head h reads KV head h / (n_heads / n_kv_heads).
// K/V of sequence s at position t live in slot = page_ids[page_indptr[s] + t / page_size] * page_size
// + t % page_size: element slot * k_stride + kv_head * head_dim of k_pool (likewise V with v_stride,
// v_dim). Pool elements are kv_dtype (F32, F16 or BF16; each kernel declares which it reads).
// The sequence's cache holds kv_len[s] positions; the query at position pos[i] sees 0..min(pos[i], kv_len-1).
// (The index view is FlashInfer's indptr / indices with kv_len in place of the last page's length.)
// Options, off by default:
//   window > 0: sliding-window attention, the query at pos sees only positions > pos - window
//     (gpt-oss, Gemma);
//   chunk > 0: chunked attention, the query at pos sees only positions >= pos - pos % chunk, the
//     start of its chunk (Llama 4's attention_chunk_size); with a window too, the later start;
//   sinks[n_heads]: a learned logit per head that joins the softmax's denominator and carries no
//     value, out = sum_t e^(s_t) v_t / (e^(sink_h) + sum_t e^(s_t)) (gpt-oss);
//   softcap > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap) before the
//     softmax (Gemma 2's attn_logit_softcapping).
// Each kernel declares which it takes (refuse_attention_options).
struct AttentionArgs {
  static constexpr const char* kName = "attention";
  const float* q = nullptr;
  const int32_t* pos = nullptr;
  int64_t n = 0;
  int64_t n_seqs = 0;
  const int32_t* seq_indptr = nullptr;  // [n_seqs + 1]
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, v_dim = 0;
  const void* k_pool = nullptr;
  const void* v_pool = nullptr;
  int64_t k_stride = 0, v_stride = 0;  // elements between slots
  DType kv_dtype = DType::F32;         // element type of k_pool and v_pool
  int64_t page_size = 1;
  const int32_t* page_indptr = nullptr;  // [n_seqs + 1]
  const int32_t* page_ids = nullptr;
  const int32_t* kv_len = nullptr;  // [n_seqs]
  float scale = 1.0f;
  int64_t window = 0;            // 0: full causal attention
  int64_t chunk = 0;             // 0: no chunks
  const float* sinks = nullptr;  // [n_heads] or null
  float softcap = 0.0f;          // 0: scores uncapped
  float* out = nullptr;
  std::string shape_class() const;  // head dim, GQA ratio, decode/prefill, page size, KV dtype, window, chunk, sinks, softcap
  // The first position the query at `p` sees.
  int64_t first_visible(int64_t p) const {
    const int64_t from_window = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    return chunk > 0 ? std::max(from_window, p - p % chunk) : from_window;
  }
  // The slot holding position t of sequence s.
  int64_t slot(int64_t s, int64_t t) const {
    return static_cast<int64_t>(page_ids[page_indptr[s] + t / page_size]) * page_size + t % page_size;
  }
  // Sequence s is prefill-like: at least kWideMinTokens query tokens and kWideMinRows query rows
  // (tokens x GQA ratio) per KV head. `amx_flash` computes such sequences from q * scale, K and V
  // rounded to BF16 (its twin `ref_bf16` rounds the same ones); decode stays in f32.
  static constexpr int64_t kWideMinTokens = 4, kWideMinRows = 16;
  bool wide(int64_t s) const;
};
// The options a kernel takes; refuse_attention_options gives "" when it takes every option a
// uses, else the reason.
struct AttentionOptions {
  bool window = false, chunk = false, sinks = false, softcap = false;
};
std::string refuse_attention_options(const AttentionArgs& a, AttentionOptions takes);

// Stores n tokens' K/V rows into a paged pool's layer: row i of k_rows [n, k_width] (f32) goes to
// slot slots[i] of k_pool (k_width values of dtype per slot), likewise v_rows into v_pool (skipped
// when v_width is 0, as for MLA's latent cache). F16/BF16 round to nearest even.
struct KvWriteArgs {
  static constexpr const char* kName = "kv_write";
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  DType dtype = DType::F32;
  int64_t k_width = 0, v_width = 0;
  const int64_t* slots = nullptr;  // [n]
  int64_t n = 0;
  const float* k_rows = nullptr;
  const float* v_rows = nullptr;
  std::string shape_class() const;
};

// Moves stored K/V rows between a pool's slots and packed rows, bytes as they are (no
// conversion): each packed row is the slot's K row then its V row (k_row_bytes + v_row_bytes;
// v_row_bytes is 0 for MLA's latent cache). Packing (into_pool false) copies slot slots[i] into
// packed row rows[i]; unpacking (into_pool true) copies packed row rows[i] into slot slots[i];
// rows null means row i. What ranks exchange when each computes some of a batch's K/V (context
// parallel): an F16 / BF16 cache's rows are half the bytes of f32.
struct KvMoveArgs {
  static constexpr const char* kName = "kv_move";
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  int64_t k_row_bytes = 0, v_row_bytes = 0;
  const int64_t* slots = nullptr;  // [n]
  const int32_t* rows = nullptr;   // [n] or null
  int64_t n = 0;
  void* packed = nullptr;  // rows of k_row_bytes + v_row_bytes
  bool into_pool = false;
  std::string shape_class() const;
};

// Address of element `index` of a KV pool holding `t` values (F32, F16, BF16).
inline const void* kv_element(const void* pool, DType t, int64_t index) {
  return static_cast<const uint8_t*>(pool) + index * dtype_info(t).block_bytes;
}
// A kernel's answer to a KV pool of dtype t: empty when t is in `reads`, else the reason
// ("KV cache dtype Q8_0: this kernel reads F32, F16").
std::string refuse_kv_dtype(DType t, std::initializer_list<DType> reads);

// out[n, d] = silu(gate) * up, where gate and up are rows of width d with the given row strides.
struct SiluMulArgs {
  static constexpr const char* kName = "silu_mul";
  const float* gate = nullptr;
  const float* up = nullptr;
  int64_t n = 0, d = 0;
  int64_t gate_stride = 0, up_stride = 0;  // floats between rows (0 means d)
  float* out = nullptr;
  uint16_t* bf16 = nullptr;  // optional: also out as BF16 (as RmsNormArgs::bf16)
  std::string shape_class() const;
};

// out[r, j] = gelu_tanh(gate[r, j]) * up[r, j]: GeGLU (Gemma's FFN, HF gelu_pytorch_tanh),
// gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))). Fields as SiluMulArgs.
struct GeluMulArgs {
  static constexpr const char* kName = "gelu_mul";
  const float* gate = nullptr;
  const float* up = nullptr;
  int64_t n = 0, d = 0;
  int64_t gate_stride = 0, up_stride = 0;  // floats between rows (0 means d)
  float* out = nullptr;
  uint16_t* bf16 = nullptr;  // optional: also out as BF16
  std::string shape_class() const;
};

// out[i] = a[i] + b[i] for i < n (out may alias a or b): the residual connection.
struct AddArgs {
  static constexpr const char* kName = "add";
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t n = 0;
  float* out = nullptr;
  std::string shape_class() const;
};

// LoRA updates of up to three projections that share their input (a LoRA adapter's k and v, or
// gate and up; model/lora.h): for each part p, y_p[i] += scale_p B_p (A_p x[i]) for the n rows of
// x [n, in], with A_p [rank_p, in] and B_p given transposed, bt_p = B_p^T [rank_p, out_p]: the
// update of 8 consecutive outputs is then rank_p multiply-adds of 8 wide vectors. A part's two
// matrices share one dtype, F32, F16 or BF16 (the adapter file's: 16-bit adapters are kept as
// they are, half the bytes to read per step). `low` is scratch for the n rows of scale_p A_p x of
// every part, [n, sum of the ranks].
struct LoraArgs {
  static constexpr const char* kName = "lora";
  static constexpr int kMaxParts = 3;
  struct Part {
    const Tensor* a = nullptr;
    const Tensor* bt = nullptr;
    float* y = nullptr;  // [n, out_p]
    float scale = 1.0f;  // alpha / rank (or / sqrt(rank) with rsLoRA)
  };
  const float* x = nullptr;
  int64_t n = 0;
  Part parts[kMaxParts];
  int n_parts = 0;
  float* low = nullptr;
  int64_t low_width() const;  // the sum of the parts' ranks
  std::string shape_class() const;  // "<dtype> gemv" (n <= 8) or "<dtype> gemm", the first part's dtype
};

// In place, x[i] = cap * tanh(x[i] / cap) for i < n: logit soft-capping (Gemma 2's
// final_logit_softcapping), smooth and bounded to (-cap, cap).
struct SoftcapArgs {
  static constexpr const char* kName = "softcap";
  float* x = nullptr;
  int64_t n = 0;
  float cap = 0.0f;  // > 0
  std::string shape_class() const;
};

// In-place softmax over each row of x[n, d].
struct SoftmaxArgs {
  static constexpr const char* kName = "softmax";
  float* x = nullptr;
  int64_t n = 0, d = 0;
  std::string shape_class() const;
};

// out[r] = index of the largest value of row r of x[n, d] (first on ties).
struct ArgmaxArgs {
  static constexpr const char* kName = "argmax";
  const float* x = nullptr;
  int64_t n = 0, d = 0;
  int32_t* out = nullptr;
  std::string shape_class() const;
};

// A step's input tokens taken from the ids the step before it sampled, where those are (the
// engine's overlapped scheduling launches a step before the last one's tokens reached the
// host): tokens[i] = ids[from_row[i]] where from_row[i] >= 0, unchanged where it is -1, i < n.
struct TokenFeedArgs {
  static constexpr const char* kName = "token_feed";
  int32_t* tokens = nullptr;
  const int32_t* from_row = nullptr;
  const int32_t* ids = nullptr;
  int64_t n = 0;
  std::string shape_class() const;
};

// One logit row's sampling settings (engine/sampler.h): temperature <= 0 is greedy; top_k <= 0,
// top_p >= 1 and min_p <= 0 are off; u in [0, 1) is the row's uniform draw, made by the caller
// from the request's seeded generator so that a row samples the same token wherever it runs.
struct SampleRow {
  double u = 0;
  float temperature = 0, top_p = 1, min_p = 0;
  int32_t top_k = 0;
};

// out[r] = the token row r of x[n, d] samples under rows[r] (rows in the same memory as x):
// candidates sorted by logit, larger first and the lower id on ties (a NaN counts as -inf); the
// top_k of them; softmax with the temperature; top-p keeps the shortest prefix whose mass reaches
// top_p (at least one); min-p drops those below min_p times the first's probability; then the
// first candidate whose running mass exceeds u times the mass kept. Greedy rows, and rows whose
// largest logit is not finite, take the first candidate.
struct SampleArgs {
  static constexpr const char* kName = "sample";
  const float* x = nullptr;
  int64_t n = 0, d = 0;
  const SampleRow* rows = nullptr;
  int32_t* out = nullptr;
  std::string shape_class() const;
};

}  // namespace fp
