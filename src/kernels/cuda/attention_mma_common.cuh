// kernels/cuda/attention_mma_common.cuh — what the two register-resident flash-attention kernels
// (`mma`: attention_mma.cu, `mma_pipelined`: attention_mma_pipelined.cu) share: the block shape,
// the `mma.sync.m16n8k16` step and operand packing (F16 or BF16), the rows' sequences and causal
// limits, Q's A fragments, the online-softmax update of a thread's two rows, P as A fragments,
// and the output rows. The kernels differ only in how a K/V tile reaches shared memory and how
// its B fragments are read; attention_mma.cu's comment explains the loop.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4): A (16 x 16) registers
// {row g, cols 2t..2t+1}, {row g+8, same}, {row g, cols 2t+8..}, {row g+8, cols 2t+8..}; B
// (16 x 8, k x n) {k 2t..2t+1, n g}, {k 2t+8.., n g}; C (16 x 8) {row g, cols 2t, 2t+1},
// {row g+8, cols 2t, 2t+1}. A pair's lower 16 bits hold the lower column.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/device_math.cuh"

namespace fp::cuda::mma_attention {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBR = 16 * kWarps, kBC = 64;  // query rows per block, positions per KV tile
constexpr float kLog2e = 1.4426950408889634f;

// Two floats as one 32-bit pair of the operand type T (F16, clamped to its range, or BF16).
template <DType T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (T == DType::F16) {
    const __half2 v = __halves2half2(to_half_clamped(lo), to_half_clamped(hi));
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// d += a b for one 16 x 8 tile, operands of type T, F32 accumulation.
template <DType T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (T == DType::F16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The block's rows [0, rows) from token i0: each row's sequence and visible positions
// min(pos + 1, kv_len); rows past `rows` get sequence -1 and nothing visible.
__device__ __forceinline__ void init_rows(const int32_t* seq_indptr, int64_t n_seqs, const int32_t* pos,
                                          const int32_t* kv_len, int64_t i0, int rows, int row_vis[kBR],
                                          int64_t row_seq[kBR]) {
  for (int r = threadIdx.x; r < kBR; r += kThreads) {
    if (r < rows) {
      const int64_t s = seq_of(seq_indptr, n_seqs, i0 + r);
      row_seq[r] = s;
      row_vis[r] = static_cast<int>(min(static_cast<int64_t>(pos[i0 + r]) + 1, static_cast<int64_t>(kv_len[s])));
    } else {
      row_seq[r] = -1;
      row_vis[r] = 0;
    }
  }
}

// The part of the block's rows that starts at r0 (rows of sequence row_seq[r0]): returns its end
// r1; vis = the most positions any of its rows sees; limit = the thread's two rows' visible
// positions in this part (0: not in it).
__device__ __forceinline__ int part_of(const int64_t row_seq[kBR], const int row_vis[kBR], int rows, int r0, int wr,
                                       int& vis, int limit[2]) {
  const int g = (threadIdx.x & 31) >> 2;
  const int64_t s = row_seq[r0];
  int r1 = r0;
  vis = 0;
  while (r1 < rows && row_seq[r1] == s) vis = max(vis, row_vis[r1]), ++r1;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = wr + g + 8 * hr;
    limit[hr] = r >= r0 && r < r1 ? row_vis[r] : 0;
  }
  return r1;
}

// Q of the thread's rows (block rows wr + g and wr + g + 8 of head h) as A fragments of type
// T, pre-scaled by scale * log2(e) for the exp2 softmax; zeros past `rows`.
template <DType T, int D>
__device__ __forceinline__ void load_q(const float* q, int64_t n_heads, int64_t h, int64_t i0, int rows, int wr,
                                       float scale, uint32_t qf[D / 16][4]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const float qscale = scale * kLog2e;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = wr + g + ((i & 1) ? 8 : 0), c = 16 * kc + 2 * t + ((i & 2) ? 8 : 0);
      float lo = 0.0f, hi = 0.0f;
      if (r < rows) {
        const float* qr = q + ((i0 + r) * n_heads + h) * D;
        lo = qr[c] * qscale;
        hi = qr[c + 1] * qscale;
      }
      qf[kc][i] = pack2<T>(lo, hi);
    }
}

// The online softmax of the thread's two rows over one tile's scores S (registers 0-1: row g,
// 2-3: row g + 8; positions t0 + 8 j + 2 t + e): positions at or past a row's limit masked, the
// running max m and sum l updated (the 4 threads of a row meet through two shuffles), O rescaled,
// and S replaced by the probabilities P = exp2(S - m).
template <int NT, int DT>
__device__ __forceinline__ void softmax_update(float sc[NT][4], const int limit[2], int t0, float m[2], float l[2],
                                               float o[DT][4]) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = t0 + 8 * j + 2 * t + e;
        float& v = sc[j][2 * hr + e];
        if (key >= limit[hr]) v = -INFINITY;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hr], mx);
    // A row with nothing visible yet keeps m = -inf (base 0: its p are exp2(-inf) = 0). The
    // correction is exp2(m_old - m_new); 0 while m_old is -inf, where O and l are still 0.
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = exp2f(m[hr] - base);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = sc[j][2 * hr + e];
        v = exp2f(v - base);  // exp2(-inf) = 0
        sum += v;
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l[hr] = l[hr] * corr + sum;
    m[hr] = m_new;
#pragma unroll
    for (int dn = 0; dn < DT; ++dn) {
      o[dn][2 * hr] *= corr;
      o[dn][2 * hr + 1] *= corr;
    }
  }
}

// P's positions [16 kk, 16 kk + 16) as the A fragment of O += P V (C fragments of S tiles 2 kk
// and 2 kk + 1 are exactly its two column halves).
template <DType T, int NT>
__device__ __forceinline__ void p_fragment(const float sc[NT][4], int kk, uint32_t a[4]) {
  a[0] = pack2<T>(sc[2 * kk][0], sc[2 * kk][1]);
  a[1] = pack2<T>(sc[2 * kk][2], sc[2 * kk][3]);
  a[2] = pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
  a[3] = pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
}

// The thread's two output rows, O / l (0 where nothing was visible).
template <int D>
__device__ __forceinline__ void store_rows(float* out, int64_t n_heads, int64_t h, int64_t i0, int rows, int wr,
                                           const float l[2], const float o[D / 8][4]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = wr + g + 8 * hr;
    if (r >= rows) continue;
    float* orow = out + ((i0 + r) * n_heads + h) * D;
    const float inv = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      orow[8 * dn + 2 * t] = o[dn][2 * hr] * inv;
      orow[8 * dn + 2 * t + 1] = o[dn][2 * hr + 1] * inv;
    }
  }
}

}  // namespace fp::cuda::mma_attention
