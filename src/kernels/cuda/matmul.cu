// kernels/cuda/matmul.cu — y[n, out] = x[n, in] · W^T (+ bias) on the GPU, the plain kernel: one
// warp per (token, output row), each lane strides over the row one weight at a time, the warp
// sums. Reads every weight dtype of the fast kernels (F32, F16, BF16, Q8_0, Q4_K, F8_E4M3 with
// or without 128x128 block scales) at any alignment: the fallback of gemv.cu and gemm_cublas.cu.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/weights.cuh"

namespace fp::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// scale: FP8 block scales [ceil(out/sb), scale_cols] or null.
__global__ void matmul_warp_kernel(const float* x, int64_t n, const uint8_t* w, DType dtype, int64_t row_bytes, int64_t out,
                                   int64_t in, const float* scale, int64_t sb, int64_t scale_cols, const float* bias,
                                   float* y) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= n * out) return;
  const int64_t t = warp / out, o = warp % out;
  const uint8_t* row = w + o * row_bytes;
  const float* xr = x + t * in;
  const float* srow = scale ? scale + (o / sb) * scale_cols : nullptr;
  float s = 0.0f;
  for (int64_t c = lane; c < in; c += 32) {
    float wv = load_weight(row, dtype, c);
    if (srow) wv *= srow[c / sb];
    s += xr[c] * wv;
  }
  s = warp_sum(s);
  if (lane == 0) y[t * out + o] = s + (bias ? bias[o] : 0.0f);
}

}  // namespace

std::string refuse_matmul(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_K && t != DType::Q6_K &&
      t != DType::F8_E4M3)
    return std::string("weights are ") + dtype_name(t) + ", this kernel reads F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3";
  if (a.w->block_scale && a.w->scale_block <= 0) return "block scales with scale_block " + std::to_string(a.w->scale_block);
  return {};
}

void matmul(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols(), warps = a.n * out;
  if (warps == 0) return;
  const int64_t sb = w.block_scale ? w.scale_block : 1;
  matmul_warp_kernel<<<blocks_for(warps, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream()>>>(
      a.x, a.n, static_cast<const uint8_t*>(w.data), w.dtype, row_bytes(w.dtype, in), out, in, w.block_scale, sb,
      (in + sb - 1) / sb, a.bias, a.y);
  FP_CUDA_LAUNCHED("matmul");
}

}  // namespace fp::cuda
