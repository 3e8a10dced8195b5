// kernels/cuda/gemv.cu — the decode matmul: y[n, out] = x[n, in] · W^T (+ bias) for n <= 8
// tokens, W in F32, F16, BF16, Q8_0, Q4_K or F8_E4M3 (128x128 block scales or none).
//
// Memory-bound: every weight byte is read once and used for all n tokens. A block of 256
// threads owns kRows = 4 consecutive weight rows; its threads split the row into chunks of 8
// weights (16-byte loads for F16/BF16, see weights.cuh) strided by 256, so each thread keeps
// kRows independent weight loads in flight per step and reuses each 8-float slice of the n
// activation rows (read from L1/L2) for all kRows rows. Partial sums meet in shared memory.
// Grid: ceil(out / 4) blocks. The `gemv_warp` variant below gives each warp 2 rows of its own.
// Both are launched chained (pdl.cuh) when that is on.
#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weights.cuh"

namespace fp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 4;
constexpr int kMaxTokens = 8;

// FP8 block scales: each of R rows' row of scales found once, the column's index once per chunk
// (in 32 bits) for all rows — 64-bit divisions per weight chunk and row cost more than the loads
// (the FP8 GEMV moved 0.6 TB/s on the H200 with them). Null rows past `out` or without scales.
template <int R>
__device__ __forceinline__ void scale_rows(const float* scale, int64_t row0, int64_t out, int64_t sb, int64_t scale_cols,
                                           const float* srow[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) srow[r] = scale && row0 + r < out ? scale + ((row0 + r) / sb) * scale_cols : nullptr;
}

// Token t's chunk c of x (rows of `in` floats), by ordinary loads: x is the kernel before's
// output (pdl.cuh says why not __ldg).
__device__ __forceinline__ void load_x8(const float* x, int64_t in, int t, int64_t c, float xv[8]) {
  const float4* xp = reinterpret_cast<const float4*>(x + t * in) + 2 * c;
  const float4 a = xp[0], b = xp[1];
  xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}

// acc[r][t] += the R rows' chunk c (wv) times the NT tokens' chunk c of x.
template <int NT, int R>
__device__ __forceinline__ void fma_chunk(const float* x, int64_t in, int64_t c, const float wv[R][8],
                                          float acc[R][NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float xv[8];
    load_x8(x, in, t, c, xv);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r][t] += wv[r][j] * xv[j];
  }
}

// One 8-weight chunk c of rows row0..row0+R-1 (zeros past `out`) times the NT tokens' chunk c of
// x, added to acc: the block GEMV's step.
template <DType T, int NT, int R>
__device__ __forceinline__ void gemv_chunk(const float* x, const uint8_t* __restrict__ w, int64_t row_bytes,
                                           int64_t row0, int64_t out, int64_t in, const float* const srow[R], uint32_t sb32,
                                           int64_t c, float acc[R][NT]) {
  float wv[R][8];
  const uint32_t scol = srow[0] ? static_cast<uint32_t>(8 * c) / sb32 : 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r < out) {
      load8<T>(w + (row0 + r) * row_bytes, c, wv[r]);
      if (srow[r]) {
        const float s = __ldg(srow[r] + scol);
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[r][j] *= s;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) wv[r][j] = 0.0f;
    }
  }
  fma_chunk<NT, R>(x, in, c, wv, acc);
}

// x [NT, in] (row stride in), W rows of row_bytes; scale: FP8 block scales or null.
template <DType T, int NT>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const float* x, const uint8_t* __restrict__ w,
                                                        int64_t row_bytes, int64_t out, int64_t in,
                                                        const float* __restrict__ scale, int64_t sb, int64_t scale_cols,
                                                        const float* __restrict__ bias, float* __restrict__ y,
                                                        int64_t y_stride) {
  pdl_release();
  pdl_wait();  // chained (pdl.cuh): x is the kernel before's output
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t chunks = in / 8;
  float acc[kRows][NT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

  const float* srow[kRows];
  scale_rows<kRows>(scale, row0, out, sb, scale_cols, srow);
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads)
    gemv_chunk<T, NT, kRows>(x, w, row_bytes, row0, out, in, srow, static_cast<uint32_t>(sb), c, acc);

  __shared__ float red[kThreads / 32][kRows * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r * NT + t] = v;
    }
  __syncthreads();
  if (threadIdx.x < kRows * NT) {
    const int r = threadIdx.x / NT, t = threadIdx.x % NT;
    const int64_t o = row0 + r;
    if (o < out) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < kThreads / 32; ++k) s += red[k][threadIdx.x];
      y[t * y_stride + o] = s + (bias ? bias[o] : 0.0f);
    }
  }
}

template <DType T>
void launch_gemv(const MatMulArgs& a, const float* x, int nt, float* y) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols();
  const int64_t sb = w.block_scale ? w.scale_block : 1;
  const dim3 grid(static_cast<unsigned>((out + kRows - 1) / kRows));
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int64_t rb = row_bytes(w.dtype, in), sc = (in + sb - 1) / sb;
  const float* scale = w.block_scale;
#define FP_GEMV_CASE(N)                                                                                                \
  case N:                                                                                                              \
    launch_chained("gemv", gemv_kernel<T, N>, grid, dim3(kThreads), 0, x, wp, rb, out, in, scale, sb, sc, a.bias, y, out); \
    break;
  switch (nt) {
    FP_GEMV_CASE(1)
    FP_GEMV_CASE(2)
    FP_GEMV_CASE(3)
    FP_GEMV_CASE(4)
    FP_GEMV_CASE(5)
    FP_GEMV_CASE(6)
    FP_GEMV_CASE(7)
    FP_GEMV_CASE(8)
    default: fail("gemv: ", nt, " tokens in one launch (at most ", kMaxTokens, ")");
  }
#undef FP_GEMV_CASE
}

// The `gemv_warp` variant: a warp owns kWarpRows consecutive rows on its own (no shared memory,
// no block barrier; 4 warps per block). Its lanes stride over the rows in 8-weight chunks, and
// each pass of the main loop requests kUnroll chunks of every row before it uses any: the loads
// carry no guard (a row past `out` reads the last row again, dropped at the end; the remainder
// of fewer than 32 * kUnroll chunks runs in a loop of its own), so they are in flight together,
// kWarpRows * kUnroll * 16 bytes per lane for BF16. The plain dtypes' weights bypass L1
// (load_weights16), which keeps the activations every warp reads. FP8 block scales multiply
// each chunk's dot product, not its weights. Chained (pdl.cuh): the first pass's weights are
// requested before the wait for the kernel that writes x.
// (The first version, 2 rows and 2 guarded chunks in flight, was written after the H200 run of
// 2026-12-04, where the block GEMV moved 2.6 of 4.2 TB/s, and never ran on a GPU.)
constexpr int kWarpRows = 2, kWarpsPerBlock = 4, kUnroll = 4;

// The FP8 block-scale column of chunk c: a shift where the block is a power of two (128 for
// DeepSeek's checkpoints; sb_shift >= 0), else a division.
__device__ __forceinline__ uint32_t scale_col(int64_t c, uint32_t sb32, int sb_shift) {
  const auto e = static_cast<uint32_t>(8 * c);
  return sb_shift >= 0 ? e >> sb_shift : e / sb32;
}

// Chunk c of R rows as floats (wv) and each row's block scale for it (s; 1 without scales).
template <DType T, int R>
__device__ __forceinline__ void load_rows(const uint8_t* const wrow[R], const float* const srow[R], uint32_t scol, int64_t c,
                                          float wv[R][8], float s[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    load8<T, true>(wrow[r], c, wv[r]);
    s[r] = srow[r] ? __ldg(srow[r] + scol) : 1.0f;
  }
}

// acc[r][t] += s[r] * (row r's chunk c . token t's chunk c of x): the scale multiplies the
// chunk's dot product once rather than each of its 8 weights (FP8 decode is short of ALU).
template <int NT, int R>
__device__ __forceinline__ void fma_chunk_scaled(const float* x, int64_t in, int64_t c, const float wv[R][8],
                                                 const float s[R], float acc[R][NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float xv[8];
    load_x8(x, in, t, c, xv);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float d = wv[r][0] * xv[0];
#pragma unroll
      for (int j = 1; j < 8; ++j) d = fmaf(wv[r][j], xv[j], d);
      acc[r][t] = fmaf(s[r], d, acc[r][t]);
    }
  }
}

template <DType T, int NT>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_warp_kernel(const float* x, const uint8_t* __restrict__ w, int64_t row_bytes, int64_t out, int64_t in,
                     const float* __restrict__ scale, int64_t sb, int sb_shift, int64_t scale_cols,
                     const float* __restrict__ bias, float* __restrict__ y, int64_t y_stride) {
  pdl_release();
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kWarpRows;
  if (row0 >= out) return;  // whole warps; they touch nothing
  const uint8_t* wrow[kWarpRows];
  const float* srow[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int64_t row = min(row0 + r, out - 1);
    wrow[r] = w + row * row_bytes;
    srow[r] = scale ? scale + (row / sb) * scale_cols : nullptr;
  }
  const uint32_t sb32 = static_cast<uint32_t>(sb);
  float acc[kWarpRows][NT];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

  const int64_t chunks = in / 8, main_end = chunks - chunks % (32 * kUnroll);
  int64_t c = lane;
  bool waited = false;
  for (; c < main_end; c += 32 * kUnroll) {
    float wv[kUnroll][kWarpRows][8], s[kUnroll][kWarpRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      load_rows<T, kWarpRows>(wrow, srow, scale_col(c + 32 * u, sb32, sb_shift), c + 32 * u, wv[u], s[u]);
    if (!waited) {
      pdl_wait();  // x is the kernel before's output
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fma_chunk_scaled<NT, kWarpRows>(x, in, c + 32 * u, wv[u], s[u], acc);
  }
  if (!waited) pdl_wait();
  for (; c < chunks; c += 32) {
    float wv[kWarpRows][8], s[kWarpRows];
    load_rows<T, kWarpRows>(wrow, srow, scale_col(c, sb32, sb_shift), c, wv, s);
    fma_chunk_scaled<NT, kWarpRows>(x, in, c, wv, s, acc);
  }
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < out) y[t * y_stride + row0 + r] = v + (bias ? bias[row0 + r] : 0.0f);
    }
}

template <DType T>
void launch_gemv_warp(const MatMulArgs& a, const float* x, int nt, float* y) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols();
  const int64_t sb = w.block_scale ? w.scale_block : 1;
  const int64_t rows_per_block = int64_t{kWarpRows} * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block));
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int64_t rb = row_bytes(w.dtype, in), sc = (in + sb - 1) / sb;
  const float* scale = w.block_scale;
  int sb_shift = -1;  // log2(sb) where sb is a power of two
  for (int k = 0; k < 31; ++k)
    if (int64_t{1} << k == sb) sb_shift = k;
#define FP_GEMV_CASE(N)                                                                                                 \
  case N:                                                                                                               \
    launch_chained("gemv_warp", gemv_warp_kernel<T, N>, grid, dim3(32 * kWarpsPerBlock), 0, x, wp, rb, out, in, scale, \
                   sb, sb_shift, sc, a.bias, y, out);                                                                   \
    break;
  switch (nt) {
    FP_GEMV_CASE(1)
    FP_GEMV_CASE(2)
    FP_GEMV_CASE(3)
    FP_GEMV_CASE(4)
    FP_GEMV_CASE(5)
    FP_GEMV_CASE(6)
    FP_GEMV_CASE(7)
    FP_GEMV_CASE(8)
    default: fail("gemv_warp: ", nt, " tokens in one launch (at most ", kMaxTokens, ")");
  }
#undef FP_GEMV_CASE
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The alignment the chunk loads need (weights.cuh): of the weight data and of x.
uintptr_t weight_alignment(DType t) { return t == DType::Q6_K ? 1 : t == DType::Q8_0 ? 2 : t == DType::F8_E4M3 ? 8 : 16; }

}  // namespace

std::string refuse_gemv(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_K && t != DType::Q6_K &&
      t != DType::F8_E4M3)
    return std::string("weights are ") + dtype_name(t) + ", this kernel reads F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3";
  if (a.n > kMaxTokens) return "n=" + std::to_string(a.n) + " tokens: the GEMV is for at most 8 (decode)";
  if (a.w->cols() % 8 != 0) return "in=" + std::to_string(a.w->cols()) + " is not a multiple of 8";
  if (a.w->block_scale && (a.w->scale_block <= 0 || a.w->scale_block % 8 != 0))
    return "block scales with scale_block " + std::to_string(a.w->scale_block) + " (needs a multiple of 8)";
  return {};
}

namespace {

// Both GEMVs: the per-call checks, then launches of at most kMaxTokens tokens each.
template <template <DType> class Launch>
void run_gemv(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows();
  if (a.n == 0 || out == 0) return;
  // Checked per call, not in refuse: a view at an odd address runs on the plain kernel rather
  // than faulting. (Rows that are not whole 8-value chunks are refused: dispatch re-asks.)
  if (w.cols() == 0 || !aligned(w.data, weight_alignment(w.dtype)) || !aligned(a.x, 16)) return matmul(a);
  for (int64_t t0 = 0; t0 < a.n; t0 += kMaxTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kMaxTokens, a.n - t0));
    const float* x = a.x + t0 * w.cols();
    float* y = a.y + t0 * out;
    switch (w.dtype) {
      case DType::F32: Launch<DType::F32>::run(a, x, nt, y); break;
      case DType::F16: Launch<DType::F16>::run(a, x, nt, y); break;
      case DType::BF16: Launch<DType::BF16>::run(a, x, nt, y); break;
      case DType::Q8_0: Launch<DType::Q8_0>::run(a, x, nt, y); break;
      case DType::Q4_K: Launch<DType::Q4_K>::run(a, x, nt, y); break;
      case DType::Q6_K: Launch<DType::Q6_K>::run(a, x, nt, y); break;
      case DType::F8_E4M3: Launch<DType::F8_E4M3>::run(a, x, nt, y); break;
      default: fail("gemv: weights of ", dtype_name(w.dtype));
    }
  }
}

template <DType T>
struct BlockGemv {
  static void run(const MatMulArgs& a, const float* x, int nt, float* y) { launch_gemv<T>(a, x, nt, y); }
};
template <DType T>
struct WarpGemv {
  static void run(const MatMulArgs& a, const float* x, int nt, float* y) { launch_gemv_warp<T>(a, x, nt, y); }
};

}  // namespace

void gemv(const MatMulArgs& a) { run_gemv<BlockGemv>(a); }
void gemv_warp(const MatMulArgs& a) { run_gemv<WarpGemv>(a); }

}  // namespace fp::cuda
