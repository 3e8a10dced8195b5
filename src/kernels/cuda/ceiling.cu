// kernels/cuda/ceiling.cu — the GPU's ceilings, measured: device-to-device copy bandwidth
// (bytes read + written) and the dense BF16 matrix-product rate through cuBLAS, each the median
// of timed repetitions (device events) after a warm-up, on random data (never zeros). Beside
// them, the engine's own matmul op at one large shape on BF16 weights and on FP8 block-scaled
// weights (both of its FP8 paths), so that bench reports the FP8 GEMM's gain over BF16, and the
// decode GEMVs alone at one token.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

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

__device__ float random_unit(int64_t i, uint32_t seed) {  // in [-1, 1)
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 2.0f;
}

// scale_min == 0: values in [-1, 1); else scales in [scale_min, 2 scale_min).
__global__ void fill_random_f32(float* p, int64_t n, uint32_t seed, float scale_min) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u = random_unit(i, seed);
  p[i] = scale_min > 0.0f ? scale_min * (1.5f + 0.5f * u) : u;
}

__global__ void fill_random_fp8(uint8_t* p, int64_t n, uint32_t seed) {  // E4M3 in [-240, 240)
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(240.0f * random_unit(i, seed), __NV_SATFINITE, __NV_E4M3));
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

// The engine's matmul op, y[n, n] = x[n, n] W^T with F32 x and y, n = 8192: W in BF16 (gemm_cublas),
// W in FP8 E4M3 with 128x128 block scales (cublaslt_fp8 where it runs: Hopper; and gemm_cublas,
// which dequantizes it to BF16 panels first). Random data throughout.
void measure_engine_gemms(DeviceCeilings& c) {
  const int64_t n = 8192, sb = 128;
  const double flop = 2.0 * n * static_cast<double>(n) * n;
  DeviceBuffer x_buf(Device::CUDA, n * n * sizeof(float)), y_buf(Device::CUDA, n * n * sizeof(float));
  DeviceBuffer w16_buf(Device::CUDA, n * n * 2), w8_buf(Device::CUDA, n * n), s_buf(Device::CUDA, (n / sb) * (n / sb) * sizeof(float));
  auto* x = static_cast<float*>(x_buf.data());
  fill_random_f32<<<blocks_for(n * n, 256), 256, 0, stream()>>>(x, n * n, 3, 0.0f);
  FP_CUDA_LAUNCHED("fill_random_f32");
  fill_random_bf16<<<blocks_for(n * n, 256), 256, 0, stream()>>>(static_cast<uint16_t*>(w16_buf.data()), n * n, 4);
  FP_CUDA_LAUNCHED("fill_random_bf16");
  fill_random_fp8<<<blocks_for(n * n, 256), 256, 0, stream()>>>(static_cast<uint8_t*>(w8_buf.data()), n * n, 5);
  FP_CUDA_LAUNCHED("fill_random_fp8");
  // Scales near 1/(240 * 64): products of the order of the BF16 case's.
  fill_random_f32<<<blocks_for((n / sb) * (n / sb), 256), 256, 0, stream()>>>(static_cast<float*>(s_buf.data()),
                                                                                (n / sb) * (n / sb), 6, 6.5e-5f);
  FP_CUDA_LAUNCHED("fill_random_f32");
  Tensor w16 = Tensor::view(w16_buf.data(), DType::BF16, {n, n});
  Tensor w8 = Tensor::view(w8_buf.data(), DType::F8_E4M3, {n, n});
  w8.block_scale = static_cast<const float*>(s_buf.data());
  w8.scale_block = sb;
  MatMulArgs a;
  a.x = x;
  a.n = n;
  a.y = static_cast<float*>(y_buf.data());
  auto gflops = [&](void (*gemm)(const MatMulArgs&)) { return flop / (median_ms([&] { gemm(a); }, 2, 7) * 1e-3) / 1e9; };
  a.w = &w16;
  c.gemm_bf16_gflops = gflops(gemm_cublas);
  a.w = &w8;
  c.gemm_fp8_dequant_gflops = gflops(gemm_cublas);
  if (refuse_cublaslt_fp8(a).empty()) {
    const int64_t fallbacks = cublaslt_fp8_fallbacks();
    const double r = gflops(gemm_cublaslt_fp8);
    c.gemm_fp8_gflops = cublaslt_fp8_fallbacks() == fallbacks ? r : 0.0;  // 0: it ran gemm_cublas instead
    const Fp8GemmTuning t = cublaslt_fp8_tuning(n, n, n);
    c.lt_fp8_candidates = t.candidates;
    if (t.first_ms > 0) c.lt_fp8_first_gflops = flop / (t.first_ms * 1e-3) / 1e9;
    if (t.chosen_ms > 0) c.lt_fp8_chosen_gflops = flop / (t.chosen_ms * 1e-3) / 1e9;
  }
}

// The decode GEMV alone at one token on BF16 weights: Llama-3-8B's stacked Q/K/V (6144 x 4096),
// attention output (4096 x 4096), stacked gate/up (28672 x 4096), down (4096 x 14336) and
// output head (128256 x 4096); `gemv` and `gemv_warp` on the same data, weight bytes per second.
// Each timing is a run of launches one after another, each on its own part of a 1 GiB buffer
// (at least 128 MB in all, so that no launch finds its weights in L2: 50 MB on the H100/H200), as
// a decode step runs its GEMVs back to back; then the same chained (pdl.cuh), where the GPU can.
// About 10 s of streaming: only on request (bench --gemv-rates).
// What a decode step's matmuls can reach, apart from the other kernels between them.
void measure_gemvs(DeviceCeilings& c) {
  struct Shape {
    int64_t out, in;
  };
  const Shape shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
  int64_t most = 0, widest = 0, tallest = 0;
  for (const Shape& s : shapes) most = std::max(most, s.out * s.in), widest = std::max(widest, s.in), tallest = std::max(tallest, s.out);
  DeviceBuffer w_buf(Device::CUDA, static_cast<size_t>(most) * 2), x_buf(Device::CUDA, static_cast<size_t>(widest) * sizeof(float)),
      y_buf(Device::CUDA, static_cast<size_t>(tallest) * sizeof(float));
  fill_random_bf16<<<blocks_for(most, 256), 256, 0, stream()>>>(static_cast<uint16_t*>(w_buf.data()), most, 7);
  FP_CUDA_LAUNCHED("fill_random_bf16");
  fill_random_f32<<<blocks_for(widest, 256), 256, 0, stream()>>>(static_cast<float*>(x_buf.data()), widest, 8, 0.0f);
  FP_CUDA_LAUNCHED("fill_random_f32");
  const bool chained = pdl_launches();
  struct Restore {  // the process's setting back, also when a measurement throws
    bool on;
    ~Restore() { set_pdl_launches(on); }
  } restore{chained};
  for (const Shape& s : shapes) {
    // At least 128 MB of weights per timing, far beyond L2 (4 copies of the 32 MB matrix, 1 of the head).
    const int64_t elems = s.out * s.in, views = std::clamp<int64_t>(((int64_t{128} << 20) + elems - 1) / elems, 1,
                                                                      std::min<int64_t>(8, most / elems));
    std::vector<Tensor> w;
    for (int64_t i = 0; i < views; ++i)
      w.push_back(Tensor::view(static_cast<uint16_t*>(w_buf.data()) + i * elems, DType::BF16, {s.out, s.in}));
    MatMulArgs a;
    a.x = static_cast<const float*>(x_buf.data());
    a.n = 1;
    a.y = static_cast<float*>(y_buf.data());
    const double bytes = 2.0 * static_cast<double>(elems * views);
    auto gbps = [&](void (*kernel)(const MatMulArgs&), bool chain) {
      set_pdl_launches(chain);
      const double ms = median_ms(
          [&] {
            for (const Tensor& t : w) {
              a.w = &t;
              kernel(a);
            }
          },
          1, 5);
      return bytes / (ms * 1e-3) / 1e9;
    };
    DeviceCeilings::GemvRate r;
    r.out = s.out;
    r.in = s.in;
    r.gemv_gbps = gbps(gemv, false);
    r.gemv_warp_gbps = gbps(gemv_warp, false);
    set_pdl_launches(true);
    if (pdl_launches()) {  // the GPU can
      r.gemv_chained_gbps = gbps(gemv, true);
      r.gemv_warp_chained_gbps = gbps(gemv_warp, true);
    }
    c.gemv_rates.push_back(r);
  }
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
  measure_engine_gemms(c);
  c.chained_launches = pdl_launches();
  return c;
}

}  // namespace

DeviceCeilings measure_ceilings() { return measure(); }
void measure_gemv_rates(DeviceCeilings& c) { measure_gemvs(c); }

}  // namespace fp::cuda
