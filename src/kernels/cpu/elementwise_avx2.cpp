// kernels/cpu/elementwise_avx2.cpp — AVX2+FMA kernels for the element-wise and row ops:
// rmsnorm, add, silu_mul, gelu_mul, softcap, softmax, rope, argmax, kv_write. Memory-bound: each reads its inputs once and
// writes once; work is split over the thread pool only above kParallelMin elements, below
// which waking the workers costs more than the op. Row tails use masked loads/stores.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

using namespace avx2;

// Elements below which an op runs on the calling thread alone (~100 KB of f32 traffic).
constexpr int64_t kParallelMin = 1 << 15;
constexpr int kPriority = 100;

std::string refuse_avx2_cpu() {
  static const std::string why = cpu_features().missing({"avx2", "fma", "f16c"});  // fixed for the process
  return why;
}

template <class Args>
Kernel<Args> avx2_kernel(void (*run)(const Args&)) {
  return Kernel<Args>{"avx2", Backend::CPU, kPriority, false, [](const Args&) { return refuse_avx2_cpu(); }, run};
}

// Rows per parallel chunk so that a chunk holds at least kParallelMin elements.
int64_t row_grain(int64_t row_elems) { return std::max<int64_t>(1, kParallelMin / std::max<int64_t>(row_elems, 1)); }

// ------------------------------------------------------------------ rmsnorm
// out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * weight; x, out are [n, d] (may alias); with a
// residual, x[r] + add[r] is written to sum[r] and normalised instead.
FP_AVX2 void rmsnorm_rows(const RmsNormArgs& a, int64_t r0, int64_t r1) {
  const int64_t d = a.d, d8 = d & ~int64_t{7};
  const __m256i tm = tail_mask(d - d8);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.row_stride();
    float* y = a.out + r * a.row_stride();
    if (a.add) {  // the residual first (the sum's row, still in L1, is then normalised)
      const float* add = a.add + r * a.row_stride();
      float* sum = a.sum + r * a.row_stride();
      int64_t j = 0;
      for (; j < d8; j += 8) _mm256_storeu_ps(sum + j, _mm256_add_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(add + j)));
      if (j < d) _mm256_maskstore_ps(sum + j, tm, _mm256_add_ps(_mm256_maskload_ps(x + j, tm), _mm256_maskload_ps(add + j, tm)));
      x = sum;
    }
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
      __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
      __m256 v2 = _mm256_loadu_ps(x + j + 16), v3 = _mm256_loadu_ps(x + j + 24);
      s0 = _mm256_fmadd_ps(v0, v0, s0);
      s1 = _mm256_fmadd_ps(v1, v1, s1);
      s2 = _mm256_fmadd_ps(v2, v2, s2);
      s3 = _mm256_fmadd_ps(v3, v3, s3);
    }
    for (; j < d8; j += 8) {
      __m256 v = _mm256_loadu_ps(x + j);
      s0 = _mm256_fmadd_ps(v, v, s0);
    }
    if (j < d) {
      __m256 v = _mm256_maskload_ps(x + j, tm);
      s1 = _mm256_fmadd_ps(v, v, s1);
    }
    float ss = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(d) + a.eps));
    for (j = 0; j < d8; j += 8)
      _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), inv), _mm256_loadu_ps(a.weight + j)));
    if (j < d)
      _mm256_maskstore_ps(y + j, tm, _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + j, tm), inv),
                                                   _mm256_maskload_ps(a.weight + j, tm)));
    if (a.q8) quantize_act_q8_0(y, a.q8 + r * (d / QK8_0), d);  // the row is still in L1
    if (a.bf16)
      for (j = 0; j < d; ++j) a.bf16[r * d + j] = f32_to_bf16(y[j]);
  }
}

void rmsnorm_avx2(const RmsNormArgs& a) {
  FP_CHECK(!a.q8 || a.d % QK8_0 == 0, "rmsnorm: Q8_0 output needs rows that are a multiple of 32 (d = ", a.d, ")");
  FP_CHECK(!a.add == !a.sum, "rmsnorm: a residual needs both add and sum");
  thread_pool().parallel_for(a.n, row_grain(a.d), [&](int64_t b, int64_t e) { rmsnorm_rows(a, b, e); });
}
const bool reg_rmsnorm = register_kernel(avx2_kernel<RmsNormArgs>(rmsnorm_avx2));

// ------------------------------------------------------------------ add
// out[i] = a[i] + b[i], i in [i0, i1).
FP_AVX2 void add_range(const AddArgs& a, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 32 <= i1; i += 32)
    for (int u = 0; u < 32; u += 8)
      _mm256_storeu_ps(a.out + i + u, _mm256_add_ps(_mm256_loadu_ps(a.a + i + u), _mm256_loadu_ps(a.b + i + u)));
  for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(a.out + i, _mm256_add_ps(_mm256_loadu_ps(a.a + i), _mm256_loadu_ps(a.b + i)));
  if (i < i1) {
    __m256i tm = tail_mask(i1 - i);
    _mm256_maskstore_ps(a.out + i, tm, _mm256_add_ps(_mm256_maskload_ps(a.a + i, tm), _mm256_maskload_ps(a.b + i, tm)));
  }
}

void add_avx2(const AddArgs& a) {
  if (a.n < 4 * kParallelMin) return add_range(a, 0, a.n);  // skip the pool's std::function for small n
  thread_pool().parallel_for(a.n, 2 * kParallelMin, [&](int64_t b, int64_t e) { add_range(a, b, e); });
}
const bool reg_add = register_kernel(avx2_kernel<AddArgs>(add_avx2));

// ------------------------------------------------------------------ silu_mul, gelu_mul
// out[r, j] = act(g) * up[r, j] with g = gate[r, j]: SiLU g / (1 + e^-g), or GELU's tanh form
// written as g / (1 + e^(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3) (0.5 (1 + tanh u) = 1 / (1 + e^-2u)).
struct Silu {
  static FP_AVX2_INLINE __m256 apply(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
  }
};
struct GeluTanh {
  static FP_AVX2_INLINE __m256 apply(__m256 g, __m256 u) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    // -2u = -2 sqrt(2/pi) (g + 0.044715 g^3)
    const __m256 m2u = _mm256_mul_ps(_mm256_set1_ps(-1.5957691216057308f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    __m256 e = exp8(m2u);
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
  }
};

template <class Act>
FP_AVX2 void glu_span(const float* g, const float* u, float* o, int64_t len) {
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256 r0 = Act::apply(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j));
    __m256 r1 = Act::apply(_mm256_loadu_ps(g + j + 8), _mm256_loadu_ps(u + j + 8));
    _mm256_storeu_ps(o + j, r0);
    _mm256_storeu_ps(o + j + 8, r1);
  }
  for (; j + 8 <= len; j += 8) _mm256_storeu_ps(o + j, Act::apply(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j)));
  if (j < len) {
    __m256i tm = tail_mask(len - j);
    _mm256_maskstore_ps(o + j, tm, Act::apply(_mm256_maskload_ps(g + j, tm), _mm256_maskload_ps(u + j, tm)));
  }
}

// Work items are (row, column chunk) so a single wide row (decode) still splits over threads.
constexpr int64_t kSiluChunk = 4096;

// SiluMulArgs and GeluMulArgs have the same fields.
template <class Act, class Args>
void glu_avx2(const Args& a) {
  if (a.n <= 0 || a.d <= 0) return;
  const int64_t gs = a.gate_stride ? a.gate_stride : a.d, us = a.up_stride ? a.up_stride : a.d;
  const int64_t chunks = (a.d + kSiluChunk - 1) / kSiluChunk, cw = (a.d + chunks - 1) / chunks;
  thread_pool().parallel_for(a.n * chunks, row_grain(cw), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t r = it / chunks, j0 = (it % chunks) * cw, j1 = std::min(a.d, j0 + cw);
      glu_span<Act>(a.gate + r * gs + j0, a.up + r * us + j0, a.out + r * a.d + j0, j1 - j0);
      if (a.bf16)
        for (int64_t j = j0; j < j1; ++j) a.bf16[r * a.d + j] = f32_to_bf16(a.out[r * a.d + j]);
    }
  });
}
void silu_mul_avx2(const SiluMulArgs& a) { glu_avx2<Silu>(a); }
void gelu_mul_avx2(const GeluMulArgs& a) { glu_avx2<GeluTanh>(a); }
const bool reg_silu = register_kernel(avx2_kernel<SiluMulArgs>(silu_mul_avx2));
const bool reg_gelu = register_kernel(avx2_kernel<GeluMulArgs>(gelu_mul_avx2));

// ------------------------------------------------------------------ softcap
// x = cap * tanh(x / cap) over [i0, i1) (softcap8).
FP_AVX2 void softcap_range(const SoftcapArgs& a, int64_t i0, int64_t i1) {
  const __m256 cap = _mm256_set1_ps(a.cap), two_over_cap = _mm256_set1_ps(2.0f / a.cap);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(a.x + i, softcap8(_mm256_loadu_ps(a.x + i), cap, two_over_cap));
  if (i < i1) {
    __m256i tm = tail_mask(i1 - i);
    _mm256_maskstore_ps(a.x + i, tm, softcap8(_mm256_maskload_ps(a.x + i, tm), cap, two_over_cap));
  }
}

void softcap_avx2(const SoftcapArgs& a) {
  FP_CHECK(a.cap > 0, "softcap: cap ", a.cap, " must be positive");
  if (a.n < 2 * kParallelMin) return softcap_range(a, 0, a.n);
  thread_pool().parallel_for(a.n, kParallelMin, [&](int64_t b, int64_t e) { softcap_range(a, b, e); });
}
const bool reg_softcap = register_kernel(avx2_kernel<SoftcapArgs>(softcap_avx2));

// ------------------------------------------------------------------ softmax
// In place over rows of x[n, d]: max, then e^(x - max) summed, then scaled by 1/sum.
FP_AVX2 void softmax_rows(const SoftmaxArgs& a, int64_t r0, int64_t r1) {
  const int64_t d = a.d, d8 = d & ~int64_t{7};
  const __m256i tm = tail_mask(d - d8);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = r0; r < r1; ++r) {
    float* x = a.x + r * d;
    __m256 m0 = ninf, m1 = ninf;
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
      m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
      m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
    }
    for (; j < d8; j += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    if (j < d) m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + j, tm), _mm256_castsi256_ps(tm)));
    const __m256 mx = _mm256_set1_ps(hmax(_mm256_max_ps(m0, m1)));
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (j = 0; j + 16 <= d; j += 16) {
      __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mx));
      __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), mx));
      _mm256_storeu_ps(x + j, e0);
      _mm256_storeu_ps(x + j + 8, e1);
      s0 = _mm256_add_ps(s0, e0);
      s1 = _mm256_add_ps(s1, e1);
    }
    for (; j < d8; j += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mx));
      _mm256_storeu_ps(x + j, e);
      s0 = _mm256_add_ps(s0, e);
    }
    if (j < d) {
      __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + j, tm), mx)), _mm256_castsi256_ps(tm));
      _mm256_maskstore_ps(x + j, tm, e);
      s1 = _mm256_add_ps(s1, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(_mm256_add_ps(s0, s1)));
    for (j = 0; j < d8; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
    if (j < d) _mm256_maskstore_ps(x + j, tm, _mm256_mul_ps(_mm256_maskload_ps(x + j, tm), inv));
  }
}

void softmax_avx2(const SoftmaxArgs& a) {
  thread_pool().parallel_for(a.n, row_grain(a.d), [&](int64_t b, int64_t e) { softmax_rows(a, b, e); });
}
const bool reg_softmax = register_kernel(avx2_kernel<SoftmaxArgs>(softmax_avx2));

// ------------------------------------------------------------------ rope
// Per token, cos/sin of pos * inv_freq are computed once (scalar libm, the same float angle as
// the reference) into tables laid out like the head, then every head is rotated with FMAs.
//  Adjacent: cs = [c0 c0 c1 c1 ...], sn = [-s0 s0 -s1 s1 ...] over rot_dim; out = x*cs + swap(x)*sn
//            where swap exchanges each pair.
//  NeoX:     cs = [c0 .. c_{h-1}], sn = [s0 .. s_{h-1}] over half = rot_dim/2;
//            lo' = lo*c - hi*s, hi' = lo*s + hi*c.
FP_AVX2 void rope_head_adjacent(float* x, const float* cs, const float* sn, int64_t rot) {
  int64_t j = 0;
  for (; j + 8 <= rot; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    __m256 sw = _mm256_permute_ps(v, 0xB1);
    _mm256_storeu_ps(x + j, _mm256_fmadd_ps(v, _mm256_loadu_ps(cs + j), _mm256_mul_ps(sw, _mm256_loadu_ps(sn + j))));
  }
  if (j < rot) {  // rot is even, so a tail never splits a pair
    __m256i tm = tail_mask(rot - j);
    __m256 v = _mm256_maskload_ps(x + j, tm);
    __m256 sw = _mm256_permute_ps(v, 0xB1);
    __m256 r = _mm256_fmadd_ps(v, _mm256_maskload_ps(cs + j, tm), _mm256_mul_ps(sw, _mm256_maskload_ps(sn + j, tm)));
    _mm256_maskstore_ps(x + j, tm, r);
  }
}

FP_AVX2 void rope_head_neox(float* x, const float* cs, const float* sn, int64_t half) {
  float* y = x + half;
  int64_t j = 0;
  for (; j + 8 <= half; j += 8) {
    __m256 lo = _mm256_loadu_ps(x + j), hi = _mm256_loadu_ps(y + j);
    __m256 c = _mm256_loadu_ps(cs + j), s = _mm256_loadu_ps(sn + j);
    _mm256_storeu_ps(x + j, _mm256_fmsub_ps(lo, c, _mm256_mul_ps(hi, s)));
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(lo, s, _mm256_mul_ps(hi, c)));
  }
  if (j < half) {
    __m256i tm = tail_mask(half - j);
    __m256 lo = _mm256_maskload_ps(x + j, tm), hi = _mm256_maskload_ps(y + j, tm);
    __m256 c = _mm256_maskload_ps(cs + j, tm), s = _mm256_maskload_ps(sn + j, tm);
    _mm256_maskstore_ps(x + j, tm, _mm256_fmsub_ps(lo, c, _mm256_mul_ps(hi, s)));
    _mm256_maskstore_ps(y + j, tm, _mm256_fmadd_ps(lo, s, _mm256_mul_ps(hi, c)));
  }
}

void rope_tokens(const RopeArgs& a, int64_t t0, int64_t t1) {
  const int64_t half = a.rot_dim / 2;
  thread_local std::vector<float> tables;
  tables.resize(static_cast<size_t>(2 * a.rot_dim));
  float* cs = tables.data();
  float* sn = cs + a.rot_dim;
  const bool adjacent = a.style == RopeStyle::Adjacent;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float angle = static_cast<float>(a.pos[t]) * a.inv_freq[i];
      float c = std::cos(angle) * a.mscale, s = std::sin(angle) * a.mscale;
      if (adjacent) {
        cs[2 * i] = cs[2 * i + 1] = c;
        sn[2 * i] = -s;
        sn[2 * i + 1] = s;
      } else {
        cs[i] = c;
        sn[i] = s;
      }
    }
    float* row = a.x + t * a.row_stride;
    for (int64_t h = 0; h < a.n_heads; ++h) {
      if (adjacent)
        rope_head_adjacent(row + h * a.head_dim, cs, sn, 2 * half);
      else
        rope_head_neox(row + h * a.head_dim, cs, sn, half);
    }
  }
}

void rope_avx2(const RopeArgs& a) {
  if (a.rot_dim < 2) return;
  thread_pool().parallel_for(a.n, row_grain(a.n_heads * a.rot_dim), [&](int64_t b, int64_t e) { rope_tokens(a, b, e); });
}
const bool reg_rope = register_kernel(avx2_kernel<RopeArgs>(rope_avx2));

// ------------------------------------------------------------------ argmax
// One pass with 4 x 8 lanes, each lane keeping its first maximum (strict >, so NaN never wins)
// and its index; then the largest value with the smallest index across lanes. As in the
// reference, a NaN at index 0 is never beaten, so such a row answers 0.
FP_AVX2 int32_t argmax_row(const float* x, int64_t d) {
  if (d <= 0 || std::isnan(x[0])) return 0;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 best[4] = {ninf, ninf, ninf, ninf};
  __m256i bidx[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8);
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    for (int u = 0; u < 4; ++u) {
      __m256 v = _mm256_loadu_ps(x + j + 8 * u);
      __m256 gt = _mm256_cmp_ps(v, best[u], _CMP_GT_OQ);
      best[u] = _mm256_blendv_ps(best[u], v, gt);
      bidx[u] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bidx[u]), _mm256_castsi256_ps(idx), gt));
      idx = _mm256_add_epi32(idx, step);
    }
  }
  alignas(32) float bv[32];
  alignas(32) int32_t bi[32];
  for (int u = 0; u < 4; ++u) {
    _mm256_store_ps(bv + 8 * u, best[u]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bi + 8 * u), bidx[u]);
  }
  // Lanes that never saw a value hold -inf at index 0, which is only chosen if the row's
  // maximum is -inf and index 0 holds it (x[0] is -inf then, or was beaten otherwise).
  float mv = x[0];
  int64_t mi = 0;
  for (int l = 0; l < 32; ++l)
    if (bv[l] > mv || (bv[l] == mv && bi[l] < mi)) {
      mv = bv[l];
      mi = bi[l];
    }
  for (; j < d; ++j)
    if (x[j] > mv) {
      mv = x[j];
      mi = j;
    }
  return static_cast<int32_t>(mi);
}

void argmax_avx2(const ArgmaxArgs& a) {
  thread_pool().parallel_for(a.n, row_grain(a.d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) a.out[r] = argmax_row(a.x + r * a.d, a.d);
  });
}
const bool reg_argmax = register_kernel(avx2_kernel<ArgmaxArgs>(argmax_avx2));

// ------------------------------------------------------------------ kv_write
// Rows into the pool at their slots, rounded to the pool's dtype exactly as the reference's
// quantize_row: F16 by F16C's vcvtps2ph (round to nearest even; NaN stays NaN, as the reference's
// canonical quiet NaN for the NaNs a model produces), BF16 by the same integer rounding
// (x + 0x7fff + lsb) >> 16 eight lanes at a time, NaNs kept quiet.
FP_AVX2 void f32_row_to(DType t, const float* x, uint8_t* dst, int64_t n) {
  if (t == DType::F32) {
    std::memcpy(dst, x, static_cast<size_t>(n) * 4);
    return;
  }
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
  if (t == DType::F16) {
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) d[i] = f32_to_f16(x[i]);
    return;
  }
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff), abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(v, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(v, round), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs_mask), inf);
    const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(_mm256_srli_epi32(v, 16), quiet), nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);  // 8 x u16 in the low half
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) d[i] = f32_to_bf16(x[i]);
}

void kv_write_avx2(const KvWriteArgs& a) {
  const int64_t kb = row_bytes(a.dtype, a.k_width), vb = row_bytes(a.dtype, a.v_width);
  auto rows = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      f32_row_to(a.dtype, a.k_rows + i * a.k_width, static_cast<uint8_t*>(a.k_pool) + a.slots[i] * kb, a.k_width);
      if (a.v_width) f32_row_to(a.dtype, a.v_rows + i * a.v_width, static_cast<uint8_t*>(a.v_pool) + a.slots[i] * vb, a.v_width);
    }
  };
  if (a.n * (a.k_width + a.v_width) < 4 * kParallelMin) return rows(0, a.n);
  thread_pool().parallel_for(a.n, row_grain(a.k_width + a.v_width), rows);
}
const bool reg_kv_write = register_kernel(Kernel<KvWriteArgs>{
    "avx2", Backend::CPU, kPriority, false,
    [](const KvWriteArgs& a) {
      std::string why = refuse_avx2_cpu();
      return why.empty() ? refuse_kv_dtype(a.dtype, {DType::F32, DType::F16, DType::BF16}) : why;
    },
    kv_write_avx2});

}  // namespace
}  // namespace fp
