// kernels/cpu/exp_avx2.h — vectorized exp for the AVX2 element-wise and attention kernels,
// plus masked loads/stores for row tails. Include after simd_avx2.h (FP_AVX2_INLINE).
//
// exp8(x): e^x on 8 floats. x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite two-constant split),
// e^r by its degree-6 Taylor polynomial (truncation error r^7/7! <= 1.2e-7 relative), 2^n put
// into the exponent bits. Measured against double-precision exp over [-87, 88]: max relative
// error 2.3e-7 (about 2 ulp; tests/backend_ops_elementwise_test.cpp checks <= 5e-7).
// Range: x < -87.3365 (below the smallest normal float) gives 0, so exp8(-inf) == 0;
// x > 88 saturates to e^88 (1.65e38) instead of overflowing; NaN stays NaN.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/simd_avx2.h"

namespace fp::avx2 {

FP_AVX2_INLINE __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654475f);  // ln(2^-126)
  const __m256 hi = _mm256_set1_ps(88.0f);
  // max/min return their second operand when either is NaN: a NaN x passes through.
  __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);   // ln2 high bits (exact product)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);         // ln2 - high bits
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n in [-126, 127]: 2^n as a float is (n + 127) << 23.
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);  // underflow (and -inf) -> 0
}

// e^x - 1 on 8 floats without the cancellation near 0: for |x| < ln2/2 its Taylor polynomial
// through x^7 (truncation <= 1.2e-9 relative), else exp8(x) - 1 (>= 0.29 in size, so a few ulp).
FP_AVX2_INLINE __m256 expm1_8(__m256 x) {
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.34657359f), _CMP_LT_OQ);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f));
  p = _mm256_mul_ps(p, x);
  return _mm256_blendv_ps(_mm256_sub_ps(exp8(x), _mm256_set1_ps(1.0f)), p, small);
}

// cap * tanh(x / cap) on 8 floats (logit soft-capping): tanh(a) = -m / (2 + m) with
// m = expm1(-2a) for a = |x| / cap, the sign put back. About 4e-7 relative; saturates to
// exactly +-cap (exp8's underflow); NaN stays NaN.
FP_AVX2_INLINE __m256 softcap8(__m256 x, __m256 cap, __m256 two_over_cap) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 m = expm1_8(_mm256_mul_ps(_mm256_andnot_ps(sign_bit, x), _mm256_xor_ps(two_over_cap, sign_bit)));
  const __m256 t = _mm256_div_ps(_mm256_xor_ps(m, sign_bit), _mm256_add_ps(m, _mm256_set1_ps(2.0f)));
  return _mm256_or_ps(_mm256_mul_ps(cap, t), _mm256_and_ps(x, sign_bit));
}

// Lane mask with the first `count` (0..8) lanes set, for maskload/maskstore of a row tail.
FP_AVX2_INLINE __m256i tail_mask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Horizontal max of 8 floats.
FP_AVX2_INLINE float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

}  // namespace fp::avx2
