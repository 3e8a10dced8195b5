// kernels/cuda/ceiling.cu — the GPU's ceilings, measured: device-to-device copy bandwidth
// (bytes read + written) and the dense BF16 matrix-product rate through cuBLAS, each the median
// of timed repetitions (device events) after a warm-up, on random data (never zeros).
#include <algorithm>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"

namespace fp::cuda {
namespace {

__global__ void fill_random_bf16(uint16_t* p, int64_t n, uint32_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  p[i] = float_to_bf16_bits((static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 2.0f);
}

template <class F>
double median_ms(F&& body, int warmup, int reps) {
  cudaEvent_t a, b;
  FP_CUDA(cudaEventCreate(&a));
  FP_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < warmup + reps; ++r) {
    FP_CUDA(cudaEventRecord(a, stream()));
    body();
    FP_CUDA(cudaEventRecord(b, stream()));
    FP_CUDA(cudaEventSynchronize(b));
    float t = 0;
    FP_CUDA(cudaEventElapsedTime(&t, a, b));
    if (r >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

DeviceCeilings measure() {
  DeviceCeilings c;
  cudaDeviceProp prop{};
  FP_CUDA(cudaGetDeviceProperties(&prop, 0));
  c.name = std::string(prop.name) + " (" + std::to_string(prop.multiProcessorCount) + " SMs, " +
           std::to_string(prop.totalGlobalMem >> 30) + " GiB)";

  // Copy: 1 GiB each way, far beyond L2.
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer src_buf(Device::CUDA, bytes), dst_buf(Device::CUDA, bytes);  // freed on return
  void* src = src_buf.data();
  void* dst = dst_buf.data();
  const int64_t elems = static_cast<int64_t>(bytes / 2);
  fill_random_bf16<<<blocks_for(elems, 256), 256, 0, stream()>>>(static_cast<uint16_t*>(src), elems, 1);
  FP_CUDA_LAUNCHED("fill_random_bf16");
  const double copy_ms = median_ms([&] { FP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream())); }, 2, 9);
  c.copy_gbps = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3) / 1e9;

  // BF16 GEMM, 8192^3, F32 accumulation, BF16 output.
  const int n = 8192;
  const int64_t mat = static_cast<int64_t>(n) * n;
  auto* A = static_cast<uint16_t*>(src);
  auto* B = A + mat;
  auto* C = static_cast<uint16_t*>(dst);
  fill_random_bf16<<<blocks_for(2 * mat, 256), 256, 0, stream()>>>(A, 2 * mat, 2);
  FP_CUDA_LAUNCHED("fill_random_bf16");
  const float alpha = 1.0f, beta = 0.0f;
  const double gemm_ms = median_ms(
      [&] {
        FP_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                               &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      2, 9);
  c.bf16_gflops = 2.0 * n * static_cast<double>(n) * n / (gemm_ms * 1e-3) / 1e9;
  return c;
}

}  // namespace

DeviceCeilings measure_ceilings() { return measure(); }

}  // namespace fp::cuda
