// kernels/cpu/moe_gemv.h — many small GEMVs in one parallel region. Decode of an MoE layer or
// of MLA's per-head projections is dozens of matrix-vector products of a few hundred KB to a few
// MB each; dispatched one by one, each pays a thread wake-up (milliseconds on a busy machine).
// Here every job's rows are cut into blocks and the blocks of all jobs are shared out at once.
// F32/F16/BF16/Q8_0 weights without block scales; callers fall back to matmul otherwise.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/simd_avx2.h"

namespace fp::moe_gemv {

// Dot product of a float-like weight row (dtype T) with x, n values (n % 8 == 0).
template <DType T>
FP_AVX2_INLINE float dot_row(const void* row, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    s0 = _mm256_fmadd_ps(avx2::load8<T>(row, k), _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(avx2::load8<T>(row, k + 8), _mm256_loadu_ps(x + k + 8), s1);
  }
  for (; k < n; k += 8) s0 = _mm256_fmadd_ps(avx2::load8<T>(row, k), _mm256_loadu_ps(x + k), s0);
  return avx2::hsum(_mm256_add_ps(s0, s1));
}

// Q8_0 rows: each block's 32 int8 widened to f32 and dotted with x, times the block scale
// (f32 activations: closer to the reference than ggml's 8-bit activation rounding).
FP_AVX2 inline float dot_q8_0(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 32, ++b) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16));
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(x + k));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(x + k + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(x + k + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(x + k + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b->d)), s, acc);
  }
  return avx2::hsum(acc);
}

FP_AVX2 inline float dot(const Tensor& w, int64_t r, const float* x) {
  const int64_t n = w.cols();
  const uint8_t* row = w.row_ptr(r);
  switch (w.dtype) {
    case DType::Q8_0: return dot_q8_0(row, x, n);
    case DType::F16: return dot_row<DType::F16>(row, x, n);
    case DType::BF16: return dot_row<DType::BF16>(row, x, n);
    default: return dot_row<DType::F32>(row, x, n);
  }
}

// "" when w can be used here.
inline std::string refuse(const Tensor& w) {
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16 && w.dtype != DType::Q8_0)
    return std::string("weights are ") + dtype_name(w.dtype) + " (this path takes F32/F16/BF16/Q8_0)";
  if (w.block_scale) return "block-scaled weights";
  if (w.cols() % (w.dtype == DType::Q8_0 ? 32 : 8)) return "rows of " + std::to_string(w.cols()) + " values (needs a multiple of 8, Q8_0 of 32)";
  return {};
}

// y_j = W_j x_j for every job, in one parallel region over blocks of `block` rows.
struct Job {
  const Tensor* w;
  const float* x;
  float* y;
};
inline void run(const std::vector<Job>& jobs, int64_t block = 16) {
  std::vector<int64_t> first(jobs.size() + 1, 0);  // first block of each job
  for (size_t j = 0; j < jobs.size(); ++j) first[j + 1] = first[j] + (jobs[j].w->rows() + block - 1) / block;
  thread_pool().parallel_for(first.back(), 1, [&](int64_t b0, int64_t b1) {
    size_t j = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin()) - 1;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[j + 1]) ++j;
      const Job& job = jobs[j];
      const int64_t r0 = (b - first[j]) * block, r1 = std::min(job.w->rows(), r0 + block);
      for (int64_t r = r0; r < r1; ++r) job.y[r] = dot(*job.w, r, job.x);
    }
  });
}

}  // namespace fp::moe_gemv
