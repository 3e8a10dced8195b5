// kernels/cuda/attention_mma.cu — paged causal attention for prefill on the tensor cores (kernel
// "mma"): flash attention (FlashAttention-2's loop) with Q, the scores, P and O in registers,
// through `mma.sync.m16n8k16` on F16 operands with F32 accumulation.
//
// Why a second tensor-core kernel: `wmma` keeps S and O in shared memory (O read and written
// whole for every 32-position tile) and runs the softmax one row at a time; on the H200
// (2026-12-04) prefill of 4096 tokens spent 85% of its time in attention at 6-9 TFLOP/s.
//
// A block of 4 warps owns 64 consecutive query rows of one query head (head_dim = v_dim = D, 64 or
// 128); a warp owns 16 of them, and each thread two (g = lane / 4 and g + 8, the rows of the mma
// fragments). Q is loaded once into A fragments, pre-scaled by softmax_scale * log2(e) (so the
// softmax runs on exp2). The block walks its sequence's visible positions in tiles of 64: slots
// through the page table, K rows into shared memory as F16 (row-major, the B fragments of Q K^T
// are 32-bit reads of a row) and V transposed (Vt[d][position]: the B fragments of P V likewise).
// Per tile each warp computes S (16 x 64, F32 in registers), masks it (each row its own causal
// limit min(pos[i], kv_len[s] - 1) + 1), updates its rows' running max and sum (the 4 threads
// of a row meet through two shuffles), rescales O, and turns the probabilities straight into A
// fragments (F16) for O += P V. The end divides O by the sum. Rows of one block may belong to
// several sequences (the host does not see seq_indptr): the block takes each sequence's part in
// turn, the other rows masked (p = 0, correction 1), as `wmma` does.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4): A (16 x 16) registers
// {row g, cols 2t..2t+1}, {row g+8, same}, {row g, cols 2t+8..}, {row g+8, cols 2t+8..}; B
// (16 x 8, k x n) {k 2t..2t+1, n g}, {k 2t+8.., n g}; C (16 x 8) {row g, cols 2t, 2t+1},
// {row g+8, cols 2t, 2t+1}. A pair's lower 16 bits hold the lower column.
//
// Shared memory (D = 128): K 64 x 136 and Vt 128 x 72 halves (rows padded by 8 halves so the
// fragment reads of the 8 row groups fall in different banks), 36 KB. Q, K, P and V are rounded
// to F16 once each (as `wmma`): compared with the reference at 3e-3. Registered below `tiled`
// until a GPU run has checked and timed it (bench/device_check.sh times prefill with
// --kernel attention=mma).
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBR = 16 * kWarps, kBC = 64;  // query rows per block, positions per KV tile
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  const float* q;
  const int32_t* pos;
  int64_t n;
  const int32_t* seq_indptr;
  int64_t n_seqs, n_heads, group;
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  int64_t k_stride, v_stride;
  DType kv_dtype;
  bool vec16;  // F16/BF16 pools whose rows start 16-byte aligned: K/V read 8 values at a time
  int64_t page_size;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  float scale;
  float* out;
};


__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __halves2half2(to_half_clamped(lo), to_half_clamped(hi));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d += a b for one 16 x 8 tile.
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Values [8 c8, 8 c8 + 8) of the K or V row starting at element `base` of `pool`, as floats;
// zeros for a position past the visible ones (slot -1).
__device__ __forceinline__ void load_kv8(const Params& p, const uint8_t* pool, int64_t slot, int64_t stride, int64_t offset,
                                         float v[8]) {
  const int64_t base = slot * stride + offset;
  if (slot < 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = 0.0f;
  } else if (p.vec16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(pool + 2 * base));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = static_cast<uint16_t>(w[k] & 0xffffu), hi = static_cast<uint16_t>(w[k] >> 16);
      v[2 * k] = p.kv_dtype == DType::F16 ? half_bits_to_float(lo) : bf16_bits_to_float(lo);
      v[2 * k + 1] = p.kv_dtype == DType::F16 ? half_bits_to_float(hi) : bf16_bits_to_float(hi);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = kv_load(pool, p.kv_dtype, base + j);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) attention_mma_kernel(Params p) {
  constexpr int kLdK = D + 8, kLdV = kBC + 8;  // halves per row of K and of Vt
  constexpr int kKC = D / 16, kNT = kBC / 8, kDT = D / 8;
  __shared__ __align__(16) __half ks[kBC * kLdK];
  __shared__ __align__(16) __half vt[D * kLdV];
  __shared__ int64_t slots[kBC];
  __shared__ int row_vis[kBR];      // the row's visible positions
  __shared__ int64_t row_seq[kBR];  // the row's sequence (-1: no token)

  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBR, h = blockIdx.y, kvh = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBR), p.n - i0));
  const int wr = 16 * warp;  // the warp's first row in the block

  for (int r = threadIdx.x; r < kBR; r += kThreads) {
    if (r < rows) {
      const int64_t s = seq_of(p.seq_indptr, p.n_seqs, i0 + r);
      row_seq[r] = s;
      row_vis[r] = static_cast<int>(min(static_cast<int64_t>(p.pos[i0 + r]) + 1, static_cast<int64_t>(p.kv_len[s])));
    } else {
      row_seq[r] = -1;
      row_vis[r] = 0;
    }
  }

  // Q of the thread's rows as A fragments, scaled for exp2.
  const float qscale = p.scale * kLog2e;
  uint32_t qf[kKC][4];
#pragma unroll
  for (int kc = 0; kc < kKC; ++kc)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = wr + g + ((i & 1) ? 8 : 0), c = 16 * kc + 2 * t + ((i & 2) ? 8 : 0);
      float lo = 0.0f, hi = 0.0f;
      if (r < rows) {
        const float* qr = p.q + ((i0 + r) * p.n_heads + h) * D;
        lo = qr[c] * qscale;
        hi = qr[c + 1] * qscale;
      }
      qf[kc][i] = pack_half2(lo, hi);
    }

  float o[kDT][4];
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  __syncthreads();

  // Each sequence part of the block in turn: rows [r0, r1) of sequence s.
  for (int r0 = 0; r0 < rows;) {
    const int64_t s = row_seq[r0];
    int r1 = r0, vis = 0;
    while (r1 < rows && row_seq[r1] == s) vis = max(vis, row_vis[r1]), ++r1;
    // The thread's two rows: their limits in this part (0: not in it).
    int limit[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = wr + g + 8 * hr;
      limit[hr] = r >= r0 && r < r1 ? row_vis[r] : 0;
    }
    const int64_t page0 = p.page_indptr[s];
    for (int t0 = 0; t0 < vis; t0 += kBC) {
      const int cnt = min(kBC, vis - t0);
      if (threadIdx.x < kBC) {
        const int64_t tp = t0 + threadIdx.x;
        slots[threadIdx.x] = threadIdx.x < cnt ? static_cast<int64_t>(p.page_ids[page0 + tp / p.page_size]) * p.page_size +
                                                     tp % p.page_size
                                               : -1;
      }
      __syncthreads();
      // K rows (consecutive threads along a row: coalesced reads, 16-byte stores) and V columns
      // (consecutive threads along the positions: the transposed 2-byte stores fall in different
      // banks), 8 values per step; zeros past the visible positions.
      for (int e = threadIdx.x; e < kBC * (D / 8); e += kThreads) {
        const int key = e / (D / 8), c8 = e % (D / 8);
        float kv[8];
        load_kv8(p, p.k_pool, slots[key], p.k_stride, kvh * D + 8 * c8, kv);
        uint4 packed;
        packed.x = pack_half2(kv[0], kv[1]);
        packed.y = pack_half2(kv[2], kv[3]);
        packed.z = pack_half2(kv[4], kv[5]);
        packed.w = pack_half2(kv[6], kv[7]);
        *reinterpret_cast<uint4*>(ks + key * kLdK + 8 * c8) = packed;
      }
      for (int e = threadIdx.x; e < kBC * (D / 8); e += kThreads) {
        const int key = e % kBC, c8 = e / kBC;
        float vv[8];
        load_kv8(p, p.v_pool, slots[key], p.v_stride, kvh * D + 8 * c8, vv);
#pragma unroll
        for (int j = 0; j < 8; ++j) vt[(8 * c8 + j) * kLdV + key] = to_half_clamped(vv[j]);
      }
      __syncthreads();

      // S = Q K^T for the warp's 16 rows: kNT tiles of 8 positions.
      float sc[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        const __half* krow = ks + (8 * j + g) * kLdK + 2 * t;
#pragma unroll
        for (int kc = 0; kc < kKC; ++kc) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + 16 * kc);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 16 * kc + 8);
          mma_16816(sc[j], qf[kc], b0, b1);
        }
      }

      // Online softmax of the thread's two rows (registers 0-1: row g, 2-3: row g + 8).
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
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
        for (int j = 0; j < kNT; ++j)
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
        for (int dn = 0; dn < kDT; ++dn) {
          o[dn][2 * hr] *= corr;
          o[dn][2 * hr + 1] *= corr;
        }
      }

      // O += P V: P's 16-position chunks as A fragments, Vt rows as B fragments.
#pragma unroll
      for (int kk = 0; kk < kBC / 16; ++kk) {
        const uint32_t a[4] = {pack_half2(sc[2 * kk][0], sc[2 * kk][1]), pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                               pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          const __half* vrow = vt + (8 * dn + g) * kLdV + 16 * kk + 2 * t;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vrow);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vrow + 8);
          mma_16816(o[dn], a, b0, b1);
        }
      }
      __syncthreads();  // K, Vt and slots are rewritten by the next tile
    }
    r0 = r1;
  }

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = wr + g + 8 * hr;
    if (r >= rows) continue;
    float* orow = p.out + ((i0 + r) * p.n_heads + h) * D;
    const float inv = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      orow[8 * dn + 2 * t] = o[dn][2 * hr] * inv;
      orow[8 * dn + 2 * t + 1] = o[dn][2 * hr + 1] * inv;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void attention_mma(const AttentionArgs& a) {
  if (a.n == 0 || a.n_heads == 0) return;
  const bool vec16 = a.kv_dtype != DType::F32 && a.k_stride % 8 == 0 && a.v_stride % 8 == 0 && aligned16(a.k_pool) &&
                     aligned16(a.v_pool);
  const Params p{a.q, a.pos, a.n, a.seq_indptr, a.n_seqs, a.n_heads, a.n_heads / a.n_kv_heads,
                 static_cast<const uint8_t*>(a.k_pool), static_cast<const uint8_t*>(a.v_pool), a.k_stride, a.v_stride,
                 a.kv_dtype, vec16, a.page_size, a.page_indptr, a.page_ids, a.kv_len, a.scale, a.out};
  const dim3 grid(static_cast<unsigned>((a.n + kBR - 1) / kBR), static_cast<unsigned>(a.n_heads));
  if (a.head_dim == 64) attention_mma_kernel<64><<<grid, kThreads, 0, stream()>>>(p);
  else attention_mma_kernel<128><<<grid, kThreads, 0, stream()>>>(p);
  FP_CUDA_LAUNCHED("attention mma");
}

}  // namespace fp::cuda
