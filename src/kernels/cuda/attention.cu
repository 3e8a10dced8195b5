// kernels/cuda/attention.cu — causal attention of a varlen batch over the paged KV cache
// (AttentionArgs in kernels/ops.h). One warp per (query token, head): the lanes split the head
// dimension, the warp walks the visible positions with an online softmax (running max and sum),
// reading K/V rows through the block table. F32, F16 and BF16 pools; head dims up to 256. It
// takes every option of AttentionArgs: a sliding window (the walk starts at the window), sinks
// (one more logit in the sum, with no value) and soft-capped scores.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimPerLane = 8;  // head_dim and v_dim <= 256

struct Params {
  const float* q;
  const int32_t* pos;
  int64_t n;
  const int32_t* seq_indptr;
  int64_t n_seqs, n_heads, group, head_dim, v_dim;
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  int64_t k_stride, v_stride, elem_bytes;
  DType kv_dtype;
  int64_t page_size;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  float scale;
  int64_t window;
  const float* sinks;
  float softcap;
  float* out;
};

__global__ void attention_warp_kernel(Params p) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= p.n * p.n_heads) return;
  const int64_t i = warp / p.n_heads, h = warp % p.n_heads, kvh = h / p.group;
  // The sequence of token i: the last s with seq_indptr[s] <= i (binary search).
  int64_t lo = 0, hi = p.n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.seq_indptr[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  const int64_t s = lo;
  const int64_t visible = min(static_cast<int64_t>(p.pos[i]), static_cast<int64_t>(p.kv_len[s]) - 1) + 1;
  const int64_t first = p.window > 0 ? max(int64_t{0}, static_cast<int64_t>(p.pos[i]) - p.window + 1) : 0;

  float q[kMaxDimPerLane], acc[kMaxDimPerLane];
  const float* qh = p.q + (i * p.n_heads + h) * p.head_dim;
#pragma unroll
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t d = lane + 32 * r;
    q[r] = d < p.head_dim ? qh[d] * p.scale : 0.0f;
    acc[r] = 0.0f;
  }
  // A sink starts the sum: m = sink, l = e^(sink - m) = 1, no value.
  float m = p.sinks ? p.sinks[h] : -INFINITY, l = p.sinks ? 1.0f : 0.0f;
  const int32_t* pages = p.page_ids + p.page_indptr[s];
  for (int64_t t = first; t < visible; ++t) {
    const int64_t slot = static_cast<int64_t>(pages[t / p.page_size]) * p.page_size + t % p.page_size;
    const int64_t kbase = slot * p.k_stride + kvh * p.head_dim, vbase = slot * p.v_stride + kvh * p.v_dim;
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t d = lane + 32 * r;
      if (d < p.head_dim) dot += q[r] * kv_load(p.k_pool, p.kv_dtype, kbase + d);
    }
    dot = warp_sum(dot);
    if (p.softcap > 0.0f) dot = p.softcap * tanhf(dot / p.softcap);
    const float m_new = fmaxf(m, dot);
    const float correction = expf(m - m_new), weight = expf(dot - m_new);
    l = l * correction + weight;
#pragma unroll
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t d = lane + 32 * r;
      acc[r] = acc[r] * correction + (d < p.v_dim ? weight * kv_load(p.v_pool, p.kv_dtype, vbase + d) : 0.0f);
    }
    m = m_new;
  }
  float* oh = p.out + (i * p.n_heads + h) * p.v_dim;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < p.v_dim) oh[d] = acc[r] * inv;
  }
}

}  // namespace

std::string refuse_attention(const AttentionArgs& a) {
  std::string why = refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
  if (!why.empty()) return why;
  if (a.head_dim > 32 * kMaxDimPerLane || a.v_dim > 32 * kMaxDimPerLane)
    return "head_dim " + std::to_string(a.head_dim) + " / v_dim " + std::to_string(a.v_dim) + ": this kernel handles up to 256";
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) return "query heads are not a multiple of the KV heads";
  return refuse_attention_options(a, {.window = true, .sinks = true, .softcap = true});  // not chunks yet
}

void attention(const AttentionArgs& a) {
  const int64_t warps = a.n * a.n_heads;
  if (warps == 0) return;
  Params p{a.q, a.pos, a.n, a.seq_indptr, a.n_seqs, a.n_heads, a.n_heads / a.n_kv_heads, a.head_dim, a.v_dim,
           static_cast<const uint8_t*>(a.k_pool), static_cast<const uint8_t*>(a.v_pool), a.k_stride, a.v_stride,
           dtype_info(a.kv_dtype).block_bytes, a.kv_dtype, a.page_size, a.page_indptr, a.page_ids, a.kv_len, a.scale,
           a.window, a.sinks, a.softcap, a.out};
  attention_warp_kernel<<<blocks_for(warps, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream()>>>(p);
  FP_CUDA_LAUNCHED("attention");
}

}  // namespace fp::cuda
