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
// Fragment layouts and the steps both register-resident kernels share: attention_mma_common.cuh.
//
// Shared memory (D = 128): K 64 x 136 and Vt 128 x 72 halves (rows padded by 8 halves so the
// fragment reads of the 8 row groups fall in different banks), 36 KB. Q, K, P and V are rounded
// to F16 once each (as `wmma`): compared with the reference at 3e-3. Registered below `tiled`
// until a GPU run has checked and timed it (bench/device_check.sh times prefill with
// --kernel attention=mma).
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/attention_mma_common.cuh"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

using namespace mma_attention;

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

  init_rows(p.seq_indptr, p.n_seqs, p.pos, p.kv_len, i0, rows, row_vis, row_seq);
  uint32_t qf[kKC][4];  // Q of the thread's rows as A fragments, scaled for exp2
  load_q<DType::F16, D>(p.q, p.n_heads, h, i0, rows, wr, p.scale, qf);

  float o[kDT][4];
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  __syncthreads();

  // Each sequence part of the block in turn: rows [r0, r1) of sequence s.
  for (int r0 = 0; r0 < rows;) {
    int vis = 0, limit[2];
    const int r1 = part_of(row_seq, row_vis, rows, r0, wr, vis, limit);
    const int64_t s = row_seq[r0];
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
        packed.x = pack2<DType::F16>(kv[0], kv[1]);
        packed.y = pack2<DType::F16>(kv[2], kv[3]);
        packed.z = pack2<DType::F16>(kv[4], kv[5]);
        packed.w = pack2<DType::F16>(kv[6], kv[7]);
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
          mma_16816<DType::F16>(sc[j], qf[kc], b0, b1);
        }
      }

      softmax_update<kNT, kDT>(sc, limit, t0, m, l, o);

      // O += P V: P's 16-position chunks as A fragments, Vt rows as B fragments.
#pragma unroll
      for (int kk = 0; kk < kBC / 16; ++kk) {
        uint32_t a[4];
        p_fragment<DType::F16, kNT>(sc, kk, a);
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          const __half* vrow = vt + (8 * dn + g) * kLdV + 16 * kk + 2 * t;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vrow);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vrow + 8);
          mma_16816<DType::F16>(o[dn], a, b0, b1);
        }
      }
      __syncthreads();  // K, Vt and slots are rewritten by the next tile
    }
    r0 = r1;
  }

  store_rows<D>(p.out, p.n_heads, h, i0, rows, wr, l, o);
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
