// kernels/cuda/gemv_q8.cu — `gemv_q8`: the decode matmul y[n, out] = x[n, in] · W^T (+ bias)
// for Q8_0 weights and n <= 8 tokens, reading the weights in whole 16-byte loads.
//
// Q8_0's 34-byte blocks (f16 scale, 32 int8) are only 2-byte aligned, so the GEMVs of gemv.cu
// read a block's quarter as four 2-byte loads: 17 loads per 34 bytes, each warp-wide load
// touching 32 scattered 8-byte pieces (the H200 run of 2026-12-04: Q8_0 decode moved 1.0 TB/s
// where BF16 moved 2.4). Eight blocks are 272 = 17 x 16 bytes, so a row of in % 256 == 0 values
// starting 16-byte aligned is whole 16-byte units. Here a warp owns kRows rows; per step it
// loads the next 32 blocks of each (1088 bytes = 68 units: lanes take units lane, lane + 32 and
// lanes 0..3 unit lane + 64 — consecutive lanes, consecutive addresses, bypassing L1), stages
// them in shared memory, and then lane i takes block i: its scale and 32 values (2-byte shared
// loads) times the 32 matching values of each token's x, the dot product scaled once. Rows past
// `out` repeat the last row (its result dropped). Chained (pdl.cuh): the first step's weights
// are requested before the wait for the kernel that writes x; shared memory is written after it.
// Registered below `gemv` until a device run times the two (bench/device_check.sh).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weights.cuh"

namespace fp::cuda {
namespace {

constexpr int kRows = 2, kWarps = 4, kMaxTokens = 8;
constexpr int kBlocksPerStep = 32;                                            // one per lane
constexpr int kStepBytes = kBlocksPerStep * static_cast<int>(sizeof(BlockQ8_0));  // 1088
constexpr int kStepUnits = kStepBytes / 16;                                    // 68
static_assert(kStepBytes % 16 == 0, "a step is whole 16-byte units");

// The units of one step of one row: lane, lane + 32, lane + 64 (< units, which is 68 but for a
// row's last, shorter step).
struct StepUnits {
  uint4 v[3];
};

__device__ __forceinline__ void load_step(const uint8_t* row_step, int units, int lane, StepUnits& s) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int u = lane + 32 * k;
    if (u < units) s.v[k] = load_weights16<true>(row_step + 16 * u);
  }
}

__device__ __forceinline__ void stage_step(const StepUnits& s, int units, int lane, uint4* smem) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int u = lane + 32 * k;
    if (u < units) smem[u] = s.v[k];
  }
}

// Block `blk` of the staged step (34 bytes at 34 * blk) . token t's 32 values of x at xb, for
// the NT tokens (rows of `in` floats): acc[t] += d * dot.
template <int NT>
__device__ __forceinline__ void block_dot(const uint8_t* staged, int blk, const float* xb, int64_t in, float acc[NT]) {
  const auto* h = reinterpret_cast<const uint16_t*>(staged + 34 * blk);  // 2-byte aligned
  const float d = __half2float(__ushort_as_half(h[0]));
  float q[32];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const uint16_t v = h[1 + k];
    q[2 * k] = static_cast<float>(static_cast<int8_t>(v & 0xff));
    q[2 * k + 1] = static_cast<float>(static_cast<int8_t>(v >> 8));
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float4* xp = reinterpret_cast<const float4*>(xb + t * in);  // ordinary loads: pdl.cuh
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 xv = xp[k];
      dot = fmaf(q[4 * k], xv.x, dot);
      dot = fmaf(q[4 * k + 1], xv.y, dot);
      dot = fmaf(q[4 * k + 2], xv.z, dot);
      dot = fmaf(q[4 * k + 3], xv.w, dot);
    }
    acc[t] = fmaf(d, dot, acc[t]);
  }
}

template <int NT>
__global__ void __launch_bounds__(32 * kWarps)
    gemv_q8_kernel(const float* x, const uint8_t* __restrict__ w, int64_t row_bytes, int64_t out, int64_t in,
                   const float* __restrict__ bias, float* __restrict__ y, int64_t y_stride) {
  pdl_release();
  __shared__ uint4 stage[kWarps][kRows][kStepUnits];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= out) return;  // whole warps; no barrier below spans warps
  const uint8_t* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wrow[r] = w + min(row0 + r, out - 1) * row_bytes;
  float acc[kRows][NT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

  const int64_t nb = in / 32;  // blocks per row (a multiple of 8)
  bool waited = false;
  for (int64_t b0 = 0; b0 < nb; b0 += kBlocksPerStep) {
    const int blocks = nb - b0 < kBlocksPerStep ? static_cast<int>(nb - b0) : kBlocksPerStep;
    const int units = blocks * static_cast<int>(sizeof(BlockQ8_0)) / 16;  // blocks % 8 == 0: whole units
    StepUnits s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) load_step(wrow[r] + b0 * static_cast<int64_t>(sizeof(BlockQ8_0)), units, lane, s[r]);
    if (!waited) {
      pdl_wait();  // x is the kernel before's output
      waited = true;
    }
    __syncwarp();  // the step before has read the stage
#pragma unroll
    for (int r = 0; r < kRows; ++r) stage_step(s[r], units, lane, stage[warp][r]);
    __syncwarp();
    if (lane < blocks) {
      const float* xb = x + (b0 + lane) * 32;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        block_dot<NT>(reinterpret_cast<const uint8_t*>(stage[warp][r]), lane, xb, in, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < out) y[t * y_stride + row0 + r] = v + (bias ? bias[row0 + r] : 0.0f);
    }
}

void launch(const MatMulArgs& a, const float* x, int nt, float* y) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols();
  const int64_t rows_per_block = int64_t{kRows} * kWarps;
  const dim3 grid(static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block));
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int64_t rb = row_bytes(w.dtype, in);
#define FP_GEMV_Q8_CASE(N)                                                                                       \
  case N:                                                                                                        \
    launch_chained("gemv_q8", gemv_q8_kernel<N>, grid, dim3(32 * kWarps), 0, x, wp, rb, out, in, a.bias, y, out); \
    break;
  switch (nt) {
    FP_GEMV_Q8_CASE(1)
    FP_GEMV_Q8_CASE(2)
    FP_GEMV_Q8_CASE(3)
    FP_GEMV_Q8_CASE(4)
    FP_GEMV_Q8_CASE(5)
    FP_GEMV_Q8_CASE(6)
    FP_GEMV_Q8_CASE(7)
    FP_GEMV_Q8_CASE(8)
    default: fail("gemv_q8: ", nt, " tokens in one launch (at most ", kMaxTokens, ")");
  }
#undef FP_GEMV_Q8_CASE
}

}  // namespace

std::string refuse_gemv_q8(const MatMulArgs& a) {
  if (a.w->dtype != DType::Q8_0) return std::string("weights are ") + dtype_name(a.w->dtype) + ", this kernel reads Q8_0";
  if (a.n > kMaxTokens) return "n=" + std::to_string(a.n) + " tokens: the GEMV is for at most 8 (decode)";
  if (a.w->cols() % 256 != 0)
    return "in=" + std::to_string(a.w->cols()) + " is not a multiple of 256 (rows of whole 16-byte units: 8 blocks)";
  return {};
}

void gemv_q8(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows();
  if (a.n == 0 || out == 0) return;
  // Per call: a view that is not 16-byte aligned (or x that is not) goes to the block GEMV.
  if (w.cols() == 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0)
    return gemv(a);
  for (int64_t t0 = 0; t0 < a.n; t0 += kMaxTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kMaxTokens, a.n - t0));
    launch(a, a.x + t0 * w.cols(), nt, a.y + t0 * out);
  }
}

}  // namespace fp::cuda
