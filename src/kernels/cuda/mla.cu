// kernels/cuda/mla.cu — MLA attention (DeepSeek-V2/V3) on the GPU in the absorbed form: attention
// runs over the latent cache rows themselves, never expanding per-head keys and values.
//
// Four launches, none of which needs the host to see a length (graph-capturable):
//   1. q_lat[i, h] = W_UK_h^T q_nope[i, h]  (block per (token, head); threads over the kv_lora
//      outputs, each summing down W_UK_h's nope rows, so a warp reads each row coalesced).
//   2. partial attention: block per (token, head, split). The S splits cut the token's visible
//      positions evenly; a split walks its positions in tiles of 64: a warp per position computes
//      the score [q_lat | q_pe] · [c | k_pe] * scale, then the online softmax (running max, sum,
//      rescale) and acc[kv_lora] += p c with threads over the latent dimensions. It writes
//      (max, sum, acc) to scratch.
//   3. combine: block per (token, head) merges its S partials into o_lat.
//   4. out[i, h] = W_UV_h o_lat[i, h]  (block per (token, head), a warp per output row).
// Per-head weights are read through weight_at (weights.cuh: every matmul dtype but block-scaled
// FP8, which the loader dequantizes for MLA) from one evenly spaced stack per matrix, as the
// DeepSeek loader's views of kv_b give (head h's rows at base + h * stride).
// Each (token, head) block reads the token's latent rows: H reads of the cache per token (from
// L2 when it fits). A block holding every head of a token (one read) is the next step.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/weights.cuh"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"

namespace fp::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kTile = 64;          // positions per online-softmax step
constexpr int kMaxLatent = 2048;   // kv_lora + rope (DeepSeek: 512 + 64)
constexpr int kPerThread = kMaxLatent / kThreads;

// Per-head matrices [rows, cols] of one dtype: head h's at base + h * stride bytes.
struct HeadStack {
  const uint8_t* base;
  int64_t stride, row_bytes;
  DType dtype;
};

struct Batch {
  const int32_t* pos;
  const int32_t* seq_indptr;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  int64_t n_seqs, page_size;
  const uint8_t* latent;  // the pool
  int64_t latent_stride;  // elements between slots
  DType kv;
};

// The sequence of token i (seq_indptr is ascending) and the positions it sees.
__device__ __forceinline__ void locate(const Batch& b, int64_t i, int64_t* s, int64_t* len) {
  *s = seq_of(b.seq_indptr, b.n_seqs, i);
  *len = min(static_cast<int64_t>(b.pos[i]) + 1, static_cast<int64_t>(b.kv_len[*s]));
}

__device__ __forceinline__ const uint8_t* latent_row(const Batch& b, int64_t s, int64_t t) {
  const int64_t slot = static_cast<int64_t>(b.page_ids[b.page_indptr[s] + t / b.page_size]) * b.page_size + t % b.page_size;
  const int64_t elem = b.kv == DType::F32 ? 4 : 2;
  return b.latent + slot * b.latent_stride * elem;
}

// 1. q_lat[i, h, c] = sum_j q[i, h, j] * wk_h[j, c]  (j < nope)
__global__ void __launch_bounds__(kThreads) q_latent_kernel(const float* __restrict__ q, int64_t H, int64_t nope, int64_t qd,
                                                            int64_t L, HeadStack wk, float* __restrict__ q_lat) {
  const int64_t ih = blockIdx.x, h = ih % H;
  __shared__ float qn[kMaxLatent];
  for (int64_t j = threadIdx.x; j < nope; j += kThreads) qn[j] = q[ih * qd + j];
  __syncthreads();
  const uint8_t* w = wk.base + h * wk.stride;
  for (int64_t c = threadIdx.x; c < L; c += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nope; ++j) acc += qn[j] * load_weight(w + j * wk.row_bytes, wk.dtype, c);
    q_lat[ih * L + c] = acc;
  }
}

// Positions [t0, t1) of sequence s for one (token, head) whose query [q_lat | q_pe] is qs (W
// floats, shared): the online softmax's running max m, sum l and acc[L] (thread-owned latent
// dimensions threadIdx.x + k * kThreads). Every thread of the block calls it; sc is shared scratch.
__device__ __forceinline__ void attend(const Batch& b, const float* qs, int64_t s, int64_t t0, int64_t t1, int64_t L,
                                       int64_t W, float scale, float* sc, float& m, float& l, float acc[kPerThread]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) acc[k] = 0.0f;
  for (int64_t tt = t0; tt < t1; tt += kTile) {
    const int64_t cnt = min(static_cast<int64_t>(kTile), t1 - tt);
    for (int64_t r = warp; r < cnt; r += kWarps) {
      const uint8_t* row = latent_row(b, s, tt + r);
      float d = 0.0f;
      for (int64_t c = lane; c < W; c += 32) d += qs[c] * load_element(row, b.kv, c);
      d = warp_sum(d);
      if (lane == 0) sc[r] = d * scale;
    }
    __syncthreads();
    float tmax = -INFINITY;
    for (int64_t r = 0; r < cnt; ++r) tmax = fmaxf(tmax, sc[r]);
    const float nm = fmaxf(m, tmax), corr = expf(m - nm);  // m = -inf at first: corr 0
    l *= corr;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) acc[k] *= corr;
    for (int64_t r = 0; r < cnt; ++r) {
      const float p = expf(sc[r] - nm);
      l += p;
      const uint8_t* row = latent_row(b, s, tt + r);
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(k) * kThreads;
        if (c < L) acc[k] += p * load_element(row, b.kv, c);
      }
    }
    m = nm;
    __syncthreads();  // sc is rewritten by the next tile
  }
}

// 2. One split of token i's positions for head h: partial (max, sum, acc[L]).
__global__ void __launch_bounds__(kThreads) partial_kernel(const float* __restrict__ q, const float* __restrict__ q_lat, Batch b,
                                                           int64_t H, int64_t nope, int64_t rope, int64_t L, float scale,
                                                           int splits, float* __restrict__ parts) {
  const int64_t ih = blockIdx.x, i = ih / H, split = blockIdx.y;
  const int64_t W = L + rope;
  __shared__ float qs[kMaxLatent];
  __shared__ float sc[kTile];
  for (int64_t c = threadIdx.x; c < W; c += kThreads) qs[c] = c < L ? q_lat[ih * L + c] : q[ih * (nope + rope) + nope + (c - L)];
  int64_t s, len;
  locate(b, i, &s, &len);
  const int64_t t0 = len * split / splits, t1 = len * (split + 1) / splits;
  float m, l, acc[kPerThread];
  __syncthreads();
  attend(b, qs, s, t0, t1, L, W, scale, sc, m, l, acc);
  float* part = parts + (ih * splits + split) * (L + 2);
  if (threadIdx.x == 0) part[0] = m, part[1] = l;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (c < L) part[2 + c] = acc[k];
  }
}

// Launches 1-4 in one block per (token, head), when there are enough of those to fill the GPU
// (prefill): q_lat, the whole softmax over the visible positions and W_UV o_lat from shared
// memory, no scratch. W_UK_h and W_UV_h are read by every token's block (from L2).
__global__ void __launch_bounds__(kThreads) fused_kernel(const float* __restrict__ q, Batch b, int64_t H, int64_t nope,
                                                         int64_t rope, int64_t L, int64_t V, float scale, HeadStack wk,
                                                         HeadStack wv, float* __restrict__ out) {
  const int64_t ih = blockIdx.x, i = ih / H, h = ih % H, W = L + rope;
  __shared__ float qn[kMaxLatent];  // q_nope, then o_lat
  __shared__ float qs[kMaxLatent];  // [q_lat | q_pe]
  __shared__ float sc[kTile];
  const float* qi = q + ih * (nope + rope);
  for (int64_t j = threadIdx.x; j < nope; j += kThreads) qn[j] = qi[j];
  for (int64_t c = L + threadIdx.x; c < W; c += kThreads) qs[c] = qi[nope + (c - L)];
  __syncthreads();
  const uint8_t* wkh = wk.base + h * wk.stride;
  for (int64_t c = threadIdx.x; c < L; c += kThreads) {
    float a = 0.0f;
    for (int64_t j = 0; j < nope; ++j) a += qn[j] * load_weight(wkh + j * wk.row_bytes, wk.dtype, c);
    qs[c] = a;
  }
  int64_t s, len;
  locate(b, i, &s, &len);
  float m, l, acc[kPerThread];
  __syncthreads();  // qs complete; qn is free again
  attend(b, qs, s, 0, len, L, W, scale, sc, m, l, acc);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (c < L) qn[c] = l > 0.0f ? acc[k] / l : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint8_t* wvh = wv.base + h * wv.stride;
  for (int64_t v = warp; v < V; v += kWarps) {
    const uint8_t* row = wvh + v * wv.row_bytes;
    float d = 0.0f;
    for (int64_t c = lane; c < L; c += 32) d += qn[c] * load_weight(row, wv.dtype, c);
    d = warp_sum(d);
    if (lane == 0) out[ih * V + v] = d;
  }
}

// 3. o_lat[i, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s
__global__ void __launch_bounds__(kThreads) combine_kernel(const float* __restrict__ parts, int splits, int64_t L,
                                                           float* __restrict__ o_lat) {
  const int64_t ih = blockIdx.x;
  const float* p = parts + ih * splits * (L + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < splits; ++sp) M = fmaxf(M, p[sp * (L + 2)]);
  float denom = 0.0f;
  for (int sp = 0; sp < splits; ++sp) {
    const float mm = p[sp * (L + 2)];
    if (mm != -INFINITY) denom += expf(mm - M) * p[sp * (L + 2) + 1];
  }
  for (int64_t c = threadIdx.x; c < L; c += kThreads) {
    float o = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      const float mm = p[sp * (L + 2)];
      if (mm != -INFINITY) o += expf(mm - M) * p[sp * (L + 2) + 2 + c];
    }
    o_lat[ih * L + c] = denom > 0.0f ? o / denom : 0.0f;
  }
}

// 4. out[i, h, v] = sum_c wv_h[v, c] * o_lat[i, h, c]
__global__ void __launch_bounds__(kThreads) out_kernel(const float* __restrict__ o_lat, int64_t H, int64_t L, int64_t V,
                                                       HeadStack wv, float* __restrict__ out) {
  const int64_t ih = blockIdx.x, h = ih % H;
  __shared__ float ol[kMaxLatent];
  for (int64_t c = threadIdx.x; c < L; c += kThreads) ol[c] = o_lat[ih * L + c];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint8_t* w = wv.base + h * wv.stride;
  for (int64_t v = warp; v < V; v += kWarps) {
    const uint8_t* row = w + v * wv.row_bytes;
    float d = 0.0f;
    for (int64_t c = lane; c < L; c += 32) d += ol[c] * load_weight(row, wv.dtype, c);
    d = warp_sum(d);
    if (lane == 0) out[ih * V + v] = d;
  }
}

bool weight_dtype_ok(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q6_K ||
         t == DType::F8_E4M3;
}

// The per-head matrices ws[0..H) as one evenly spaced stack of [rows, cols]; why not in *why.
HeadStack head_stack(const Tensor* ws, int64_t H, int64_t rows, int64_t cols, const char* what, std::string* why) {
  HeadStack s{static_cast<const uint8_t*>(ws[0].data), 0, row_bytes(ws[0].dtype, cols), ws[0].dtype};
  if (H > 1) s.stride = static_cast<const uint8_t*>(ws[1].data) - s.base;
  for (int64_t h = 0; h < H && why->empty(); ++h) {
    const Tensor& t = ws[h];
    if (!weight_dtype_ok(t.dtype) || t.block_scale) *why = std::string(what) + " weights of " + dtype_name(t.dtype) + (t.block_scale ? " with block scales" : "") + " have no CUDA MLA kernel";
    else if (t.rows() != rows || t.cols() != cols) *why = std::string(what) + " of head " + std::to_string(h) + " is " + t.shape_str();
    else if (t.dtype != s.dtype || static_cast<const uint8_t*>(t.data) != s.base + h * s.stride || t.stride[0] != s.row_bytes)
      *why = std::string(what) + " heads are not one evenly spaced stack of one dtype (head " + std::to_string(h) + ")";
  }
  return s;
}

}  // namespace

std::string refuse_mla(const MlaAttentionArgs& a) {
  std::string why = refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
  if (!why.empty()) return why;
  if (a.kv_lora + a.rope > kMaxLatent || a.nope > kMaxLatent)
    return "kv_lora + rope " + std::to_string(a.kv_lora + a.rope) + " exceeds " + std::to_string(kMaxLatent);
  if (a.n_heads < 1) return "no heads";
  head_stack(a.wk, a.n_heads, a.nope, a.kv_lora, "W_UK", &why);
  if (why.empty()) head_stack(a.wv, a.n_heads, a.v_dim, a.kv_lora, "W_UV", &why);
  return why;
}

void mla_attention(const MlaAttentionArgs& a) {
  if (a.n <= 0) return;
  std::string why;
  const HeadStack wk = head_stack(a.wk, a.n_heads, a.nope, a.kv_lora, "W_UK", &why);
  const HeadStack wv = head_stack(a.wv, a.n_heads, a.v_dim, a.kv_lora, "W_UV", &why);
  FP_CHECK(why.empty(), "mla_attention (cuda): ", why);
  const int64_t H = a.n_heads, L = a.kv_lora, NH = a.n * H;
  // Splits: enough blocks to cover the SMs about twice (decode of few tokens), at most 32; with
  // one, the fused kernel does it all.
  const int splits = static_cast<int>(std::clamp<int64_t>((2 * sm_count() + NH - 1) / NH, 1, 32));
  const Batch b{a.pos, a.seq_indptr, a.page_indptr, a.page_ids, a.kv_len, a.n_seqs, a.page_size,
                static_cast<const uint8_t*>(a.latent_pool), a.latent_stride, a.kv_dtype};
  if (splits == 1) {
    fused_kernel<<<static_cast<unsigned>(NH), kThreads, 0, stream()>>>(a.q, b, H, a.nope, a.rope, L, a.v_dim, a.scale, wk,
                                                                        wv, a.out);
    FP_CUDA_LAUNCHED("mla fused");
    return;
  }
  auto* base = static_cast<float*>(scratch(static_cast<size_t>(NH * (2 * L + splits * (L + 2))) * sizeof(float), 4));
  float* q_lat = base;
  float* o_lat = q_lat + NH * L;
  float* parts = o_lat + NH * L;
  const auto blocks = static_cast<unsigned>(NH);
  q_latent_kernel<<<blocks, kThreads, 0, stream()>>>(a.q, H, a.nope, a.nope + a.rope, L, wk, q_lat);
  FP_CUDA_LAUNCHED("mla q_latent");
  partial_kernel<<<dim3(blocks, static_cast<unsigned>(splits)), kThreads, 0, stream()>>>(a.q, q_lat, b, H, a.nope, a.rope, L,
                                                                                         a.scale, splits, parts);
  FP_CUDA_LAUNCHED("mla partial");
  combine_kernel<<<blocks, kThreads, 0, stream()>>>(parts, splits, L, o_lat);
  FP_CUDA_LAUNCHED("mla combine");
  out_kernel<<<blocks, kThreads, 0, stream()>>>(o_lat, H, L, a.v_dim, wv, a.out);
  FP_CUDA_LAUNCHED("mla out");
}

}  // namespace fp::cuda
