// kernels/cuda/attention_tiled.cu — paged causal attention (AttentionArgs, kernels/ops.h) in
// tiles, two kernels registered from one body:
//   split_kv  decode (n == n_seqs): a block per (token, KV head, group of its query heads,
//             split of the visible positions); the splits' partial (max, sum, acc) meet in a
//             combine kernel. Long contexts at batch 1 fill the GPU through the splits.
//   tiled     prefill: a block per (tile of consecutive query tokens, KV head, group of query
//             heads); the same K/V tile in shared memory serves tokens x heads rows.
//
// A block owns R rows (query token, query head) that read the same KV head. It walks its
// sequence's visible positions in tiles of T: the tile's slots (through the page table), then
// K and V rows converted to f32 in shared memory (16-byte loads where the dims, strides and
// pools allow; rows padded by one float: conflict-free column reads), scores for every (row, position) pair, an online-softmax update per row (one
// warp per row), and acc[row, d] += p * V. Each row has its own causal limit
// min(pos[i], kv_len[s] - 1) + 1, so scrambled positions and positions beyond kv_len are fine.
// A token tile may straddle sequences (the host does not know seq_indptr): the block handles
// each sequence's part in turn.
//
// Sizes: head_dim, v_dim <= 256. D = max(head_dim, v_dim) <= 128: T = 32, R <= 16; else
// T = 16, R <= 8. Shared memory (R*hd + T*(hd+1) + T*(vd+1)) floats <= 41.3 KB, under the 48 KB
// that needs no opt-in. 256 threads; each holds <= 8 accumulators (R * v_dim <= 2048).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace fp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxT = 32, kMaxR = 16, kAcc = 8;
constexpr int kMaxSplits = 32;

struct TileParams {
  const float* q;
  const int32_t* pos;
  int64_t n;
  const int32_t* seq_indptr;
  int64_t n_seqs, n_heads, n_kv_heads, group, head_dim, v_dim;
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  int64_t k_stride, v_stride;
  DType kv_dtype;
  int64_t page_size;
  const int32_t* page_indptr;
  const int32_t* page_ids;
  const int32_t* kv_len;
  float scale;
  int bq, hb, head_chunks, tile, nsplit;
  bool vec;  // K/V rows load 16 bytes at a time (dims, strides and pools aligned to that)
  float* out;       // nsplit == 1
  float* part_acc;  // nsplit > 1: [n, n_heads, nsplit, v_dim]
  float* part_ml;   // [n, n_heads, nsplit, 2]: running max, sum
};

// Rows of a K or V tile into shared memory as f32: dst[t][0..width) for t < nt (zeros beyond),
// row pitch width + 1. Element d of row t is pool[slots[t] * stride + off + d]. vec: 16-byte loads
// (4 F32 or 8 F16/BF16 values), else one element per load; coalesced along the row either way.
__device__ __forceinline__ void load_tile(const uint8_t* pool, DType dt, int64_t stride, int64_t off, int width,
                                          const int64_t* slots, int nt, int T, bool vec, float* dst) {
  if (vec) {
    const int per = dt == DType::F32 ? 4 : 8, nv = width / per;
    for (int e = threadIdx.x; e < T * nv; e += kThreads) {
      const int t = e / nv, d0 = (e % nv) * per;
      float* out = dst + t * (width + 1) + d0;
      if (t >= nt) {
        for (int j = 0; j < per; ++j) out[j] = 0.0f;
        continue;
      }
      const int64_t idx = slots[t] * stride + off + d0;
      if (dt == DType::F32) {
        const float4 v = reinterpret_cast<const float4*>(pool)[idx / 4];  // not __ldg: pdl.cuh
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
      } else {
        const uint4 u = reinterpret_cast<const uint4*>(pool)[idx / 8];
        const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint16_t lo = static_cast<uint16_t>(words[k] & 0xffffu), hi = static_cast<uint16_t>(words[k] >> 16);
          out[2 * k] = dt == DType::F16 ? half_bits_to_float(lo) : bf16_bits_to_float(lo);
          out[2 * k + 1] = dt == DType::F16 ? half_bits_to_float(hi) : bf16_bits_to_float(hi);
        }
      }
    }
  } else {
    for (int e = threadIdx.x; e < T * width; e += kThreads) {
      const int t = e / width, d = e % width;
      dst[t * (width + 1) + d] = t < nt ? kv_load(pool, dt, slots[t] * stride + off + d) : 0.0f;
    }
  }
}

__global__ void __launch_bounds__(kThreads) attention_tile_kernel(TileParams p) {
  pdl_release();
  pdl_wait();  // chained (pdl.cuh): q and the cache rows are the kernels before's output
  extern __shared__ float smem[];
  __shared__ int64_t slots[kMaxT];
  __shared__ float ps[kMaxR * kMaxT];
  __shared__ float row_m[kMaxR], row_l[kMaxR], row_corr[kMaxR];
  __shared__ int row_vis[kMaxR];  // visible positions of the row; -1: not a row of this sequence part

  const int D = static_cast<int>(p.head_dim), Dv = static_cast<int>(p.v_dim), T = p.tile;
  const int R = p.bq * p.hb;
  float* qs = smem;                 // [R][D], pre-scaled
  float* ks = qs + R * D;           // [T][D + 1]
  float* vs = ks + T * (D + 1);     // [T][Dv + 1]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t bx = blockIdx.x;
  const int hc = static_cast<int>(bx % p.head_chunks);
  const int64_t kvh = (bx / p.head_chunks) % p.n_kv_heads;
  const int64_t i0 = (bx / (p.head_chunks * p.n_kv_heads)) * p.bq;
  const int sp = blockIdx.y;
  const int64_t i_end = min(i0 + p.bq, p.n);

  for (int64_t seg = i0; seg < i_end;) {
    const int64_t s = seq_of(p.seq_indptr, p.n_seqs, seg);
    const int64_t seg_end = min(i_end, static_cast<int64_t>(p.seq_indptr[s + 1]));
    const int64_t kv_len = p.kv_len[s];
    const int32_t* pages = p.page_ids + p.page_indptr[s];

    if (tid < R) {
      const int64_t i = i0 + tid / p.hb;
      const int hl = hc * p.hb + tid % p.hb;
      const bool mine = i >= seg && i < seg_end && hl < p.group;
      row_vis[tid] = mine ? static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(p.pos[i]), kv_len - 1) + 1)) : -1;
      row_m[tid] = -INFINITY;
      row_l[tid] = 0.0f;
    }
    for (int e = tid; e < R * D; e += kThreads) {
      const int r = e / D, d = e % D;
      const int64_t i = i0 + r / p.hb;
      const int hl = hc * p.hb + r % p.hb;
      float v = 0.0f;
      if (i >= seg && i < seg_end && hl < p.group) v = p.q[(i * p.n_heads + kvh * p.group + hl) * D + d] * p.scale;
      qs[e] = v;
    }
    __syncthreads();
    int maxvis = 0;
    for (int r = 0; r < R; ++r) maxvis = max(maxvis, row_vis[r]);
    // This split's share of the positions, whole tiles each.
    const int chunk = ((maxvis + p.nsplit - 1) / p.nsplit + T - 1) / T * T;
    const int kb = sp * chunk, ke = min(maxvis, kb + chunk);

    float acc[kAcc];
#pragma unroll
    for (int k = 0; k < kAcc; ++k) acc[k] = 0.0f;

    for (int t0 = kb; t0 < ke; t0 += T) {
      const int nt = min(T, ke - t0);
      if (tid < T) {
        const int64_t t = t0 + tid;
        slots[tid] = tid < nt ? static_cast<int64_t>(pages[t / p.page_size]) * p.page_size + t % p.page_size : 0;
      }
      __syncthreads();  // slots ready; the previous tile's readers of ks, vs, ps are done
      load_tile(p.k_pool, p.kv_dtype, p.k_stride, kvh * D, D, slots, nt, T, p.vec, ks);
      load_tile(p.v_pool, p.kv_dtype, p.v_stride, kvh * Dv, Dv, slots, nt, T, p.vec, vs);
      __syncthreads();
      for (int e = tid; e < R * T; e += kThreads) {
        const int r = e / T, t = e % T;
        float sc = -INFINITY;
        if (t < nt && t0 + t < row_vis[r]) {
          const float* qr = qs + r * D;
          const float* kr = ks + t * (D + 1);
          float dot = 0.0f;
          for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
          sc = dot;
        }
        ps[e] = sc;
      }
      __syncthreads();
      for (int r = warp; r < R; r += kWarps) {  // online softmax, one warp per row
        const float sc = lane < T ? ps[r * T + lane] : -INFINITY;
        const float m_old = row_m[r], m_new = fmaxf(m_old, warp_max(sc));
        float pr = 0.0f, corr = 1.0f;
        if (m_new != -INFINITY) {
          pr = expf(sc - m_new);  // 0 for masked scores
          corr = expf(m_old - m_new);
        }
        const float sum = warp_sum(pr);
        if (lane < T) ps[r * T + lane] = pr;
        if (lane == 0) {
          row_m[r] = m_new;
          row_l[r] = row_l[r] * corr + sum;
          row_corr[r] = corr;
        }
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kAcc; ++k) {
        const int e = tid + k * kThreads;
        if (e < R * Dv) {
          const int r = e / Dv, d = e % Dv;
          float a = acc[k] * row_corr[r];
          const float* pr = ps + r * T;
          for (int t = 0; t < nt; ++t) a += pr[t] * vs[t * (Dv + 1) + d];
          acc[k] = a;
        }
      }
    }
    // Rows of this sequence part: the output, or this split's partial state.
#pragma unroll
    for (int k = 0; k < kAcc; ++k) {
      const int e = tid + k * kThreads;
      if (e < R * Dv) {
        const int r = e / Dv, d = e % Dv;
        if (row_vis[r] >= 0) {
          const int64_t i = i0 + r / p.hb, h = kvh * p.group + hc * p.hb + r % p.hb;
          if (p.nsplit == 1) {
            const float l = row_l[r];
            p.out[(i * p.n_heads + h) * Dv + d] = l > 0.0f ? acc[k] / l : 0.0f;
          } else {
            const int64_t at = (i * p.n_heads + h) * p.nsplit + sp;
            p.part_acc[at * Dv + d] = acc[k];
            if (d == 0) {
              p.part_ml[2 * at] = row_m[r];
              p.part_ml[2 * at + 1] = row_l[r];
            }
          }
        }
      }
    }
    __syncthreads();  // row_vis, row_m, row_l are rewritten for the next sequence part
    seg = seg_end;
  }
}

// One block per (token, head): out = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M).
__global__ void attention_combine_kernel(const float* part_acc, const float* part_ml, int nsplit, int64_t v_dim, float* out) {
  pdl_release();
  pdl_wait();
  const int64_t row = blockIdx.x;
  const float* ml = part_ml + row * nsplit * 2;
  float m = -INFINITY;
  for (int s = 0; s < nsplit; ++s) m = fmaxf(m, ml[2 * s]);
  float l = 0.0f;
  if (m != -INFINITY)
    for (int s = 0; s < nsplit; ++s)
      if (ml[2 * s] != -INFINITY) l += ml[2 * s + 1] * expf(ml[2 * s] - m);
  for (int64_t d = threadIdx.x; d < v_dim; d += blockDim.x) {
    float a = 0.0f;
    if (l > 0.0f)
      for (int s = 0; s < nsplit; ++s)
        if (ml[2 * s] != -INFINITY) a += part_acc[(row * nsplit + s) * v_dim + d] * expf(ml[2 * s] - m);
    out[row * v_dim + d] = l > 0.0f ? a / l : 0.0f;
  }
}

std::string refuse_common(const AttentionArgs& a) {
  if (std::string opt = refuse_attention_options(a, {}); !opt.empty()) return opt;
  std::string why = refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
  if (!why.empty()) return why;
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(a.n_kv_heads);
  if (a.head_dim < 1 || a.v_dim < 1 || a.head_dim > 256 || a.v_dim > 256)
    return "head_dim " + std::to_string(a.head_dim) + " / v_dim " + std::to_string(a.v_dim) + ": this kernel handles 1..256";
  if (a.page_size < 1) return "page size " + std::to_string(a.page_size);
  return {};
}

void run_tiles(const AttentionArgs& a, bool decode) {
  if (a.n == 0 || a.n_heads == 0) return;
  const int64_t group = a.n_heads / a.n_kv_heads, dmax = std::max(a.head_dim, a.v_dim);
  const int tile = dmax <= 128 ? 32 : 16, rmax = dmax <= 128 ? 16 : 8;
  TileParams p{};
  p.q = a.q;
  p.pos = a.pos;
  p.n = a.n;
  p.seq_indptr = a.seq_indptr;
  p.n_seqs = a.n_seqs;
  p.n_heads = a.n_heads;
  p.n_kv_heads = a.n_kv_heads;
  p.group = group;
  p.head_dim = a.head_dim;
  p.v_dim = a.v_dim;
  p.k_pool = static_cast<const uint8_t*>(a.k_pool);
  p.v_pool = static_cast<const uint8_t*>(a.v_pool);
  p.k_stride = a.k_stride;
  p.v_stride = a.v_stride;
  p.kv_dtype = a.kv_dtype;
  p.page_size = a.page_size;
  p.page_indptr = a.page_indptr;
  p.page_ids = a.page_ids;
  p.kv_len = a.kv_len;
  p.scale = a.scale;
  p.hb = static_cast<int>(std::min<int64_t>(group, rmax));
  p.bq = decode ? 1 : std::max(1, rmax / p.hb);
  p.head_chunks = static_cast<int>((group + p.hb - 1) / p.hb);
  p.tile = tile;
  const int64_t per = a.kv_dtype == DType::F32 ? 4 : 8;
  p.vec = a.head_dim % per == 0 && a.v_dim % per == 0 && a.k_stride % per == 0 && a.v_stride % per == 0 &&
          reinterpret_cast<uintptr_t>(a.k_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_pool) % 16 == 0;
  const int64_t blocks = (a.n + p.bq - 1) / p.bq * a.n_kv_heads * p.head_chunks;
  FP_CHECK(blocks < (int64_t{1} << 31), "attention: ", blocks, " blocks");
  // Splits until the grid covers the GPU about twice (the host cannot see kv_len: a split past
  // a short context finds no positions and records an empty partial).
  const int64_t want = 2 * static_cast<int64_t>(sm_count());
  p.nsplit = static_cast<int>(std::clamp<int64_t>((want + blocks - 1) / blocks, 1, kMaxSplits));
  const int64_t rows = a.n * a.n_heads;
  p.out = a.out;
  if (p.nsplit > 1) {
    auto* part = static_cast<float*>(scratch(static_cast<size_t>(rows * p.nsplit * (a.v_dim + 2)) * sizeof(float), 2));
    p.part_acc = part;
    p.part_ml = part + rows * p.nsplit * a.v_dim;
  }
  const int R = p.bq * p.hb;
  const size_t smem = static_cast<size_t>(R * a.head_dim + tile * (a.head_dim + 1) + tile * (a.v_dim + 1)) * sizeof(float);
  launch_chained("attention tiles", attention_tile_kernel, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(p.nsplit)),
                 dim3(kThreads), smem, p);
  if (p.nsplit > 1)
    launch_chained("attention combine", attention_combine_kernel, dim3(static_cast<unsigned>(rows)), dim3(128), 0,
                   static_cast<const float*>(p.part_acc), static_cast<const float*>(p.part_ml), p.nsplit, a.v_dim, a.out);
}

}  // namespace

std::string refuse_attention_split_kv(const AttentionArgs& a) {
  if (a.n != a.n_seqs) return "a prefill batch (n=" + std::to_string(a.n) + " tokens, " + std::to_string(a.n_seqs) + " sequences)";
  return refuse_common(a);
}
void attention_split_kv(const AttentionArgs& a) { run_tiles(a, true); }

std::string refuse_attention_tiled(const AttentionArgs& a) { return refuse_common(a); }
void attention_tiled(const AttentionArgs& a) { run_tiles(a, false); }

}  // namespace fp::cuda
