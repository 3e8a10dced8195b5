// kernels/cuda/matmul.cu — y[n, out] = x[n, in] · W^T (+ bias) on the GPU, W in F32, F16, BF16 or
// Q8_0 (optionally FP8-style block scales are refused). One warp per (token, output row): each
// lane strides over the row, the warp sums — a first, plainly correct kernel.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void matmul_warp_kernel(const float* x, int64_t n, const uint8_t* w, DType dtype, int64_t row_bytes, int64_t out,
                                   int64_t in, const float* bias, float* y) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= n * out) return;
  const int64_t t = warp / out, o = warp % out;
  const uint8_t* row = w + o * row_bytes;
  const float* xr = x + t * in;
  float s = 0.0f;
  for (int64_t c = lane; c < in; c += 32) s += xr[c] * load_element(row, dtype, c);
  s = warp_sum(s);
  if (lane == 0) y[t * out + o] = s + (bias ? bias[o] : 0.0f);
}

}  // namespace

std::string refuse_matmul(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0)
    return std::string("weights are ") + dtype_name(t) + ", this kernel reads F32, F16, BF16, Q8_0";
  if (a.w->block_scale) return "block-scaled weights are not supported by this kernel";
  return {};
}

void matmul(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols(), warps = a.n * out;
  if (warps == 0) return;
  matmul_warp_kernel<<<blocks_for(warps, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream()>>>(
      a.x, a.n, static_cast<const uint8_t*>(w.data), w.dtype, row_bytes(w.dtype, in), out, in, a.bias, a.y);
  FP_CUDA_LAUNCHED("matmul");
}

}  // namespace fp::cuda
