// kernels/cuda/attention_wmma.cu — paged causal attention for prefill on the tensor cores
// (kernel "wmma"): flash attention with Q K^T and P V as F16 x F16 -> F32 WMMA tiles.
//
// A block of 4 warps owns 64 rows: consecutive query tokens of one query head (head_dim = v_dim =
// D, 64 or 128). Q is converted to F16 in shared memory once. The block walks its sequence's
// visible positions in tiles of 32: slots through the page table, K and V rows converted to F16
// in shared memory; each warp computes its 16 rows' scores S = Q K^T (16 x 32, F32) with WMMA,
// scales and masks them (every row its own causal limit min(pos[i], kv_len[s] - 1) + 1), runs
// the online softmax per row (running max m, sum l; P written as F16 over its own S row), scales
// its rows of O (F32, shared) by the correction and adds P V with WMMA (O loaded as the
// accumulator, stored back). The end divides O by l. Rows of one tile may belong to several
// sequences (the host does not see seq_indptr): the block takes each sequence's part in turn, the
// other rows masked (p = 0, correction 1).
//
// Shared memory (D = 128): Q 64 x 136 and K, V 32 x 136 halves, S 64 x 36 floats (P aliased),
// O 64 x 132 floats, about 78 KB (opt-in beyond 48 KB: sm_80 164 KB, sm_89 99 KB, sm_90 227 KB).
// Inputs in F16 (11-bit significands; Q, K, P and V each rounded once): compared with the
// reference at 2e-3. Registered below the SIMT `tiled` kernel until a GPU run has checked and
// timed it (bench/device_check.sh times prefill with --kernel attention=wmma).
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBR = 64, kBC = 32;  // query rows per block, positions per KV tile

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
  int64_t page_size;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  float scale;
  float* out;
};

template <int D>
struct Layout {
  static constexpr int ldh = D + 8;    // halves per Q / K / V row
  static constexpr int lds = kBC + 4;  // floats per S row (P: 2 * lds halves)
  static constexpr int ldo = D + 4;    // floats per O row
  static constexpr size_t q_off = 0;
  static constexpr size_t k_off = q_off + sizeof(__half) * kBR * ldh;
  static constexpr size_t v_off = k_off + sizeof(__half) * kBC * ldh;
  static constexpr size_t s_off = v_off + sizeof(__half) * kBC * ldh;
  static constexpr size_t o_off = s_off + sizeof(float) * kBR * lds;
  static constexpr size_t bytes = o_off + sizeof(float) * kBR * ldo;
};


template <int D>
__global__ void __launch_bounds__(kThreads) attention_wmma_kernel(Params p) {
  using L = Layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* qs = reinterpret_cast<__half*>(smem + L::q_off);
  __half* ks = reinterpret_cast<__half*>(smem + L::k_off);
  __half* vs = reinterpret_cast<__half*>(smem + L::v_off);
  float* ss = reinterpret_cast<float*>(smem + L::s_off);
  __half* ps = reinterpret_cast<__half*>(smem + L::s_off);  // P row r over S row r: ld 2 * lds
  float* os = reinterpret_cast<float*>(smem + L::o_off);
  __shared__ int64_t slots[kBC];
  __shared__ float row_m[kBR], row_l[kBR], row_corr[kBR];
  __shared__ int row_vis[kBR];   // the row's visible positions
  __shared__ int64_t row_seq[kBR];  // the row's sequence (-1: no token)

  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBR, h = blockIdx.y, kvh = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBR), p.n - i0));

  // Q rows as F16, O = 0, per-row state.
  for (int e = threadIdx.x; e < kBR * D; e += kThreads) {
    const int r = e / D, d = e % D;
    qs[r * L::ldh + d] = to_half_clamped(r < rows ? p.q[((i0 + r) * p.n_heads + h) * D + d] : 0.0f);
  }
  for (int e = threadIdx.x; e < kBR * D; e += kThreads) os[(e / D) * L::ldo + e % D] = 0.0f;
  for (int r = threadIdx.x; r < kBR; r += kThreads) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
    if (r < rows) {
      const int64_t s = seq_of(p.seq_indptr, p.n_seqs, i0 + r);
      row_seq[r] = s;
      row_vis[r] = static_cast<int>(min(static_cast<int64_t>(p.pos[i0 + r]) + 1, static_cast<int64_t>(p.kv_len[s])));
    } else {
      row_seq[r] = -1;
      row_vis[r] = 0;
    }
  }
  __syncthreads();

  // Each sequence part of the tile in turn: rows [r0, r1) of sequence s.
  for (int r0 = 0; r0 < rows;) {
    const int64_t s = row_seq[r0];
    int r1 = r0, vis = 0;
    while (r1 < rows && row_seq[r1] == s) vis = max(vis, row_vis[r1]), ++r1;
    const int64_t page0 = p.page_indptr[s];
    for (int t0 = 0; t0 < vis; t0 += kBC) {
      const int cnt = min(kBC, vis - t0);
      if (threadIdx.x < kBC) {
        const int64_t t = t0 + threadIdx.x;
        slots[threadIdx.x] = threadIdx.x < cnt ? static_cast<int64_t>(p.page_ids[page0 + t / p.page_size]) * p.page_size +
                                                     t % p.page_size
                                               : 0;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kBC * D; e += kThreads) {
        const int t = e / D, d = e % D;
        float kv = 0.0f, vv = 0.0f;
        if (t < cnt) {
          kv = kv_load(p.k_pool, p.kv_dtype, slots[t] * p.k_stride + kvh * D + d);
          vv = kv_load(p.v_pool, p.kv_dtype, slots[t] * p.v_stride + kvh * D + d);
        }
        ks[t * L::ldh + d] = to_half_clamped(kv);
        vs[t * L::ldh + d] = to_half_clamped(vv);
      }
      __syncthreads();

      // S = Q K^T for this warp's 16 rows.
      const int wr = warp * 16;
#pragma unroll
      for (int j = 0; j < kBC / 16; ++j) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
          wmma::load_matrix_sync(a, qs + wr * L::ldh + kk * 16, L::ldh);
          wmma::load_matrix_sync(b, ks + (j * 16) * L::ldh + kk * 16, L::ldh);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(ss + wr * L::lds + j * 16, acc, L::lds, wmma::mem_row_major);
      }
      __syncwarp();

      // Online softmax of the warp's rows: lane = position within the tile (kBC = 32).
      for (int rr = 0; rr < 16; ++rr) {
        const int r = wr + rr;
        const bool active = r >= r0 && r < r1;
        const bool visible = active && t0 + lane < row_vis[r];
        const float sc = visible ? ss[r * L::lds + lane] * p.scale : -INFINITY;
        const float m_old = row_m[r];
        const float m_new = fmaxf(m_old, warp_max(sc));  // the shuffle also orders every read before the writes
        float pv = 0.0f, corr = 1.0f;
        if (m_new != -INFINITY) {
          pv = visible ? expf(sc - m_new) : 0.0f;
          corr = expf(m_old - m_new);  // 0 when m_old is -inf
        }
        const float sum = warp_sum(pv);
        ps[r * 2 * L::lds + lane] = __float2half(pv);
        if (lane == 0) {
          row_m[r] = m_new;
          row_l[r] = row_l[r] * corr + sum;
          row_corr[r] = corr;
        }
      }
      __syncwarp();
      for (int e = lane; e < 16 * D; e += 32) {
        const int r = wr + e / D;
        os[r * L::ldo + e % D] *= row_corr[r];
      }
      __syncwarp();

      // O += P V for the warp's rows.
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, os + wr * L::ldo + j * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < kBC / 16; ++kk) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
          wmma::load_matrix_sync(a, ps + wr * 2 * L::lds + kk * 16, 2 * L::lds);
          wmma::load_matrix_sync(b, vs + (kk * 16) * L::ldh + j * 16, L::ldh);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(os + wr * L::ldo + j * 16, acc, L::ldo, wmma::mem_row_major);
      }
      __syncthreads();  // K, V and slots are rewritten by the next tile
    }
    r0 = r1;
  }

  __syncthreads();
  for (int e = threadIdx.x; e < rows * D; e += kThreads) {
    const int r = e / D, d = e % D;
    const float l = row_l[r];
    p.out[((i0 + r) * p.n_heads + h) * D + d] = l > 0.0f ? os[r * L::ldo + d] / l : 0.0f;
  }
}

template <int D>
void launch(const Params& p) {
  using L = Layout<D>;
  static const bool opted = [] {  // once, at the first (eager) call: never while a graph records
    FP_CUDA(cudaFuncSetAttribute(attention_wmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(L::bytes)));
    return true;
  }();
  (void)opted;
  const dim3 grid(static_cast<unsigned>((p.n + kBR - 1) / kBR), static_cast<unsigned>(p.n_heads));
  attention_wmma_kernel<D><<<grid, kThreads, L::bytes, stream()>>>(p);
  FP_CUDA_LAUNCHED("attention wmma");
}

}  // namespace

std::string refuse_attention_wmma(const AttentionArgs& a) {
  if (std::string opt = refuse_attention_options(a, {}); !opt.empty()) return opt;
  std::string why = refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
  if (!why.empty()) return why;
  if (a.head_dim != a.v_dim || (a.head_dim != 64 && a.head_dim != 128))
    return "head_dim " + std::to_string(a.head_dim) + " / v_dim " + std::to_string(a.v_dim) + ": this kernel takes 64 or 128, equal";
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(a.n_kv_heads);
  if (a.page_size < 1) return "page size " + std::to_string(a.page_size);
  return {};
}

void attention_wmma(const AttentionArgs& a) {
  if (a.n == 0 || a.n_heads == 0) return;
  Params p{a.q, a.pos, a.n, a.seq_indptr, a.n_seqs, a.n_heads, a.n_heads / a.n_kv_heads,
           static_cast<const uint8_t*>(a.k_pool), static_cast<const uint8_t*>(a.v_pool), a.k_stride, a.v_stride,
           a.kv_dtype, a.page_size, a.page_indptr, a.page_ids, a.kv_len, a.scale, a.out};
  if (a.head_dim == 64) launch<64>(p);
  else launch<128>(p);
}

}  // namespace fp::cuda
