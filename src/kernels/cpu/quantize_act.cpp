// kernels/cpu/quantize_act.cpp — see quantize_act.h. Q8_0 has an AVX2 form (every matmul of a
// batch quantizes its activations, about a tenth of a prefill's time when it was scalar) that
// gives bit-identical blocks to the scalar quantize_row_q8_0, ties rounded away from zero
// included; Q8_K is a plain loop.
#include "kernels/cpu/quantize_act.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/cpu_features.h"

namespace fp {
namespace {

__attribute__((target("avx2,fma,f16c"))) void quantize_q8_0_avx2(const float* x, BlockQ8_0* out, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const float* v = x + i * QK8_0;
    __m256 xs[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      xs[k] = _mm256_loadu_ps(v + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, xs[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    out[i].d = f32_to_f16(d);
    __m256i q32[4];
    for (int k = 0; k < 4; ++k) {
      __m256 s = _mm256_mul_ps(xs[k], _mm256_set1_ps(id));
      // std::round: to nearest, halves away from zero (the hardware mode rounds halves to even).
      __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(s, t));
      __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), _mm256_or_ps(one, _mm256_and_ps(sign_mask, s)));
      q32[k] = _mm256_cvtps_epi32(_mm256_add_ps(t, up));
    }
    // int32 -> int8 with the lane shuffles packs introduce undone by one permute.
    __m256i q16a = _mm256_packs_epi32(q32[0], q32[1]), q16b = _mm256_packs_epi32(q32[2], q32[3]);
    __m256i q8 = _mm256_packs_epi16(q16a, q16b);
    q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].qs), q8);
  }
}

}  // namespace

void quantize_act_q8_0(const float* x, BlockQ8_0* out, int64_t n) {
  static const bool avx2 = cpu_features().missing({"avx2", "fma", "f16c"}).empty();
  if (avx2 && n % QK8_0 == 0) quantize_q8_0_avx2(x, out, n);
  else quantize_row_q8_0(x, out, n);
}

void quantize_act_q8_k(const float* x, BlockQ8_K* out, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* v = x + b * QK_K;
    float amax = 0;
    for (int i = 0; i < QK_K; ++i) amax = std::max(amax, std::fabs(v[i]));
    BlockQ8_K& o = out[b];
    o.d = amax / 127.0f;
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < QK_K; ++i) o.qs[i] = static_cast<int8_t>(std::lround(v[i] * id));
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += o.qs[g * 16 + i];
      o.bsums[g] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace fp
