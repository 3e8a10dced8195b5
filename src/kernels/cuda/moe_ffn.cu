// kernels/cuda/moe_ffn.cu — the routed expert FFN on the GPU (moe_ffn): a grouped GEMM over the
// tokens sorted by expert, the shared expert beside it, and a combine in slot order.
//
// It runs five launches, none of which needs the host to see a count (so a decode step records
// into a CUDA graph):
//   1. plan (one block): counts the selections of each local expert, lays the experts' rows out
//      one after another, each expert's run padded to a whole tile of BM rows, and writes
//      row_pair[row] (the (token, slot) pair a row computes, -1 for padding), row_of[pair] (its
//      row, -1 for another rank's expert) and tile_expert[tile] (-1 past the last tile).
//   2. gate/up (grouped GEMM, SwiGLU epilogue): h[row] = silu(gate_e · x_t) * (up_e · x_t).
//   3. down (grouped GEMM): y[row] = down_e · h[row].
//   4. the shared expert, when there is one: the same two GEMMs over the n tokens in order, on a
//      second stream (forked from and joined back to the backend's stream with events, which a
//      graph capture records as parallel branches), so it overlaps the routed experts.
//   5. combine (block per token): out[t] = sum_j w[t, j] * y[row_of[t, j]] (+ the shared output),
//      summed in slot order as the reference does.
// The GEMM tile is BM rows x 64 output columns, K in steps of 32; each of the 256 threads owns
// BM/16 rows x 4 columns. Weights are decoded 8 at a time (weights.cuh) into shared memory as
// f32, so every weight is read once per tile of rows and the values equal the CPU's dequantized
// ones: the result differs from the reference only in the order of the sums. Experts are one
// evenly spaced stack (expert e's rows at base + (e - expert_begin) * stride), which the loaders
// and the device upload give; refuse_moe_ffn names anything else.
// Rows within an expert's run land in the order the atomics hand out, which changes no value:
// each row's sums depend only on its own inputs.
//
// Decode (at most 8 tokens) takes the GEMV form instead: no plan, row = pair. A block owns 4
// consecutive output rows of one pair's expert and streams them whole (256 threads over chunks
// of 8 weights, as gemv.cu), so the selected experts' weights are read at memory speed; gate and
// up in one pass (SwiGLU on the way out), then down. A non-local pair's blocks leave at once.
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/weights.cuh"
#include "kernels/ops_moe.h"

namespace fp::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;
constexpr int kBN = 64, kBK = 32;

// One stack of expert weight matrices [rows, in] of one dtype: expert e (local index) at
// base + e * stride bytes; block scales (FP8) at scale + e * scale_stride floats, or none.
struct Stack {
  const uint8_t* base = nullptr;
  int64_t stride = 0, row_bytes = 0, rows = 0, in = 0;
  DType dtype = DType::F32;
  const float* scale = nullptr;
  int64_t scale_stride = 0, sb = 1, scale_cols = 0;
};

// The rows a GEMM computes: row r of tile t belongs to expert tile_expert[t] (null: expert
// expert_begin for every tile), computes pair row_pair[r] (null: pair r for r < n_rows; < 0:
// padding), and reads input row pair / gather_k of x (gather_k 0: row r of x itself).
struct Rows {
  const int32_t* tile_expert;
  const int32_t* row_pair;
  int64_t n_rows;
  int gather_k;
  int expert_begin;
};

__device__ __forceinline__ int64_t input_row(const Rows& r, int64_t row) {
  const int64_t pair = r.row_pair ? r.row_pair[row] : (row < r.n_rows ? row : -1);
  if (pair < 0) return -1;
  return r.gather_k > 0 ? pair / r.gather_k : row;
}

// Weights 8c..8c+7 of row o of expert e's matrix (zeros past the matrix), block scales applied.
template <DType T>
__device__ __forceinline__ void load_w8(const Stack& s, int e, int64_t o, int64_t c, float w[8]) {
  if (o >= s.rows || 8 * c >= s.in) {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = 0.0f;
    return;
  }
  load8<T>(s.base + e * s.stride + o * s.row_bytes, c, w);
  if (s.scale) {
    const float sc = __ldg(s.scale + e * s.scale_stride + (o / s.sb) * s.scale_cols + (8 * c) / s.sb);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] *= sc;
  }
}

// out[row, 0..N) for the rows of tile blockIdx.x and columns [64 * blockIdx.y, +64):
//   SWIGLU: silu(A · Wa^T) * (A · Wb^T) with Wa = gate, Wb = up; else A · Wa^T.
// A = x's input rows (K = Wa.in columns, row stride K).
template <DType T, int BM, bool SWIGLU>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(const float* __restrict__ x, Rows rows, Stack wa, Stack wb,
                                                                float* __restrict__ out) {
  constexpr int RM = BM / 16, NW = SWIGLU ? 2 : 1;  // rows per thread, weight matrices
  __shared__ float xs[kBK][BM + 1];
  __shared__ __align__(16) float ws[NW][kBK][kBN];
  __shared__ int64_t src[BM];

  const int tile = blockIdx.x;
  const int e_global = rows.tile_expert ? rows.tile_expert[tile] : rows.expert_begin;
  if (e_global < 0) return;  // past the last tile (the whole block leaves)
  const int e = e_global - rows.expert_begin;
  const int64_t row0 = static_cast<int64_t>(tile) * BM, col0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t K = wa.in;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (int r = tid; r < BM; r += kThreads) src[r] = input_row(rows, row0 + r);
  __syncthreads();

  float acc[NW][RM][4];
#pragma unroll
  for (int m = 0; m < NW; ++m)
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[m][i][j] = 0.0f;

  const int w_row = tid >> 2, w_chunk = tid & 3;  // the 8 weights of each matrix this thread decodes per step
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int idx = tid; idx < BM * kBK; idx += kThreads) {
      const int r = idx / kBK, kk = idx % kBK;
      const int64_t s = src[r];
      xs[kk][r] = (s >= 0 && k0 + kk < K) ? x[s * K + k0 + kk] : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < NW; ++m) {
      float w[8];
      load_w8<T>(m == 0 ? wa : wb, e, col0 + w_row, k0 / 8 + w_chunk, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) ws[m][8 * w_chunk + j][w_row] = w[j];
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      float xv[RM];
#pragma unroll
      for (int i = 0; i < RM; ++i) xv[i] = xs[kk][ty + 16 * i];
#pragma unroll
      for (int m = 0; m < NW; ++m) {
        const float4 w4 = *reinterpret_cast<const float4*>(&ws[m][kk][4 * tx]);
#pragma unroll
        for (int i = 0; i < RM; ++i) {
          acc[m][i][0] += xv[i] * w4.x;
          acc[m][i][1] += xv[i] * w4.y;
          acc[m][i][2] += xv[i] * w4.z;
          acc[m][i][3] += xv[i] * w4.w;
        }
      }
    }
    __syncthreads();
  }

  const int64_t N = wa.rows;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = ty + 16 * i;
    if (src[r] < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t o = col0 + 4 * tx + j;
      if (o >= N) continue;
      float v = acc[0][i][j];
      if constexpr (SWIGLU) v = v / (1.0f + expf(-v)) * acc[NW - 1][i][j];
      out[(row0 + r) * N + o] = v;
    }
  }
}

// GEMV form: out[p, o] for rows o in [4 * blockIdx.x, +4) of pair p = blockIdx.y's expert;
// SWIGLU: silu(gate · x) * (up · x) with x = row p / k of x (k 0: row p), else wa · x.
// ids null: every pair uses expert expert_begin (the shared expert).
constexpr int kGemvRows = 4;
template <DType T, bool SWIGLU>
__global__ void __launch_bounds__(kThreads) pair_gemv_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids,
                                                             int k, int expert_begin, int expert_end, Stack wa, Stack wb,
                                                             float* __restrict__ out) {
  constexpr int NW = SWIGLU ? 2 : 1;
  const int64_t p = blockIdx.y, row0 = static_cast<int64_t>(blockIdx.x) * kGemvRows;
  const int e_global = ids ? ids[p] : expert_begin;
  if (e_global < expert_begin || e_global >= expert_end) return;  // another rank's expert
  const int e = e_global - expert_begin;
  const int64_t K = wa.in, chunks = K / 8;
  const float* xr = x + (k > 0 ? p / k : p) * K;
  float acc[NW][kGemvRows];
#pragma unroll
  for (int m = 0; m < NW; ++m)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) acc[m][r] = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const float4 x0 = __ldg(reinterpret_cast<const float4*>(xr) + 2 * c), x1 = __ldg(reinterpret_cast<const float4*>(xr) + 2 * c + 1);
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int m = 0; m < NW; ++m)
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        float w[8];
        load_w8<T>(m == 0 ? wa : wb, e, row0 + r, c, w);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][r] += w[j] * xv[j];
      }
  }
  __shared__ float red[kThreads / 32][NW * kGemvRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < NW; ++m)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const float v = warp_sum(acc[m][r]);
      if (lane == 0) red[warp][m * kGemvRows + r] = v;
    }
  __syncthreads();
  if (threadIdx.x < kGemvRows) {
    const int r = threadIdx.x;
    const int64_t o = row0 + r;
    if (o < wa.rows) {
      float v[NW];
#pragma unroll
      for (int m = 0; m < NW; ++m) {
        v[m] = 0.0f;
#pragma unroll
        for (int w8 = 0; w8 < kThreads / 32; ++w8) v[m] += red[w8][m * kGemvRows + r];
      }
      float res = v[0];
      if constexpr (SWIGLU) res = res / (1.0f + expf(-res)) * v[NW - 1];
      out[p * wa.rows + o] = res;
    }
  }
}

// One block: lays the local experts' selections out in tiles (see the file comment).
__global__ void plan_kernel(const int32_t* __restrict__ ids, int64_t pairs, int expert_begin, int expert_end, int BM,
                            int64_t rows_cap, int64_t max_tiles, int32_t* row_pair, int32_t* row_of,
                            int32_t* tile_expert) {
  __shared__ int count[kMaxExperts], cursor[kMaxExperts];
  for (int64_t r = threadIdx.x; r < rows_cap; r += blockDim.x) row_pair[r] = -1;
  for (int64_t t = threadIdx.x; t < max_tiles; t += blockDim.x) tile_expert[t] = -1;
  for (int e = expert_begin + static_cast<int>(threadIdx.x); e < expert_end; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= expert_begin && e < expert_end) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t off = 0;
    for (int e = expert_begin; e < expert_end; ++e) {
      cursor[e] = static_cast<int>(off);
      const int64_t tiles = (count[e] + BM - 1) / BM;
      for (int64_t t = 0; t < tiles; ++t) tile_expert[off / BM + t] = e;
      off += tiles * BM;
    }
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= expert_begin && e < expert_end) {
      const int pos = atomicAdd(&cursor[e], 1);
      row_pair[pos] = static_cast<int32_t>(p);
      row_of[p] = pos;
    } else {
      row_of[p] = -1;  // another rank's expert (or an id out of range): contributes nothing here
    }
  }
}

// row_of null (GEMV form): pair p's row is p when ids[p] is local, else none.
__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ row_of, const int32_t* __restrict__ ids,
                               int expert_begin, int expert_end, const float* __restrict__ weights, int k,
                               const float* __restrict__ shared_y, int64_t dim, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      const int32_t r = row_of ? row_of[p] : (ids[p] >= expert_begin && ids[p] < expert_end ? static_cast<int32_t>(p) : -1);
      if (r >= 0) o += weights[p] * y[static_cast<int64_t>(r) * dim + d];
    }
    if (shared_y) o += shared_y[t * dim + d];
    out[t * dim + d] = o;
  }
}

// ---- host side ----

bool supported(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q6_K ||
         t == DType::F8_E4M3;
}

// "" when the kernels read matrix w (dtype, width, alignment), else why not.
std::string check_matrix(const Tensor& w, const char* what) {
  if (!supported(w.dtype)) return std::string(what) + " weight dtype " + dtype_name(w.dtype) + " has no CUDA MoE kernel";
  if (w.cols() % 8 != 0) return std::string(what) + " input width " + std::to_string(w.cols()) + " is not a multiple of 8";
  const int align = w.dtype == DType::Q6_K ? 1 : w.dtype == DType::Q8_0 ? 2 : w.dtype == DType::F8_E4M3 ? 8 : 16;
  if (reinterpret_cast<uintptr_t>(w.data) % align != 0 || row_bytes(w.dtype, w.cols()) % align != 0)
    return std::string(what) + " weights are not " + std::to_string(align) + "-byte aligned";
  if (w.block_scale && w.scale_block % 8 != 0) return std::string(what) + " scale block is not a multiple of 8";
  return {};
}

Stack matrix_stack(const Tensor& w) {
  Stack s;
  s.base = static_cast<const uint8_t*>(w.data);
  s.row_bytes = row_bytes(w.dtype, w.cols());
  s.rows = w.rows();
  s.in = w.cols();
  s.dtype = w.dtype;
  if (w.block_scale) {
    s.scale = w.block_scale;
    s.sb = w.scale_block;
    s.scale_cols = (w.cols() + w.scale_block - 1) / w.scale_block;
  }
  return s;
}

// The local experts' matrices ws[b..end) as one evenly spaced stack; why not in *why.
Stack expert_stack(const Tensor* ws, int64_t b, int64_t end, const char* what, std::string* why) {
  Stack s = matrix_stack(ws[b]);
  if (std::string w = check_matrix(ws[b], what); !w.empty()) {
    *why = w;
    return s;
  }
  if (end - b > 1) {
    s.stride = static_cast<const uint8_t*>(ws[b + 1].data) - s.base;
    if (s.scale) s.scale_stride = ws[b + 1].block_scale - s.scale;
    const int align = s.dtype == DType::Q6_K ? 1 : s.dtype == DType::Q8_0 ? 2 : s.dtype == DType::F8_E4M3 ? 8 : 16;
    if (s.stride % align != 0) {
      *why = std::string(what) + " experts lie " + std::to_string(s.stride) + " bytes apart, not a multiple of " +
             std::to_string(align);
      return s;
    }
  }
  for (int64_t e = b; e < end; ++e) {
    const Tensor& t = ws[e];
    const bool same = t.dtype == s.dtype && t.rows() == s.rows && t.cols() == s.in &&
                      static_cast<const uint8_t*>(t.data) == s.base + (e - b) * s.stride &&
                      (t.block_scale != nullptr) == (s.scale != nullptr) &&
                      (!s.scale || (t.block_scale == s.scale + (e - b) * s.scale_stride && t.scale_block == s.sb));
    if (!same) {
      *why = std::string(what) + " experts are not one evenly spaced stack of one dtype and shape (expert " +
             std::to_string(e) + ")";
      return s;
    }
  }
  return s;
}

// Calls f(std::integral_constant<DType, T>{}) for a weight type the kernels are built for.
template <class F>
void with_weight_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(std::integral_constant<DType, DType::F32>{}); break;
    case DType::F16: f(std::integral_constant<DType, DType::F16>{}); break;
    case DType::BF16: f(std::integral_constant<DType, DType::BF16>{}); break;
    case DType::Q8_0: f(std::integral_constant<DType, DType::Q8_0>{}); break;
    case DType::Q4_K: f(std::integral_constant<DType, DType::Q4_K>{}); break;
    case DType::Q6_K: f(std::integral_constant<DType, DType::Q6_K>{}); break;
    case DType::F8_E4M3: f(std::integral_constant<DType, DType::F8_E4M3>{}); break;
    default: fail("moe_ffn: no CUDA kernel for ", dtype_name(t));
  }
}

template <int BM, bool SWIGLU>
void launch_gemm(cudaStream_t st, const float* x, const Rows& rows, int64_t tiles, const Stack& wa, const Stack& wb, float* out) {
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((wa.rows + kBN - 1) / kBN));
  with_weight_type(wa.dtype, [&](auto type) {
    grouped_gemm_kernel<decltype(type)::value, BM, SWIGLU><<<grid, kThreads, 0, st>>>(x, rows, wa, wb, out);
  });
  FP_CUDA_LAUNCHED("moe grouped gemm");
}

template <bool SWIGLU>
void launch_pair_gemv(cudaStream_t st, const float* x, const int32_t* ids, int k, int b, int end, int64_t pairs,
                      const Stack& wa, const Stack& wb, float* out) {
  const dim3 grid(static_cast<unsigned>((wa.rows + kGemvRows - 1) / kGemvRows), static_cast<unsigned>(pairs));
  with_weight_type(wa.dtype, [&](auto type) {
    pair_gemv_kernel<decltype(type)::value, SWIGLU><<<grid, kThreads, 0, st>>>(x, ids, k, b, end, wa, wb, out);
  });
  FP_CUDA_LAUNCHED("moe pair gemv");
}

// The GEMV form of one stack over `pairs` (ids null: pair p = token p, expert b): h[p] =
// silu(gate x) * (up x), y[p] = down h[p].
void expert_ffn_gemv(cudaStream_t st, const float* x, const int32_t* ids, int k, int b, int end, int64_t pairs,
                     const Stack& gate, const Stack& up, const Stack& down, float* h, float* y) {
  if (pairs == 0) return;
  launch_pair_gemv<true>(st, x, ids, k, b, end, pairs, gate, up, h);
  launch_pair_gemv<false>(st, h, ids, 0, b, end, pairs, down, down, y);
}

// The FFN of one stack over `rows`: h = silu(gate x) * (up x), then y = down h.
template <int BM>
void expert_ffn(cudaStream_t st, const float* x, const Rows& rows, int64_t tiles, const Stack& gate, const Stack& up,
                const Stack& down, float* h, float* y) {
  if (tiles == 0) return;
  launch_gemm<BM, true>(st, x, rows, tiles, gate, up, h);
  Rows hr = rows;
  hr.gather_k = 0;  // down reads h's own rows
  launch_gemm<BM, false>(st, h, hr, tiles, down, down, y);
}

// The shared expert's stream and the fork / join events (created once, kept for the process).
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
SideStream& side() {
  static SideStream* s = [] {
    auto* p = new SideStream();
    FP_CUDA(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    FP_CUDA(cudaEventCreateWithFlags(&p->fork, cudaEventDisableTiming));
    FP_CUDA(cudaEventCreateWithFlags(&p->join, cudaEventDisableTiming));
    return p;
  }();
  return *s;
}

// Bump allocator over one scratch region, 256-byte aligned pieces (base 0: only measures).
struct Carve {
  uintptr_t base = 0;
  size_t used = 0;
  template <class T>
  T* take(int64_t count) {
    const uintptr_t at = base + used;
    used += (static_cast<size_t>(count) * sizeof(T) + 255) & ~size_t{255};
    return reinterpret_cast<T*>(at);
  }
};

}  // namespace

std::string refuse_moe_ffn(const MoeFfnArgs& a) {
  if (!a.plain_swiglu()) return "expert biases / clamped SwiGLU (gpt-oss) are not implemented here";
  if (a.shared_logits) return "the shared expert's sigmoid gate (Qwen2-MoE) is not implemented here";
  const int64_t b = a.expert_begin, end = a.local_end();
  if (a.n_expert > kMaxExperts) return "more than " + std::to_string(kMaxExperts) + " experts";
  if (b < 0 || end > a.n_expert || b >= end) return "empty or invalid local expert range";
  std::string why;
  const Stack g = expert_stack(a.gate, b, end, "gate", &why);
  if (why.empty()) expert_stack(a.up, b, end, "up", &why);
  if (why.empty()) expert_stack(a.down, b, end, "down", &why);
  if (why.empty() && (a.up[b].dtype != g.dtype || a.down[b].dtype != g.dtype))
    why = "gate, up and down experts differ in dtype";
  if (why.empty() && (g.in != a.dim || a.up[b].rows() != g.rows || a.down[b].rows() != a.dim || a.down[b].cols() != g.rows))
    why = "expert shapes do not match: gate/up [ff, dim], down [dim, ff]";
  if (why.empty() && a.shared_gate) {
    for (const Tensor* t : {a.shared_gate, a.shared_up, a.shared_down})
      if (why.empty()) why = check_matrix(*t, "shared expert");
    if (why.empty() && (a.shared_up->dtype != a.shared_gate->dtype || a.shared_down->dtype != a.shared_gate->dtype))
      why = "the shared expert's gate, up and down differ in dtype";
    const int64_t sf = a.shared_gate->rows();
    if (why.empty() && (a.shared_gate->cols() != a.dim || a.shared_up->rows() != sf || a.shared_up->cols() != a.dim ||
                        a.shared_down->rows() != a.dim || a.shared_down->cols() != sf))
      why = "shared expert shapes do not match: gate/up [ff, dim], down [dim, ff]";
  }
  return why;
}

void moe_ffn(const MoeFfnArgs& a) {
  if (a.n <= 0) return;
  const int64_t b = a.expert_begin, end = a.local_end(), local = end - b, pairs = a.n * a.k;
  std::string why;
  const Stack gate = expert_stack(a.gate, b, end, "gate", &why), up = expert_stack(a.up, b, end, "up", &why),
              down = expert_stack(a.down, b, end, "down", &why);
  FP_CHECK(why.empty(), "moe_ffn (cuda): ", why);
  const int64_t ff = gate.rows, dim = a.dim;
  const int64_t sh_ff = a.shared_gate ? a.shared_gate->rows() : 0;
  const Stack sg = sh_ff ? matrix_stack(*a.shared_gate) : Stack{}, su = sh_ff ? matrix_stack(*a.shared_up) : Stack{},
              sd = sh_ff ? matrix_stack(*a.shared_down) : Stack{};
  // Decode: the GEMV form (x rows read as float4: 16-byte aligned). Else tiles of BM rows: 16
  // when the selections average at most 16 per expert, 64 for prefill.
  const bool gemv = a.n <= 8 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  const bool small = pairs <= 16 * local;
  const int BM = small ? 16 : 64;
  const int64_t max_tiles = gemv ? 0 : (pairs + BM - 1) / BM + local, rows = gemv ? pairs : max_tiles * BM;
  const int64_t sh_rows = gemv ? a.n : (a.n + BM - 1) / BM * BM;

  // Scratch: the plan's index arrays (tiles only), h and y of the routed rows, the shared
  // expert's h and y.
  int32_t *row_of = nullptr, *row_pair = nullptr, *tile_expert = nullptr;
  float *h = nullptr, *y = nullptr, *sh_h = nullptr, *sh_y = nullptr;
  Carve c;
  for (int pass = 0; pass < 2; ++pass) {  // the first measures, the second carves the region
    if (pass == 1) c = Carve{reinterpret_cast<uintptr_t>(scratch(c.used, 3)), 0};
    if (!gemv) {
      row_of = c.take<int32_t>(pairs);
      row_pair = c.take<int32_t>(rows);
      tile_expert = c.take<int32_t>(max_tiles);
    }
    h = c.take<float>(rows * ff);
    y = c.take<float>(rows * dim);
    if (sh_ff) sh_h = c.take<float>(sh_rows * sh_ff), sh_y = c.take<float>(sh_rows * dim);
  }

  if (!gemv) {
    plan_kernel<<<1, 1024, 0, stream()>>>(a.ids, pairs, static_cast<int>(b), static_cast<int>(end), BM, rows, max_tiles,
                                          row_pair, row_of, tile_expert);
    FP_CUDA_LAUNCHED("moe plan");
  }
  // The shared expert forks onto the side stream (it reads only x) and joins before the combine.
  SideStream* ss = sh_ff ? &side() : nullptr;
  if (ss) {
    FP_CUDA(cudaEventRecord(ss->fork, stream()));
    FP_CUDA(cudaStreamWaitEvent(ss->stream, ss->fork, 0));
    const Rows shared{nullptr, nullptr, a.n, 1, 0};
    try {
      if (gemv) expert_ffn_gemv(ss->stream, a.x, nullptr, 1, 0, 1, a.n, sg, su, sd, sh_h, sh_y);
      else if (small) expert_ffn<16>(ss->stream, a.x, shared, sh_rows / BM, sg, su, sd, sh_h, sh_y);
      else expert_ffn<64>(ss->stream, a.x, shared, sh_rows / BM, sg, su, sd, sh_h, sh_y);
    } catch (...) {  // join the side stream back (a graph being recorded must not keep it), then report
      cudaEventRecord(ss->join, ss->stream);
      cudaStreamWaitEvent(stream(), ss->join, 0);
      throw;
    }
    FP_CUDA(cudaEventRecord(ss->join, ss->stream));
  }
  const Rows routed{tile_expert, row_pair, rows, static_cast<int>(a.k), static_cast<int>(b)};
  if (gemv)
    expert_ffn_gemv(stream(), a.x, a.ids, static_cast<int>(a.k), static_cast<int>(b), static_cast<int>(end), pairs, gate, up,
                    down, h, y);
  else if (small) expert_ffn<16>(stream(), a.x, routed, max_tiles, gate, up, down, h, y);
  else expert_ffn<64>(stream(), a.x, routed, max_tiles, gate, up, down, h, y);
  if (ss) FP_CUDA(cudaStreamWaitEvent(stream(), ss->join, 0));
  combine_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream()>>>(y, row_of, a.ids, static_cast<int>(b),
                                                                        static_cast<int>(end), a.weights,
                                                                        static_cast<int>(a.k), sh_y, dim, a.out);
  FP_CUDA_LAUNCHED("moe combine");
}

}  // namespace fp::cuda
