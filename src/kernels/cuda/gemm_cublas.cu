// kernels/cuda/gemm_cublas.cu — the prefill matmul through cuBLAS: y[n, out] = x[n, in] · W^T
// (+ bias), computed in F32 with F32 output.
//   F32 weights:  cublasGemmEx on F32 (CUBLAS_COMPUTE_32F under the handle's default math mode:
//                 no TF32, so it compares tightly with the reference).
//   F16 / BF16:   x is converted to the weight dtype (scratch slot 0; BF16 x that came with the
//                 call, MatMulArgs::xb, is taken as it is), then GemmEx 16F/16BF x 16F/16BF -> 32F
//                 on the tensor cores.
//   Q8_0 / Q4_K:  panels of weight rows are dequantized to F16 (scratch slot 1), x to F16, then
//                 the same GemmEx per panel ("dequantize, then the dense GEMM", as llama.cpp).
//   F8_E4M3:      likewise to BF16, the 128x128 block scales applied while dequantizing (FP8
//                 weights come from BF16 checkpoints; their range does not fit F16 after scaling).
// The bias is added by a small kernel afterwards. Row-major y = x W^T is column-major
// y^T = W^T' x^T': C (out x n, ldc out) = op(A) B with A = W seen column-major (in x out, lda in),
// transposed, and B = x (in x n, ldb in).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/weights.cuh"

namespace fp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kPanelBytes = int64_t{256} << 20;  // dequantized weights per GEMM call

template <bool BF16>
__global__ void convert_kernel(const float* __restrict__ x, int64_t count, uint16_t* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = BF16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]);
}

// Rows [0, rows) of w (already offset to the panel's first row; o0 its index, for the block
// scales) to 16-bit floats, one thread per chunk of 8 weights: dst [rows, in], 16-byte stores.
template <DType T, bool BF16>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t rows, int64_t in, int64_t o0,
                               const float* __restrict__ scale, int64_t sb, int64_t scale_cols, uint16_t* __restrict__ dst) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, chunks = in / 8;
  if (idx >= rows * chunks) return;
  const int64_t r = idx / chunks, c = idx % chunks;
  float v[8];
  load8<T>(w + r * row_bytes, c, v);
  if (scale) {
    const float s = scale[((o0 + r) / sb) * scale_cols + (8 * c) / sb];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] *= s;
  }
  uint32_t words[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t lo = BF16 ? float_to_bf16_bits(v[2 * k]) : float_to_half_bits(v[2 * k]);
    const uint32_t hi = BF16 ? float_to_bf16_bits(v[2 * k + 1]) : float_to_half_bits(v[2 * k + 1]);
    words[k] = lo | (hi << 16);
  }
  reinterpret_cast<uint4*>(dst + r * in)[c] = make_uint4(words[0], words[1], words[2], words[3]);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n * out) y[i] += bias[i % out];
}

// C[out x n] (column-major, ldc = ldc) = A^T B: A is `rows` weight rows of `in` (type at),
// B is n activation rows of `in` (type bt == at).
void gemm(const void* w, cudaDataType at, const void* x, int64_t rows, int64_t n, int64_t in, float* y, int64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  FP_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n), static_cast<int>(in),
                         &one, w, at, static_cast<int>(in), x, at, static_cast<int>(in), &zero, y, CUDA_R_32F,
                         static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// x [n, in] f32 -> scratch slot 0 as F16 or BF16; BF16 given with the call (MatMulArgs::xb) is
// used as it is.
const uint16_t* convert_x(const MatMulArgs& a, int64_t in, bool bf16) {
  if (bf16 && a.xb) return a.xb;
  const int64_t count = a.n * in;
  auto* xh = static_cast<uint16_t*>(scratch(static_cast<size_t>(count) * 2, 0));
  if (bf16) convert_kernel<true><<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(a.x, count, xh);
  else convert_kernel<false><<<blocks_for(count, kThreads), kThreads, 0, stream()>>>(a.x, count, xh);
  FP_CUDA_LAUNCHED("gemm convert x");
  return xh;
}

template <DType T, bool BF16>
void dequant_panel(const Tensor& w, int64_t o0, int64_t rows, uint16_t* dst) {
  const int64_t in = w.cols(), rb = row_bytes(w.dtype, in), sb = w.block_scale ? w.scale_block : 1;
  const int64_t threads = rows * (in / 8);
  dequant_kernel<T, BF16><<<blocks_for(threads, kThreads), kThreads, 0, stream()>>>(
      static_cast<const uint8_t*>(w.data) + o0 * rb, rb, rows, in, o0, w.block_scale, sb, (in + sb - 1) / sb, dst);
  FP_CUDA_LAUNCHED("gemm dequantize");
}

void quantized_gemm(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols();
  const bool bf16 = w.dtype == DType::F8_E4M3;
  const uint16_t* xh = convert_x(a, in, bf16);
  const int64_t panel = std::min<int64_t>(out, std::max<int64_t>(256, kPanelBytes / (2 * in)));
  auto* wh = static_cast<uint16_t*>(scratch(static_cast<size_t>(panel * in) * 2, 1));
  for (int64_t o0 = 0; o0 < out; o0 += panel) {
    const int64_t rows = std::min(panel, out - o0);
    switch (w.dtype) {
      case DType::Q8_0: dequant_panel<DType::Q8_0, false>(w, o0, rows, wh); break;
      case DType::Q4_K: dequant_panel<DType::Q4_K, false>(w, o0, rows, wh); break;
      case DType::Q6_K: dequant_panel<DType::Q6_K, false>(w, o0, rows, wh); break;
      case DType::F8_E4M3: dequant_panel<DType::F8_E4M3, true>(w, o0, rows, wh); break;
      default: fail("cublas matmul: cannot dequantize ", dtype_name(w.dtype));
    }
    gemm(wh, bf16 ? CUDA_R_16BF : CUDA_R_16F, xh, rows, a.n, in, a.y + o0, out);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

std::string refuse_gemm_cublas(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_K && t != DType::Q6_K &&
      t != DType::F8_E4M3)
    return std::string("weights are ") + dtype_name(t) + ", this kernel reads F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3";
  if (a.w->block_scale && t != DType::F8_E4M3) return std::string("block scales on ") + dtype_name(t) + " weights";
  if (a.w->block_scale && (a.w->scale_block <= 0 || a.w->scale_block % 8 != 0))
    return "block scales with scale_block " + std::to_string(a.w->scale_block) + " (needs a multiple of 8)";
  if (t == DType::F8_E4M3 && a.w->cols() % 8 != 0) return "F8_E4M3 with in=" + std::to_string(a.w->cols()) + ", not a multiple of 8";
  const int64_t big = int64_t{1} << 31;
  if (a.n >= big || a.w->rows() >= big || a.w->cols() >= big) return "a dimension beyond cuBLAS's 32-bit sizes";
  return {};
}

void gemm_cublas(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), in = w.cols();
  if (a.n == 0 || out == 0) return;
  const bool quantized = w.dtype == DType::Q8_0 || w.dtype == DType::Q4_K || w.dtype == DType::Q6_K || w.dtype == DType::F8_E4M3;
  // Per call (dispatch caches per shape class): an empty reduction or a weight view the 16-byte
  // dequantizing loads cannot read goes to the plain kernel.
  // Float weights go to cuBLAS as they are, which needs them aligned to their element size (a
  // view 2 bytes into an F32 buffer faulted on the H200).
  const uintptr_t need = w.dtype == DType::Q6_K ? 1 : w.dtype == DType::Q8_0 ? 2 : w.dtype == DType::F8_E4M3 ? 8 : 16;
  const uintptr_t element = w.dtype == DType::F32 ? 4 : 2;
  if (in == 0 || (quantized && !aligned(w.data, need)) || (!quantized && !aligned(w.data, element))) return matmul(a);
  switch (w.dtype) {
    case DType::F32: gemm(w.data, CUDA_R_32F, a.x, out, a.n, in, a.y, out); break;
    case DType::F16: gemm(w.data, CUDA_R_16F, convert_x(a, in, false), out, a.n, in, a.y, out); break;
    case DType::BF16: gemm(w.data, CUDA_R_16BF, convert_x(a, in, true), out, a.n, in, a.y, out); break;
    default: quantized_gemm(a);
  }
  if (a.bias) {
    add_bias_kernel<<<blocks_for(a.n * out, kThreads), kThreads, 0, stream()>>>(a.y, a.bias, a.n, out);
    FP_CUDA_LAUNCHED("gemm bias");
  }
}

}  // namespace fp::cuda
