// kernels/cuda/attention_mma_pipelined.cu — paged causal attention for prefill (kernel
// "mma_pipelined"): the `mma` kernel's FlashAttention-2 loop (Q, S, P and O in registers,
// `mma.sync.m16n8k16`, F32 accumulation) with the K/V tiles copied by `cp.async` into a second
// shared-memory stage while the warps compute on the first, in the cache's own 16-bit type.
//
// What changes against `mma` (attention_mma.cu, whose comment explains the loop):
// - The operands are the cache's type (F16 or BF16, the mma's .f16 or .bf16 form): K and V rows
//   are copied as they are, 16 bytes per `cp.async` (the page table resolved per row), so a tile's
//   copy needs no registers and overlaps the previous tile's arithmetic (two stages, 69.6 KB for
//   D = 128). Q and P are rounded to that type (BF16: 8 significant bits, so the BF16 case is
//   compared with the reference at 1e-2, F16 at 3e-3 as `mma`).
// - V stays row-major; `ldmatrix.trans` hands out its B fragments (the transpose `mma` did with
//   2-byte shared stores). K's B fragments come from `ldmatrix` too, four 8 x 8 matrices per call.
//   Rows are padded by 8 halves: the 8 rows an ldmatrix phase reads start 4 banks apart.
// - The grid is (head, query tile) with the last query tiles first: under the causal mask they
//   see the most positions, and starting them first keeps the tail of the launch short.
// - A warp skips a tile's arithmetic when every one of its rows is past its causal limit there.
// Takes F16/BF16 pools with 16-byte aligned rows (strides a multiple of 8), head_dim = v_dim = 64
// or 128; the rest goes to `mma`/`tiled`. Registered below `mma` until a GPU run checks and
// times it (bench/device_check.sh: --kernel attention=mma_pipelined).
//
// ldmatrix (PTX ISA): lanes 8i..8i+7 give the row addresses of matrix i; lane L receives row
// L / 4, elements 2 (L % 4) and 2 (L % 4) + 1 of each matrix (with .trans: column L / 4, rows
// 2 (L % 4) and 2 (L % 4) + 1) — for K rows [position][d] exactly the B fragment {k = d 2t..2t+1,
// n = position g} of S = Q K^T, for V rows [position][d] transposed the B fragment {k = position
// 2t..2t+1, n = d g} of O = P V.
#include <cuda_bf16.h>
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
  const uint16_t* k_pool;
  const uint16_t* v_pool;
  int64_t k_stride, v_stride;
  int32_t page_size;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  float scale;
  float* out;
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, asynchronously; zeros where !valid (source size 0:
// nothing is read, `src` is then any mapped address).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most one committed group of this thread's copies is still in flight.
__device__ __forceinline__ void wait_all_but_newest() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Four 8 x 8 matrices of 16-bit values from shared memory (this lane's row address `row`).
__device__ __forceinline__ void ldmatrix4(uint32_t r[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix4_trans(uint32_t r[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}

// Issue the copies of the K and V rows of positions [t0, t0 + kBC) of the sequence whose pages
// start at page_indptr entry `page0` (kv head `kvh`) into one stage; rows at or past `vis` are
// zeros. Consecutive threads take consecutive 16-byte pieces of a row (coalesced reads).
template <int D>
__device__ __forceinline__ void copy_tile(const Params& p, int64_t page0, int t0, int vis, int64_t kvh, uint16_t* ks,
                                          uint16_t* vs) {
  constexpr int kChunks = D / 8, kLd = D + 8;
  static_assert(kBC * kChunks % kThreads == 0, "whole rounds of copies");
#pragma unroll
  for (int round = 0; round < kBC * kChunks / kThreads; ++round) {
    const int e = threadIdx.x + round * kThreads;
    const int key = e / kChunks, c8 = e % kChunks, tp = t0 + key;
    const bool valid = tp < vis;
    // No branch around the page lookup, so the rounds' page_ids loads issue back to back rather
    // than one latency each: a row past `vis` looks up position 0 (a tile is copied only when
    // vis > 0, so that entry exists) and copies nothing from the pool's start.
    const int tc = valid ? tp : 0;
    const int64_t slot = static_cast<int64_t>(__ldg(p.page_ids + page0 + tc / p.page_size)) * p.page_size + tc % p.page_size;
    const int64_t off = valid ? kvh * D + 8 * c8 : 0;
    copy16_async(ks + key * kLd + 8 * c8, p.k_pool + (valid ? slot * p.k_stride : 0) + off, valid);
    copy16_async(vs + key * kLd + 8 * c8, p.v_pool + (valid ? slot * p.v_stride : 0) + off, valid);
  }
}

template <int D, DType T>
__global__ void __launch_bounds__(kThreads, 2) attention_mma_pipelined_kernel(Params p) {
  constexpr int kLd = D + 8;         // 16-bit values per row of a K or V tile
  constexpr int kTile = kBC * kLd;   // values per tile
  constexpr int kKC = D / 16, kNT = kBC / 8, kDT = D / 8;
  extern __shared__ __align__(16) uint16_t stages[];  // [2 stages][K, V][kBC][kLd]
  __shared__ int row_vis[kBR];      // the row's visible positions
  __shared__ int64_t row_seq[kBR];  // the row's sequence (-1: no token)

  const int64_t h = blockIdx.x, kvh = h / p.group;
  const int64_t i0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kBR;  // the last (longest) rows first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBR), p.n - i0));
  const int wr = 16 * warp;  // the warp's first row in the block

  init_rows(p.seq_indptr, p.n_seqs, p.pos, p.kv_len, i0, rows, row_vis, row_seq);
  uint32_t qf[kKC][4];  // Q of the thread's rows as A fragments, scaled for exp2
  load_q<T, D>(p.q, p.n_heads, h, i0, rows, wr, p.scale, qf);

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
    int warp_limit = max(limit[0], limit[1]);
    for (int o2 = 16; o2 > 0; o2 >>= 1) warp_limit = max(warp_limit, __shfl_xor_sync(0xffffffffu, warp_limit, o2));
    const int64_t page0 = p.page_indptr[s];
    const int tiles = (vis + kBC - 1) / kBC;

    if (tiles > 0) copy_tile<D>(p, page0, 0, vis, kvh, stages, stages + kTile);
    commit_copies();
    for (int it = 0; it < tiles; ++it) {
      const int t0 = it * kBC;
      // The next tile into the other stage (its last readers passed the barrier ending the
      // previous iteration), then wait for this one: every group but the newest.
      if (it + 1 < tiles) {
        uint16_t* next = stages + ((it + 1) & 1) * 2 * kTile;
        copy_tile<D>(p, page0, t0 + kBC, vis, kvh, next, next + kTile);
      }
      commit_copies();  // possibly empty: keeps "all but the newest" meaning this tile
      wait_all_but_newest();
      __syncthreads();  // every thread's copies of this tile have landed

      if (t0 < warp_limit) {
        const uint16_t* ks = stages + (it & 1) * 2 * kTile;
        const uint16_t* vs = ks + kTile;
        const int mi = lane >> 3, mr = lane & 7;  // the matrix and row this lane addresses

        // S = Q K^T for the warp's 16 rows: kNT tiles of 8 positions, two k-chunks per ldmatrix.
        float sc[kNT][4];
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
          for (int kc = 0; kc < kKC; kc += 2) {
            uint32_t b[4];
            ldmatrix4(b, ks + (8 * j + mr) * kLd + 16 * kc + 8 * mi);
            mma_16816<T>(sc[j], qf[kc], b[0], b[1]);
            mma_16816<T>(sc[j], qf[kc + 1], b[2], b[3]);
          }
        }

        softmax_update<kNT, kDT>(sc, limit, t0, m, l, o);

        // O += P V: P's 16-position chunks as A fragments; V's B fragments for two 8-wide
        // column blocks per ldmatrix.trans (matrices: positions +0 / +8, columns +0 / +8).
#pragma unroll
        for (int kk = 0; kk < kBC / 16; ++kk) {
          uint32_t a[4];
          p_fragment<T, kNT>(sc, kk, a);
#pragma unroll
          for (int dn = 0; dn < kDT; dn += 2) {
            uint32_t b[4];
            ldmatrix4_trans(b, vs + (16 * kk + 8 * (mi & 1) + mr) * kLd + 8 * (dn + (mi >> 1)));
            mma_16816<T>(o[dn], a, b[0], b[1]);
            mma_16816<T>(o[dn + 1], a, b[2], b[3]);
          }
        }
      }
      __syncthreads();  // this stage is refilled by the next iteration's copies
    }
    r0 = r1;
  }

  store_rows<D>(p.out, p.n_heads, h, i0, rows, wr, l, o);
}

template <int D, DType T>
void launch(const Params& p) {
  constexpr size_t kBytes = size_t{2} * 2 * kBC * (D + 8) * sizeof(uint16_t);  // 2 stages of K and V
  static const bool opted = [] {  // once, at the first (eager) call: never while a graph records
    FP_CUDA(cudaFuncSetAttribute(attention_mma_pipelined_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kBytes)));
    return true;
  }();
  (void)opted;
  const dim3 grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>((p.n + kBR - 1) / kBR));
  attention_mma_pipelined_kernel<D, T><<<grid, kThreads, kBytes, stream()>>>(p);
  FP_CUDA_LAUNCHED("attention mma_pipelined");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string refuse_attention_mma_pipelined(const AttentionArgs& a) {
  if (std::string opt = refuse_attention_options(a, {}); !opt.empty()) return opt;
  if (a.kv_dtype != DType::F16 && a.kv_dtype != DType::BF16)
    return std::string("KV cache ") + dtype_name(a.kv_dtype) + ": this kernel copies F16 or BF16 rows as they are";
  if (a.head_dim != a.v_dim || (a.head_dim != 64 && a.head_dim != 128))
    return "head_dim " + std::to_string(a.head_dim) + " / v_dim " + std::to_string(a.v_dim) + ": this kernel takes 64 or 128, equal";
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(a.n_kv_heads);
  if (a.page_size < 1 || a.page_size > (int64_t{1} << 30)) return "page size " + std::to_string(a.page_size);
  if (a.k_stride % 8 != 0 || a.v_stride % 8 != 0 || !aligned16(a.k_pool) || !aligned16(a.v_pool))
    return "K/V rows not 16-byte aligned (strides " + std::to_string(a.k_stride) + " / " + std::to_string(a.v_stride) +
           " values): the tiles are copied 16 bytes at a time";
  if ((a.n + kBR - 1) / kBR > 65535) return std::to_string(a.n) + " tokens: more query tiles than the grid's y extent";
  return {};
}

void attention_mma_pipelined(const AttentionArgs& a) {
  if (a.n == 0 || a.n_heads == 0) return;
  const Params p{a.q, a.pos, a.n, a.seq_indptr, a.n_seqs, a.n_heads, a.n_heads / a.n_kv_heads,
                 static_cast<const uint16_t*>(a.k_pool), static_cast<const uint16_t*>(a.v_pool), a.k_stride, a.v_stride,
                 static_cast<int32_t>(a.page_size), a.page_indptr, a.page_ids, a.kv_len, a.scale, a.out};
  const bool f16 = a.kv_dtype == DType::F16;
  if (a.head_dim == 64) f16 ? launch<64, DType::F16>(p) : launch<64, DType::BF16>(p);
  else f16 ? launch<128, DType::F16>(p) : launch<128, DType::BF16>(p);
}

}  // namespace fp::cuda
