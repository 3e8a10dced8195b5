// kernels/cpu/matmul_avx2.cpp — AVX2+FMA matmul for every weight dtype, multithreaded.
//  - GEMV path (n <= 4 tokens, decode): memory-bound; each weight row is streamed once and
//    dotted with all n activation rows. Float-like weights (F32/F16/BF16/FP8) are widened to f32
//    in registers; Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 use int8 dot products against Q8_0-quantized
//    activations, the K-quants (Q2_K..Q6_K) against Q8_K-quantized activations (as ggml does). Q8_0_X8 (Q8_0 repacked at load) runs
//    one interleaved integer kernel at every batch size; Q4_K_X8 (Q4_K repacked at load) has an
//    interleaved decode kernel and shares the Q4 prefill tiles; Q6_K_X8 likewise with the Q6 tiles;
//    Q4_0_X8 / Q4_1_X8 / Q5_0_X8 / Q5_1_X8 (repacked at load) likewise with the Q4 tiles, Q3_K_X8
//    with the Q6 tiles; Q2_K_X8, IQ4_NL_X8 and IQ4_XS_X8 run their row kernels at every batch size.
//    IQ4_NL / IQ4_XS (non-linear 4-bit levels) and MXFP4 (E2M1 levels, power-of-two scales) look
//    their nibbles up with vpshufb, Q8_0 activations. MXFP4 and MXFP4_X8 prefill on the Q4 tiles
//    (their levels + 12 are small enough for vpmaddubsw).
//  - GEMM path for float-like weights (n > 4, prefill): compute-bound; 16-row weight panels are
//    widened to f32 and packed [k][16], then a 6x16 register-blocked FMA micro-kernel sweeps the
//    tokens. Quantized weights keep the integer path at every n, with rows blocked to stay in L2.
#include <algorithm>
#include <type_traits>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/matmul_interleave.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

using namespace avx2;
using cpu::gemv_tokens;
using cpu::kGemvMaxTokens;


// ------------------------------------------------------------------ float-like GEMV
template <DType T>
FP_AVX2_INLINE float load1(const void* base, int64_t k) {
  if constexpr (T == DType::F32) return static_cast<const float*>(base)[k];
  if constexpr (T == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(base)[k]);
  if constexpr (T == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(base)[k]);
  if constexpr (T == DType::F8_E4M3) return fp8e4m3_to_f32(static_cast<const uint8_t*>(base)[k]) / kFp8Rescale;
}

// sums[i] = dot(row[k0:k1], x_i[k0:k1]) for i < N, x_i = x + i * ldx. U independent
// accumulators per token hide the FMA latency: with one token, 2 chains would cap a core at
// 16 weights per 4 cycles (~29 GB/s of F16), below what the memory system delivers.
template <DType T, int N>
FP_AVX2 void dot_chunk(const void* row, const float* x, int64_t ldx, int64_t k0, int64_t k1, float* sums) {
  constexpr int U = N == 1 ? 4 : 2;
  __m256 acc[N][U];
  for (int i = 0; i < N; ++i)
    for (int u = 0; u < U; ++u) acc[i][u] = _mm256_setzero_ps();
  int64_t k = k0;
  for (; k + 8 * U <= k1; k += 8 * U) {
    __m256 w[U];
    for (int u = 0; u < U; ++u) w[u] = load8<T>(row, k + 8 * u);
    for (int i = 0; i < N; ++i)
      for (int u = 0; u < U; ++u) acc[i][u] = _mm256_fmadd_ps(w[u], _mm256_loadu_ps(x + i * ldx + k + 8 * u), acc[i][u]);
  }
  for (; k + 8 <= k1; k += 8) {
    __m256 w0 = load8<T>(row, k);
    for (int i = 0; i < N; ++i) acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * ldx + k), acc[i][0]);
  }
  for (int i = 0; i < N; ++i) {
    __m256 t = acc[i][0];
    for (int u = 1; u < U; ++u) t = _mm256_add_ps(t, acc[i][u]);
    float s = hsum(t);
    for (int64_t kk = k; kk < k1; ++kk) s += load1<T>(row, kk) * x[i * ldx + kk];
    sums[i] = s;
  }
}

// One token against R rows at once (decode): each 16 activations loaded serve R rows, so a row's
// weights cost one load and one widening each instead of two loads, and the R x 2 accumulators
// keep the FMAs independent. (One row at a time reads F16 at ~9.5 GB/s per core, below the
// integer Q8_0 kernel's ~14.)
// BF16 (x_pairs non-null): 16 weights load as one vector whose 32-bit lanes hold pairs; the even
// weights are the lanes shifted left 16 bits, the odd ones the lanes' high halves, so x_pairs
// holds each 16 activations as their 8 even then 8 odd (two ops widen 16 weights, not six).
template <DType T, int R>
FP_AVX2 void dot_rows_one_token(const uint8_t* const* rows, const float* x, const float* x_pairs, int64_t K, float* sums) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t k = 0;
  constexpr int64_t E = T == DType::F32 ? 4 : T == DType::F8_E4M3 ? 1 : 2;  // bytes per weight
  for (; k + 16 <= K; k += 16) {
    if (((k * E) & 63) == 0)  // each row's stream 1 KiB ahead: F16 1.07x against DRAM (measured)
      for (int r = 0; r < R; ++r) cpu::prefetch_stream(rows[r] + k * E, 1024);
    if constexpr (T == DType::BF16) {
      const __m256 xe = _mm256_loadu_ps(x_pairs + k), xo = _mm256_loadu_ps(x_pairs + k + 8);
      const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u));
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + 2 * k));
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), xe, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), xo, acc[r][1]);
      }
      continue;
    }
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(load8<T>(rows[r], k), x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(load8<T>(rows[r], k + 8), x1, acc[r][1]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc[r][0] = _mm256_fmadd_ps(load8<T>(rows[r], k), x0, acc[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
    for (int64_t kk = k; kk < K; ++kk) s += load1<T>(rows[r], kk) * x[kk];
    sums[r] = s;
  }
}

template <DType T, int N>
FP_AVX2 void gemv_float(const MatMulArgs& a, const float* x, int64_t n_off, int64_t r0, int64_t r1) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows();
  const int64_t sb = w.scale_block, scale_cols = (K + sb - 1) / sb;
  const float rescale = T == DType::F8_E4M3 ? kFp8Rescale : 1.0f;
  int64_t o = r0;
  if constexpr (N == 1) {
    constexpr int R = 4;
    const float* x_pairs = nullptr;
    if constexpr (T == DType::BF16) {  // x as 8 even then 8 odd activations per 16 (dot_rows_one_token)
      thread_local std::vector<float> pairs;
      pairs.resize(static_cast<size_t>(K));
      for (int64_t k = 0; k + 16 <= K; k += 16)
        for (int j = 0; j < 8; ++j) {
          pairs[static_cast<size_t>(k + j)] = x[k + 2 * j];
          pairs[static_cast<size_t>(k + 8 + j)] = x[k + 2 * j + 1];
        }
      x_pairs = pairs.data();
    }
    if (!w.block_scale)
      for (; o + R <= r1; o += R) {
        const uint8_t* rows[R];
        float sums[R];
        for (int r = 0; r < R; ++r) rows[r] = w.row_ptr(o + r);
        dot_rows_one_token<T, R>(rows, x, x_pairs, K, sums);
        for (int r = 0; r < R; ++r) a.y[n_off * out + o + r] = sums[r] * rescale + (a.bias ? a.bias[o + r] : 0.0f);
      }
  }
  for (; o < r1; ++o) {
    const uint8_t* row = w.row_ptr(o);
    if (o + 4 < r1) _mm_prefetch(reinterpret_cast<const char*>(w.row_ptr(o + 4)), _MM_HINT_T0);
    float total[N] = {};
    if (w.block_scale) {
      const float* srow = w.block_scale + (o / sb) * scale_cols;
      for (int64_t c = 0; c < scale_cols; ++c) {
        float part[N];
        dot_chunk<T, N>(row, x, K, c * sb, std::min(K, (c + 1) * sb), part);
        for (int i = 0; i < N; ++i) total[i] += part[i] * srow[c];
      }
    } else {
      dot_chunk<T, N>(row, x, K, 0, K, total);
    }
    for (int i = 0; i < N; ++i) a.y[(n_off + i) * out + o] = total[i] * rescale + (a.bias ? a.bias[o] : 0.0f);
  }
}

// ------------------------------------------------------------------ integer GEMV
// A Q4_0-style nibble block's 32 values (low nibbles = values 0..15), unsigned 0..15.
// The 16 bytes in both halves, the upper half shifted by 4: three instructions (one a load).
FP_AVX2_INLINE __m256i unpack_nibbles(const uint8_t* qs) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}

// Q5_0 / Q5_1's 32 values, unsigned 0..31: the nibbles with bit j of qh as 16.
FP_AVX2_INLINE __m256i unpack_q5(const uint8_t* qs, const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  return _mm256_or_si256(unpack_nibbles(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
}

template <DType T> struct Block32;
template <> struct Block32<DType::Q8_0> { using type = BlockQ8_0; };
template <> struct Block32<DType::Q4_0> { using type = BlockQ4_0; };
template <> struct Block32<DType::Q5_0> { using type = BlockQ5_0; };
template <> struct Block32<DType::Q4_1> { using type = BlockQ4_1; };
template <> struct Block32<DType::Q5_1> { using type = BlockQ5_1; };
template <> struct Block32<DType::IQ4_NL> { using type = BlockIQ4_NL; };
template <> struct Block32<DType::MXFP4> { using type = BlockMXFP4; };
template <DType T> constexpr bool kAffine = T == DType::Q4_1 || T == DType::Q5_1;  // weight d * q + m

// Q8_0 / Q4_0 / Q5_0 (signed values) and Q4_1 / Q5_1 (unsigned q, plus a minimum m) weights
// against Q8_0 activations xq[i * nb + b]. sx: each activation block's d * sum(q), for the minimum.
template <DType T, int N>
FP_AVX2_INLINE void q8_0_like_block(const uint8_t* row, const BlockQ8_0* xq, const float* dx, const float* sx, int64_t nb,
                                    int64_t b, __m256* acc, float* macc) {
  const auto& wb = reinterpret_cast<const typename Block32<T>::type*>(row)[b];
  __m256i wq;
  if constexpr (T == DType::Q8_0) wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs));
  else if constexpr (T == DType::Q4_0) wq = _mm256_sub_epi8(unpack_nibbles(wb.qs), _mm256_set1_epi8(8));
  else if constexpr (T == DType::Q5_0) wq = _mm256_sub_epi8(unpack_q5(wb.qs, wb.qh), _mm256_set1_epi8(16));
  else if constexpr (T == DType::IQ4_NL) wq = _mm256_shuffle_epi8(iq4_levels(false), unpack_nibbles(wb.qs));
  else if constexpr (T == DType::MXFP4) wq = _mm256_shuffle_epi8(mxfp4_levels(), unpack_nibbles(wb.qs));
  else if constexpr (T == DType::Q4_1) wq = unpack_nibbles(wb.qs);
  else wq = unpack_q5(wb.qs, wb.qh);
  float dw;
  if constexpr (T == DType::MXFP4) dw = mxfp4_half_scale(wb.e);
  else dw = _cvtsh_ss(wb.d);
  for (int i = 0; i < N; ++i) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i * nb + b].qs));
    // Unsigned weights meet the signed activations in vpmaddubsw directly (pairs <= 2 x 31 x 128).
    const __m256i p = kAffine<T> ? _mm256_madd_epi16(_mm256_maddubs_epi16(wq, x), _mm256_set1_epi16(1)) : dot_i8(wq, x);
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[i * nb + b]), acc[i]);
    if constexpr (kAffine<T>) macc[i] += _cvtsh_ss(wb.m) * sx[i * nb + b];
  }
}

// dx: the activation blocks' scales as f32. With one or two tokens the blocks alternate between
// two accumulators per token, so consecutive FMAs do not wait on each other.
template <DType T, int N>
FP_AVX2 void gemv_q8_0_like(const MatMulArgs& a, const BlockQ8_0* xq, const float* dx, const float* sx, int64_t n_off, int64_t r0,
                            int64_t r1) {
  constexpr int U = N <= 2 ? 2 : 1;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK8_0;
  for (int64_t o = r0; o < r1; ++o) {
    const uint8_t* row = w.row_ptr(o);  // once per row: row_ptr is an out-of-line call
    __m256 acc[U][N];
    float macc[N] = {};
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < N; ++i) acc[u][i] = _mm256_setzero_ps();
    int64_t b = 0;
    constexpr int64_t kBlockBytes = sizeof(typename Block32<T>::type);
    for (; b + U <= nb; b += U)
      for (int u = 0; u < U; ++u) {
        cpu::prefetch_stream(row + (b + u) * kBlockBytes);  // blocks under 64 bytes: every line is covered
        q8_0_like_block<T, N>(row, xq, dx, sx, nb, b + u, acc[u], macc);
      }
    for (; b < nb; ++b) q8_0_like_block<T, N>(row, xq, dx, sx, nb, b, acc[0], macc);
    for (int i = 0; i < N; ++i) {
      __m256 t = acc[0][i];
      for (int u = 1; u < U; ++u) t = _mm256_add_ps(t, acc[u][i]);
      a.y[(n_off + i) * out + o] = hsum(t) + macc[i] + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// IQ4_XS in the file's layout against Q8_0 activations: each block of 32 as IQ4_NL's (levels looked
// up, signed int8 dot products), scaled by d * (ls_j - 32) x the activation block's d.
template <int N>
FP_AVX2 void gemv_iq4_xs(const MatMulArgs& a, const BlockQ8_0* xq, const float* dx, int64_t n_off, int64_t r0, int64_t r1) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK8_0;
  const __m256i levels = iq4_levels(false);
  for (int64_t o = r0; o < r1; ++o) {
    const auto* wb = reinterpret_cast<const BlockIQ4_XS*>(w.row_ptr(o));
    __m256 acc[2][N];
    for (int i = 0; i < N; ++i) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < K / QK_K; ++s) {
      for (int l = 0; l < 3; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(wb + s) + 64 * l);  // 136 bytes
      const float d = _cvtsh_ss(wb[s].d);
      for (int j = 0; j < 8; ++j) {
        const __m256i wq = _mm256_shuffle_epi8(levels, unpack_nibbles(wb[s].qs + 16 * j));
        const float dw = d * static_cast<float>(iq4_xs_scale(wb[s], j));
        const int64_t b = 8 * s + j;
        for (int i = 0; i < N; ++i) {
          const __m256i p = dot_i8(wq, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i * nb + b].qs)));
          acc[j & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[i * nb + b]), acc[j & 1][i]);
        }
      }
    }
    for (int i = 0; i < N; ++i) a.y[(n_off + i) * out + o] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) + (a.bias ? a.bias[o] : 0.0f);
  }
}

// Unpacks the 12 scale bytes of a Q4_K super-block into 8 scales (bytes 0..7) and 8 mins
// (bytes 8..15) with 32-bit masks: scales/mins 0..3 are the low 6 bits of bytes 0..3 / 4..7;
// scales/mins 4..7 take their low 4 bits from bytes 8..11 and their high 2 bits from the top
// of bytes 0..3 / 4..7.
FP_AVX2_INLINE __m128i q4k_scales_mins(const uint8_t* q) {
  uint32_t u[4];
  std::memcpy(u, q, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);  // mins 4..7
  const uint32_t mins_lo = u[1] & m6;                      // mins 0..3
  u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);          // scales 4..7
  u[2] = mins_lo;
  u[0] &= m6;                                              // scales 0..3
  return _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]), static_cast<int>(u[0]));
}

// Q4_K and Q5_K (Q4_K's scales and nibbles, each value's fifth bit, bit s of qh[l] for
// sub-block s, added as 16; the vpmaddubsw pairs stay within 2 x 31 x 128).
template <DType T, int N>
FP_AVX2 void gemv_q4_q5_k(const MatMulArgs& a, const BlockQ8_K* xq, int64_t n_off, int64_t r0, int64_t r1) {
  using Block = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  for (int64_t o = r0; o < r1; ++o) {
    const Block* wb = reinterpret_cast<const Block*>(w.row_ptr(o));
    __m256 acc[N], minacc[N];
    for (int i = 0; i < N; ++i) acc[i] = minacc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      for (int l = 0; l < 3; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(wb + b) + 64 * l);  // 144 / 176 bytes
      // 16 int16: scales 0..7 in the low half, mins 0..7 in the high half.
      const __m256i sm = _mm256_cvtepu8_epi16(q4k_scales_mins(wb[b].scales));
      const __m128i mins = _mm256_extracti128_si256(sm, 1);
      const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);  // scales in both halves
      const float d = _cvtsh_ss(wb[b].d), dmin = _cvtsh_ss(wb[b].dmin);
      // Sub-block scales go into vpmaddwd, so a whole super-block accumulates in int32
      // (at most 8 x 32 x 31 x 127 x 63 < 2^31) and converts to float once.
      __m256i qh = _mm256_setzero_si256();
      if constexpr (T == DType::Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qh));
      __m256i sumi[N];
      for (int i = 0; i < N; ++i) sumi[i] = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs + 32 * j));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (T == DType::Q5_K) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
        }
        // Broadcast int16 scale 2j / 2j+1 to every lane (bytes 4j..4j+1 / 4j+2..4j+3 of each half).
        __m256i s_lo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * j + 1) << 8 | (4 * j))));
        __m256i s_hi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * j + 3) << 8 | (4 * j + 2))));
        for (int i = 0; i < N; ++i) {
          const int8_t* xqs = xq[i * nb + b].qs + 64 * j;
          sumi[i] = _mm256_add_epi32(sumi[i], dot_u8_scaled(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xqs)), s_lo));
          sumi[i] = _mm256_add_epi32(sumi[i], dot_u8_scaled(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xqs + 32)), s_hi));
        }
      }
      for (int i = 0; i < N; ++i) {
        const BlockQ8_K& xb = xq[i * nb + b];
        // Sums of the 8 sub-blocks (pairs of 16-value sums), times the mins: 4 int32 lanes.
        __m128i bs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums)),
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8)));
        __m128i pm = _mm_madd_epi16(mins, bs);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
        minacc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * xb.d), _mm256_cvtepi32_ps(_mm256_zextsi128_si256(pm)), minacc[i]);
      }
    }
    for (int i = 0; i < N; ++i)
      a.y[(n_off + i) * out + o] = hsum(acc[i]) - hsum(minacc[i]) + (a.bias ? a.bias[o] : 0.0f);
  }
}

template <int N>
FP_AVX2 void gemv_q6_k(const MatMulArgs& a, const BlockQ8_K* xq, int64_t n_off, int64_t r0, int64_t r1) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
  for (int64_t o = r0; o < r1; ++o) {
    const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(w.row_ptr(o));
    __m256 acc[N];
    float offs[N] = {};
    for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      for (int l = 0; l < 4; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(wb + b) + 64 * l);  // 210 bytes
      const float d = _cvtsh_ss(wb[b].d);
      __m256i sumi[N];
      for (int i = 0; i < N; ++i) sumi[i] = _mm256_setzero_si256();
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = wb[b].ql + 64 * half;
        const uint8_t* qh = wb[b].qh + 32 * half;
        const int8_t* sc = wb[b].scales + 8 * half;
        __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
        for (int k = 0; k < 4; ++k) {
          // Chunk k holds 32 six-bit quants: low nibbles of l0/l1 (k = 0, 1) or high (k = 2, 3),
          // with two high bits from h at bit offset 2k.
          __m256i lo4 = k < 2 ? (k == 0 ? l0 : l1) : _mm256_srli_epi16(k == 2 ? l0 : l1, 4);
          __m256i q = _mm256_or_si256(_mm256_and_si256(lo4, m4),
                                      _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m3), 4));
          __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
          for (int i = 0; i < N; ++i) {
            const int8_t* xqs = xq[i * nb + b].qs + 128 * half + 32 * k;
            sumi[i] = _mm256_add_epi32(sumi[i], dot_u8_scaled(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xqs)), scale));
          }
        }
      }
      for (int i = 0; i < N; ++i) {
        const BlockQ8_K& xb = xq[i * nb + b];
        int32_t off = 0;
        for (int g = 0; g < 16; ++g) off += wb[b].scales[g] * xb.bsums[g];
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
        offs[i] += d * xb.d * 32.0f * static_cast<float>(off);
      }
    }
    for (int i = 0; i < N; ++i) a.y[(n_off + i) * out + o] = hsum(acc[i]) - offs[i] + (a.bias ? a.bias[o] : 0.0f);
  }
}

// Q2_K / Q3_K: Q6_K's structure with 2- / 3-bit values. Value 128h + 32k + l is bits 2k..2k+1 of
// qs[32h + l] (Q3_K: plus bit 4h + k of hmask[l] as 4, the weight being q - 4); 16-value groups
// carry their own scale (Q2_K: 4-bit scale and 4-bit minimum; Q3_K: signed 6-bit scale).
template <DType T, int N>
FP_AVX2 void gemv_q2_q3_k(const MatMulArgs& a, const BlockQ8_K* xq, int64_t n_off, int64_t r0, int64_t r1) {
  using Block = std::conditional_t<T == DType::Q2_K, BlockQ2_K, BlockQ3_K>;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK_K;
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t o = r0; o < r1; ++o) {
    const Block* wb = reinterpret_cast<const Block*>(w.row_ptr(o));
    __m256 acc[N];
    float offs[N] = {};
    for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      for (int l = 0; l < 2; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(wb + b) + 64 * l);  // 84 / 110 bytes
      int16_t sc[16], mn[16] = {};
      float d, dmin = 0;
      if constexpr (T == DType::Q2_K) {
        for (int g = 0; g < 16; ++g) {
          sc[g] = wb[b].scales[g] & 0xf;
          mn[g] = wb[b].scales[g] >> 4;
        }
        d = _cvtsh_ss(wb[b].d);
        dmin = _cvtsh_ss(wb[b].dmin);
      } else {
        int8_t s8[16];
        q3_k_scales(wb[b].scales, s8);
        for (int g = 0; g < 16; ++g) sc[g] = s8[g];
        d = _cvtsh_ss(wb[b].d);
      }
      __m256i sumi[N];
      for (int i = 0; i < N; ++i) sumi[i] = _mm256_setzero_si256();
      __m256i hm = _mm256_setzero_si256();
      if constexpr (T == DType::Q3_K) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].hmask));
      for (int half = 0; half < 2; ++half) {
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs + 32 * half));
        for (int k = 0; k < 4; ++k) {
          __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), m3);
          if constexpr (T == DType::Q3_K)
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * half + k), one), 2));
          const int g = 8 * half + 2 * k;
          const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
          for (int i = 0; i < N; ++i) {
            const int8_t* xqs = xq[i * nb + b].qs + 128 * half + 32 * k;
            sumi[i] = _mm256_add_epi32(sumi[i], dot_u8_scaled(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xqs)), scale));
          }
        }
      }
      for (int i = 0; i < N; ++i) {
        const BlockQ8_K& xb = xq[i * nb + b];
        int32_t off = 0;  // Q2_K: sum of min x group sum; Q3_K: 4 x sum of scale x group sum
        for (int g = 0; g < 16; ++g) off += (T == DType::Q2_K ? mn[g] : 4 * sc[g]) * xb.bsums[g];
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
        offs[i] += (T == DType::Q2_K ? dmin : d) * xb.d * static_cast<float>(off);
      }
    }
    for (int i = 0; i < N; ++i) a.y[(n_off + i) * out + o] = hsum(acc[i]) - offs[i] + (a.bias ? a.bias[o] : 0.0f);
  }
}

template <DType T>
void gemv_float_all(const MatMulArgs& a) {
  const int64_t K = a.w->cols();
  gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    gemv_float<T, decltype(N)::value>(a, a.x + i * K, i, r0, r1);
  });
}

void gemv(const MatMulArgs& a) {
  const int64_t K = a.w->cols();
  switch (a.w->dtype) {
    case DType::F32: return gemv_float_all<DType::F32>(a);
    case DType::F16: return gemv_float_all<DType::F16>(a);
    case DType::BF16: return gemv_float_all<DType::BF16>(a);
    case DType::F8_E4M3: return gemv_float_all<DType::F8_E4M3>(a);
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: case DType::Q4_1: case DType::Q5_1: case DType::IQ4_NL:
    case DType::IQ4_XS: case DType::MXFP4: {
      const int64_t nb = K / QK8_0;
      std::vector<BlockQ8_0> own;
      const BlockQ8_0* xq = a.xq;
      if (!xq) {
        own.resize(static_cast<size_t>(a.n * nb));
        for (int64_t i = 0; i < a.n; ++i) quantize_act_q8_0(a.x + i * K, own.data() + i * nb, K);
        xq = own.data();
      }
      const DType t = a.w->dtype;
      const bool affine = t == DType::Q4_1 || t == DType::Q5_1;
      std::vector<float> dx(static_cast<size_t>(a.n * nb)), sx(affine ? dx.size() : 0);
      for (size_t b = 0; b < dx.size(); ++b) {
        dx[b] = f16_to_f32(xq[b].d);
        if (affine) {
          int32_t sum = 0;
          for (int j = 0; j < QK8_0; ++j) sum += xq[b].qs[j];
          sx[b] = dx[b] * static_cast<float>(sum);
        }
      }
      gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
        constexpr int n = decltype(N)::value;
        const BlockQ8_0* x = xq + i * nb;
        const float *d = dx.data() + i * nb, *s = affine ? sx.data() + i * nb : nullptr;
        switch (t) {
          case DType::Q8_0: return gemv_q8_0_like<DType::Q8_0, n>(a, x, d, s, i, r0, r1);
          case DType::Q4_0: return gemv_q8_0_like<DType::Q4_0, n>(a, x, d, s, i, r0, r1);
          case DType::Q5_0: return gemv_q8_0_like<DType::Q5_0, n>(a, x, d, s, i, r0, r1);
          case DType::Q4_1: return gemv_q8_0_like<DType::Q4_1, n>(a, x, d, s, i, r0, r1);
          case DType::IQ4_NL: return gemv_q8_0_like<DType::IQ4_NL, n>(a, x, d, s, i, r0, r1);
          case DType::MXFP4: return gemv_q8_0_like<DType::MXFP4, n>(a, x, d, s, i, r0, r1);
          case DType::IQ4_XS: return gemv_iq4_xs<n>(a, x, d, i, r0, r1);
          default: return gemv_q8_0_like<DType::Q5_1, n>(a, x, d, s, i, r0, r1);
        }
      });
      return;
    }
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: {
      const int64_t nb = K / QK_K;
      std::vector<BlockQ8_K> xq(static_cast<size_t>(a.n * nb));
      for (int64_t i = 0; i < a.n; ++i) quantize_act_q8_k(a.x + i * K, xq.data() + i * nb, K);
      const DType t = a.w->dtype;
      gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
        constexpr int n = decltype(N)::value;
        const BlockQ8_K* x = xq.data() + i * nb;
        switch (t) {
          case DType::Q2_K: return gemv_q2_q3_k<DType::Q2_K, n>(a, x, i, r0, r1);
          case DType::Q3_K: return gemv_q2_q3_k<DType::Q3_K, n>(a, x, i, r0, r1);
          case DType::Q4_K: return gemv_q4_q5_k<DType::Q4_K, n>(a, x, i, r0, r1);
          case DType::Q5_K: return gemv_q4_q5_k<DType::Q5_K, n>(a, x, i, r0, r1);
          default: return gemv_q6_k<n>(a, x, i, r0, r1);
        }
      });
      return;
    }
    default: fail("matmul avx2: unsupported weight type ", dtype_name(a.w->dtype));
  }
}

// ------------------------------------------------------------------ GEMM (packed panels)
constexpr int64_t kNR = 16;        // panel width (output rows)
constexpr int64_t kMR = 6;         // tokens per micro-kernel
constexpr int64_t kKC = 256;       // K chunk (a multiple of every block size)
constexpr int64_t kPanels = 8;     // panels packed together per K chunk

// dst[k][8] <- src rows 0..7, columns k..k+7 (an 8x8 transpose in registers).
FP_AVX2 inline void transpose8_store(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256* q = t + 4 * h;
    r[4 * h + 0] = _mm256_shuffle_ps(q[0], q[2], 0x44);  // columns 0 | 4
    r[4 * h + 1] = _mm256_shuffle_ps(q[0], q[2], 0xEE);  // columns 1 | 5
    r[4 * h + 2] = _mm256_shuffle_ps(q[1], q[3], 0x44);  // columns 2 | 6
    r[4 * h + 3] = _mm256_shuffle_ps(q[1], q[3], 0xEE);  // columns 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}

// Dequantizes rows [o0, o0+rows) x columns [k0, k0+kc) of w into dst[k][16] (f32), zero-padding
// missing rows. FP8 block scales are applied here. Rows are converted into tmp[16][kKC] first,
// then turned into the panel 8 x 8 at a time (with few tokens per call, as an MoE expert gets,
// a scalar scatter here cost more than the micro-kernel's FMAs).
FP_AVX2 void pack_panel(const Tensor& w, int64_t o0, int64_t rows, int64_t k0, int64_t kc, float* dst, float* tmp) {
  const int64_t K = w.cols();
  const auto& info = dtype_info(w.dtype);
  const int64_t sb = w.scale_block, scale_cols = (K + sb - 1) / sb;
  for (int64_t r = 0; r < kNR; ++r) {
    float* t = tmp + r * kKC;
    if (r >= rows) {
      std::memset(t, 0, static_cast<size_t>(kc) * sizeof(float));
      continue;
    }
    const uint8_t* row = w.row_ptr(o0 + r);
    int64_t k = 0;
    switch (w.dtype) {
      case DType::F32: std::memcpy(t, reinterpret_cast<const float*>(row) + k0, static_cast<size_t>(kc) * 4); k = kc; break;
      case DType::F16:
        for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(t + k, load8<DType::F16>(row, k0 + k));
        break;
      case DType::BF16:
        for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(t + k, load8<DType::BF16>(row, k0 + k));
        break;
      case DType::F8_E4M3:
        for (; k + 8 <= kc; k += 8)
          _mm256_storeu_ps(t + k, _mm256_mul_ps(load8<DType::F8_E4M3>(row, k0 + k), _mm256_set1_ps(kFp8Rescale)));
        break;
      default:
        dequantize_row(w.dtype, row + k0 / info.block_elems * info.block_bytes, t, kc);
        k = kc;
    }
    if (k < kc) dequantize_row(w.dtype, row + (k0 + k) * info.block_bytes, t + k, kc - k);
    if (w.block_scale) {
      const float* srow = w.block_scale + ((o0 + r) / sb) * scale_cols;
      for (int64_t kk = 0; kk < kc; ++kk) t[kk] *= srow[(k0 + kk) / sb];
    }
  }
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    transpose8_store(tmp + k, kKC, dst + k * kNR, kNR);
    transpose8_store(tmp + 8 * kKC + k, kKC, dst + k * kNR + 8, kNR);
  }
  for (; k < kc; ++k)
    for (int64_t r = 0; r < kNR; ++r) dst[k * kNR + r] = tmp[r * kKC + k];
}

// y[MR tokens][cols] (+)= x[MR][kc] . pack[kc][16]. The 2 x MR accumulators are named
// variables, not an array: GCC would otherwise keep a stack copy of the array up to date on
// every iteration (measured: 0.76 FMA/cycle instead of ~2).
template <int MR>
FP_AVX2 void micro_kernel(const float* x, int64_t ldx, const float* pack, int64_t kc, float* y, int64_t ldy, int64_t cols,
                          bool first, const float* bias) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const float* x4 = x + 4 * ldx;
  const float* x5 = x + 5 * ldx;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(pack + k * kNR), b1 = _mm256_loadu_ps(pack + k * kNR + 8);
    __m256 av = _mm256_broadcast_ss(x0 + k);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    if constexpr (MR > 1) {
      av = _mm256_broadcast_ss(x1 + k);
      c10 = _mm256_fmadd_ps(av, b0, c10);
      c11 = _mm256_fmadd_ps(av, b1, c11);
    }
    if constexpr (MR > 2) {
      av = _mm256_broadcast_ss(x2 + k);
      c20 = _mm256_fmadd_ps(av, b0, c20);
      c21 = _mm256_fmadd_ps(av, b1, c21);
    }
    if constexpr (MR > 3) {
      av = _mm256_broadcast_ss(x3 + k);
      c30 = _mm256_fmadd_ps(av, b0, c30);
      c31 = _mm256_fmadd_ps(av, b1, c31);
    }
    if constexpr (MR > 4) {
      av = _mm256_broadcast_ss(x4 + k);
      c40 = _mm256_fmadd_ps(av, b0, c40);
      c41 = _mm256_fmadd_ps(av, b1, c41);
    }
    if constexpr (MR > 5) {
      av = _mm256_broadcast_ss(x5 + k);
      c50 = _mm256_fmadd_ps(av, b0, c50);
      c51 = _mm256_fmadd_ps(av, b1, c51);
    }
  }
  alignas(32) float t[6][kNR];
  _mm256_store_ps(t[0], c00), _mm256_store_ps(t[0] + 8, c01);
  _mm256_store_ps(t[1], c10), _mm256_store_ps(t[1] + 8, c11);
  _mm256_store_ps(t[2], c20), _mm256_store_ps(t[2] + 8, c21);
  _mm256_store_ps(t[3], c30), _mm256_store_ps(t[3] + 8, c31);
  _mm256_store_ps(t[4], c40), _mm256_store_ps(t[4] + 8, c41);
  _mm256_store_ps(t[5], c50), _mm256_store_ps(t[5] + 8, c51);
  for (int r = 0; r < MR; ++r) {
    float* yr = y + r * ldy;
    if (first) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = t[r][c] + (bias ? bias[c] : 0.0f);
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] += t[r][c];
    }
  }
}

void gemm(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows();
  const int64_t group_rows = kNR * kPanels, groups = (out + group_rows - 1) / group_rows;
  thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> pack(static_cast<size_t>(kPanels * kKC * kNR)), tmp(static_cast<size_t>(kNR * kKC));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o_begin = g * group_rows, o_end = std::min(out, o_begin + group_rows);
      const int64_t panels = (o_end - o_begin + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t kc = std::min(kKC, K - k0);
        for (int64_t p = 0; p < panels; ++p) {
          int64_t o0 = o_begin + p * kNR;
          pack_panel(w, o0, std::min(kNR, o_end - o0), k0, kc, pack.data() + p * kKC * kNR, tmp.data());
        }
        for (int64_t i0 = 0; i0 < a.n; i0 += kMR) {
          const int64_t mr = std::min(kMR, a.n - i0);
          for (int64_t p = 0; p < panels; ++p) {
            const int64_t o0 = o_begin + p * kNR, cols = std::min(kNR, o_end - o0);
            const float* xs = a.x + i0 * K + k0;
            const float* pk = pack.data() + p * kKC * kNR;
            float* ys = a.y + i0 * out + o0;
            const float* bias = a.bias ? a.bias + o0 : nullptr;
            bool first = k0 == 0;
            switch (mr) {
              case 1: micro_kernel<1>(xs, K, pk, kc, ys, out, cols, first, bias); break;
              case 2: micro_kernel<2>(xs, K, pk, kc, ys, out, cols, first, bias); break;
              case 3: micro_kernel<3>(xs, K, pk, kc, ys, out, cols, first, bias); break;
              case 4: micro_kernel<4>(xs, K, pk, kc, ys, out, cols, first, bias); break;
              case 5: micro_kernel<5>(xs, K, pk, kc, ys, out, cols, first, bias); break;
              default: micro_kernel<6>(xs, K, pk, kc, ys, out, cols, first, bias); break;
            }
          }
        }
      }
    }
  });
}

// ------------------------------------------------------------------ 4-bit prefill, interleaved
// Q4_0 / Q4_1 / Q4_K prefill on the interleaved layout (matmul_interleave.h), and the 5-bit
// Q5_0 / Q5_1 / Q5_K. 4-bit weights keep vpmaddubsw pairs within 2 x 15 x 128, so eight chunks
// add up in int16 (<= 30720) before one vpmaddwd per 8 blocks; 5-bit ones (2 x 31 x 128) four
// chunks (<= 31744), so kChunks = 4 widens twice per group.
// K in blocks of 8 groups (2048 values): a 3-token tile's activations (3 x 8 x 448 bytes) stay
// in L1 while the row block's 16 row pairs pass over them.
constexpr int64_t kGroupBlock = 8;

template <int R, int T, bool kMins, int kChunks>
FP_AVX2 void tile_q4(const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                     const float* bias) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i i32[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) i32[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
    for (int c0 = 0; c0 < 8; c0 += kChunks) {
      __m256i a16[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) a16[r][t] = _mm256_setzero_si256();
      const auto chunk = [&](int c) FP_AVX2_INLINE_LAMBDA {
        __m256i wv[R];
        for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].q + 32 * c));
        for (int t = 0; t < T; ++t) {
          const __m256i xv = in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c)));
          for (int r = 0; r < R; ++r) a16[r][t] = _mm256_add_epi16(a16[r][t], _mm256_maddubs_epi16(wv[r], xv));
        }
      };
      // Unrolled by 4 (8 chunks) or 2 (4 chunks): rolled, GCC copied every sum back to its
      // register after each add (6 vmovdqa per chunk, dispatch-bound); fully unrolled it issued
      // all the multiplies first and spilled (bench/mca_loops.py, znver3: 44.7 -> 38.0 cycles
      // per group for the 2x3 Q4 tile).
      if constexpr (kChunks == 8) {
#pragma GCC unroll 4
        for (int c = c0; c < c0 + kChunks; ++c) chunk(c);
      } else {
#pragma GCC unroll 2
        for (int c = c0; c < c0 + kChunks; ++c) chunk(c);
      }
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) i32[r][t] = _mm256_add_epi32(i32[r][t], _mm256_madd_epi16(a16[r][t], ones));
    }
    for (int r = 0; r < R; ++r) {
      __m256 ws = _mm256_loadu_ps(w[r][g].scale);
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32[r][t]), _mm256_mul_ps(ws, _mm256_loadu_ps(x[t][g].d)), acc[r][t]);
        if (kMins) acc[r][t] = _mm256_fnmadd_ps(_mm256_loadu_ps(w[r][g].min), _mm256_loadu_ps(x[t][g].bsum), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

template <bool kMins, int kChunks>
void tile_q4_dispatch(int R, int T, const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups, float* y,
                      int64_t ldy, const float* bias) {
  switch (R * 4 + T) {
#define FP_TILE(r, t) case r * 4 + t: return tile_q4<r, t, kMins, kChunks>(w, x, groups, y, ldy, bias);
    FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3) FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3)
#undef FP_TILE
  }
}

// MXFP4 (and its _X8 form) too: its levels + 12 are 0..24, so its tiles take four chunks as 5-bit ones
// (avx2::kMxfp4Offset). IQ4's levels + 128 would overflow vpmaddubsw.
bool q4_tile_type(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q4_K_X8 ||
         t == DType::Q5_K || t == DType::MXFP4 || (is_block32_x8(t) && t != DType::IQ4_NL_X8);
}

void gemm_q4_interleaved(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  const bool mins = cpu::packed_has_mins(t);
  const bool five_bit = t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K || t == DType::Q5_0_X8 || t == DType::Q5_1_X8 ||
                        t == DType::MXFP4 || t == DType::MXFP4_X8;
  cpu::gemm_interleaved(a, 2, 3, [&](int R, int T, const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups,
                                  float* y, int64_t ldy, const float* bias) {
    if (five_bit) {
      if (mins) tile_q4_dispatch<true, 4>(R, T, w, x, groups, y, ldy, bias);
      else tile_q4_dispatch<false, 4>(R, T, w, x, groups, y, ldy, bias);
    } else {
      if (mins) tile_q4_dispatch<true, 8>(R, T, w, x, groups, y, ldy, bias);
      else tile_q4_dispatch<false, 8>(R, T, w, x, groups, y, ldy, bias);
    }
  }, kGroupBlock);
}

// Q6_K (and Q3_K) prefill on the interleaved layout: unsigned 6-bit weights (q, the value being
// q - 32; Q3_K: 3-bit, q - 4); chunks 0..3 and 4..7 (each block's two 16-value groups, two
// scales) sum apart, started at -32 (Q3_K: -4) x sum(x) of their half. vpmaddubsw pairs reach
// 2 x 63 x 128, so two chunks add up in int16 (<= 32256) before one vpmaddwd widens them: 12
// multiplies per 256 values and tile element instead of 16. The float sums live in memory
// (updated twice per group), leaving the 16 registers to the hot loop: 6 integer sums, 4 weight
// and 2 activation vectors, the constant and the products. Kept in registers with one vpmaddwd
// per chunk, GCC spilled the integer sums of the 2x3 tile inside the chunk loop.
template <int R, int T>
FP_AVX2 void tile_q6(const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                     const float* bias) {
  alignas(32) float acc[R][T][8] = {};
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    for (int half = 0; half < 2; ++half) {
      __m256i isum[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
          isum[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half ? x[t][g].init_hi : x[t][g].init));
      for (int c = 4 * half; c < 4 * half + 4; c += 2) {
        __m256i w0[R], w1[R];
        for (int r = 0; r < R; ++r) {
          w0[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].q + 32 * c));
          w1[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].q + 32 * (c + 1)));
        }
        for (int t = 0; t < T; ++t) {
          const __m256i x0 = in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c)));
          const __m256i x1 = in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * (c + 1))));
          for (int r = 0; r < R; ++r) {
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0[r], x0), _mm256_maddubs_epi16(w1[r], x1));
            isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(s16, ones));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256 ws = _mm256_loadu_ps(half ? w[r][g].scale_hi : w[r][g].scale);
        for (int t = 0; t < T; ++t)
          _mm256_store_ps(acc[r][t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_mul_ps(ws, _mm256_loadu_ps(x[t][g].d)),
                                                     _mm256_load_ps(acc[r][t])));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(_mm256_load_ps(acc[r][t])) + (bias ? bias[r] : 0.0f);
}

void gemm_q6_interleaved(const MatMulArgs& a) {
  cpu::gemm_interleaved(a, 2, 3, [&](int R, int T, const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups,
                                  float* y, int64_t ldy, const float* bias) {
    switch (R * 4 + T) {
#define FP_TILE(r, t) case r * 4 + t: return tile_q6<r, t>(w, x, groups, y, ldy, bias);
      FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3) FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3)
#undef FP_TILE
    }
  });  // K at once: blocks of 8 groups measured slower here (Q6_K_X8, K = 8192: 102 vs 93 ms)
}

// ------------------------------------------------------------------ Q8_0_X8 (packed at load)
// One weight row against T <= 4 tokens of interleaved activations. The stored w + 128 turns
// back into signed w with one xor; then |w| x sign(x, w) as in dot_i8 (vpmaddubsw would
// saturate on the unsigned w + 128). Lane j of the int32 sums holds block j of the group.
template <int T>
FP_AVX2 void row_q8_0_x8(const BlockQ8_0x8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    const auto chunk = [&](int c) FP_AVX2_INLINE_LAMBDA {
      const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[g].qs + 32 * c)), flip);
      const __m256i wabs = _mm256_abs_epi8(wv);
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv, wv)), ones));
      }
    };
    if constexpr (T <= 2) {
      for (int c = 0; c < 8; ++c) chunk(c);
    } else {  // rolled from 3 tokens (see iq4_x8_chunk)
#pragma GCC unroll 1
      for (int c = 0; c < 8; ++c) chunk(c);
    }
    const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[g].d)));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(ws, _mm256_loadu_ps(x[t][g].d)), acc[t]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

void matmul_q8_0_x8(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), groups = w.cols() / QK8_0X8;
  const std::vector<cpu::PackedX> xp = cpu::pack_all_activations(a);
  gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    constexpr int T = decltype(N)::value;
    const cpu::PackedX* xs[T];
    for (int t = 0; t < T; ++t) xs[t] = xp.data() + (i + t) * groups;
    for (int64_t o = r0; o < r1; ++o)
      row_q8_0_x8<T>(reinterpret_cast<const BlockQ8_0x8*>(w.row_ptr(o)), xs, groups, a.y + i * out + o, out,
                     a.bias ? a.bias[o] : 0.0f);
  });
}

// ------------------------------------------------------------------ Q4_K_X8 decode (packed at load)
// One weight row against T <= 4 tokens of interleaved Q8_K activations. Chunk t's low / high
// nibbles meet activation chunks t / t + 4; the eight vpmaddubsw pair sums add up in int16
// (<= 8 x 2 x 15 x 127 = 30480) and one vpmaddwd leaves sub-block j's dot product in int32
// lane j, so the scales and mins apply once per super-block as 8-lane float vectors. Against
// Q4_K's layout this drops the per-sub-block scale shuffles and multiply-adds (decode was
// compute-bound: bench/RESULTS.md).
template <int T>
FP_AVX2 void row_q4_k_x8(const BlockQ4_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 3; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 144 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[g].qs + 32 * c));
      lo[c] = _mm256_and_si256(q, m4);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    __m256 scale, min;
    q4_k_x8_scales_mins(w[g], &scale, &min);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i s16 = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c))));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)))));
      }
      const __m256i dot = _mm256_madd_epi16(s16, ones);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
      acc[t] = _mm256_fnmadd_ps(min, _mm256_loadu_ps(x[t][g].bsum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

void gemv_q4_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ4_Kx8>(a, [](auto N, const BlockQ4_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q4_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// ------------------------------------------------------------------ Q6_K_X8 decode (packed at load)
// As Q4_K_X8, with the 6-bit weights assembled per chunk (simd_avx2.h) and each block's two
// 16-value groups summed apart from -32 x sum(x) (their own scales); vpmaddubsw pairs reach
// 2 x 63 x 127, so each chunk widens to int32 at once.
template <int T>
FP_AVX2 void row_q6_k_x8(const BlockQ6_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 4; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 210 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) q6_k_x8_chunks(w[g], c, &lo[c], &hi[c]);
    __m256 s_lo, s_hi;
    q6_k_x8_scales(w[g], &s_lo, &s_hi);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i dot_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
      __m256i dot_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init_hi));
      for (int c = 0; c < 4; ++c) {
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)));
        dot_lo = _mm256_add_epi32(dot_lo, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], xl), ones));
        dot_hi = _mm256_add_epi32(dot_hi, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], xh), ones));
      }
      const __m256 dx = _mm256_loadu_ps(x[t][g].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_lo), _mm256_mul_ps(s_lo, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_hi), _mm256_mul_ps(s_hi, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

void gemv_q6_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ6_Kx8>(a, [](auto N, const BlockQ6_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q6_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// ------------------------------------------------------------------ Q3_K_X8 decode (packed at load)
// As Q6_K_X8 with 3-bit values (the chunks assembled from the 2-bit plane and the third-bit mask,
// simd_avx2.h): each half's four pair sums add up in int16 (<= 4 x 2 x 7 x 127 = 7112) before one
// vpmaddwd; the -4 offset starts each half (-4 x sum(x) of its 16 values, PackedX::init / init_hi).
template <int T>
FP_AVX2 void row_q3_k_x8(const BlockQ3_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 2; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 110 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) q3_k_x8_chunks(w[g], c, &lo[c], &hi[c]);
    __m256 s_lo, s_hi;
    q3_k_x8_scales(w[g], &s_lo, &s_hi);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i p_lo = _mm256_setzero_si256(), p_hi = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        p_lo = _mm256_add_epi16(p_lo, _mm256_maddubs_epi16(lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c))));
        p_hi = _mm256_add_epi16(p_hi, _mm256_maddubs_epi16(hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)))));
      }
      const __m256i dot_lo = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init)), _mm256_madd_epi16(p_lo, ones));
      const __m256i dot_hi = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init_hi)), _mm256_madd_epi16(p_hi, ones));
      const __m256 dx = _mm256_loadu_ps(x[t][g].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_lo), _mm256_mul_ps(s_lo, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_hi), _mm256_mul_ps(s_hi, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

void gemv_q3_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ3_Kx8>(a, [](auto N, const BlockQ3_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q3_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// ------------------------------------------------------------------ Q2_K_X8 (packed at load), every batch size
// As Q3_K_X8 with 2-bit values and no offset; each 16 values' minimum comes off once per
// super-block: dmin x d_x x sum over the 16 groups of min x sum(x) (PackedX::sum16).
template <int T>
FP_AVX2 void row_q2_k_x8(const BlockQ2_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 2; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 84 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) q2_k_x8_chunks(w[g], c, &lo[c], &hi[c]);
    __m256 s_lo, s_hi;
    __m256i m_lo, m_hi;
    q2_k_x8_scales_mins(w[g], &s_lo, &s_hi, &m_lo, &m_hi);
    const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(w[g].dmin));
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i p_lo = _mm256_setzero_si256(), p_hi = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {  // pair sums <= 4 x 2 x 3 x 127 in int16
        p_lo = _mm256_add_epi16(p_lo, _mm256_maddubs_epi16(lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c))));
        p_hi = _mm256_add_epi16(p_hi, _mm256_maddubs_epi16(hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)))));
      }
      const __m256 dx = _mm256_loadu_ps(x[t][g].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p_lo, ones)), _mm256_mul_ps(s_lo, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p_hi, ones)), _mm256_mul_ps(s_hi, dx), acc[t]);
      const __m256i mins = _mm256_add_epi32(_mm256_mullo_epi32(m_lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].sum16))),
                                            _mm256_mullo_epi32(m_hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].sum16 + 8))));
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

void matmul_q2_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ2_Kx8>(a, [](auto N, const BlockQ2_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q2_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// ------------------------------------------------------------------ Q4_0/Q4_1/Q5_0/Q5_1 _X8 decode (packed at load)
// As Q4_K_X8: chunk c's values meet activation chunk c and c + 4's, lane j of the int32 sums is
// block j's dot product, and the 8 blocks' scales (and minimums) apply as one vector per group
// where the file's layout costs a scale broadcast and a multiply-add per 32 values. Four-bit
// pair sums add up in int16 over all 8 chunks (<= 8 x 2 x 15 x 127 = 30480), five-bit ones over
// two (2 x 2 x 31 x 127 = 15748). The offset of Q4_0 / Q5_0 (q - 8, q - 16) starts the sums as
// -offset x sum(x) (PackedX::init); Q4_1 / Q5_1's minimum adds m x d_x sum(x) (PackedX::bsum).
// One group's chunks (lo[c], hi[c]: chunks c and c + 4 as unsigned values) against activation
// group g of the T tokens.
template <DType W, int T>
FP_AVX2_INLINE void block32_x8_group(const __m256i* lo, const __m256i* hi, __m256 scale, __m256 min, const cpu::PackedX* const* x,
                                     int64_t g, __m256* acc) {
  using Traits = Block32X8<W>;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < T; ++t) {
    const uint8_t* xq = x[t][g].q;
    __m256i dot = Traits::kOffset ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init)) : _mm256_setzero_si256();
    __m256i s16 = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)));
      s16 = _mm256_add_epi16(s16, _mm256_add_epi16(_mm256_maddubs_epi16(lo[c], xl), _mm256_maddubs_epi16(hi[c], xh)));
      if constexpr (Traits::kFive) {
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(s16, ones));
        s16 = _mm256_setzero_si256();
      }
    }
    if constexpr (!Traits::kFive) dot = _mm256_add_epi32(dot, _mm256_madd_epi16(s16, ones));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
    if constexpr (Traits::kMins) acc[t] = _mm256_fmadd_ps(min, _mm256_loadu_ps(x[t][g].bsum), acc[t]);
  }
}

// `tail`, `tail_blocks`: a Q4_0_X8 row's last blocks, a partial group (core/dtype.h), dotted as group
// `groups` (null, 0: none).
template <DType W, int T>
FP_AVX2 void row_block32_x8(const typename Block32X8<W>::type* w, const cpu::PackedX* const* x, int64_t groups, float* y,
                            int64_t ldy, float bias, const BlockQ4_0* tail = nullptr, int64_t tail_blocks = 0) {
  using Traits = Block32X8<W>;
  constexpr int kLines = (sizeof(typename Traits::type) + 63) / 64;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  __m256i lo[4], hi[4];
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < kLines; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);
    for (int c = 0; c < 4; ++c) block32_x8_chunks<W>(w[g], c, &lo[c], &hi[c]);
    block32_x8_group<W, T>(lo, hi, block32_x8_scales<W>(w[g]), block32_x8_mins<W>(w[g]), x, g, acc);
  }
  if constexpr (W == DType::Q4_0_X8) {
    if (tail_blocks > 0) {
      __m256i q[4];
      __m256 scale;
      tail_group(tail, tail_blocks, q, &scale);
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int c = 0; c < 4; ++c) lo[c] = _mm256_and_si256(q[c], m4), hi[c] = _mm256_and_si256(_mm256_srli_epi16(q[c], 4), m4);
      block32_x8_group<W, T>(lo, hi, scale, _mm256_setzero_ps(), x, groups, acc);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

// Q4_0_X8's rows may end in a partial group (cpu::X8Tail): its row takes it.
template <DType W>
void gemv_block32_x8_as(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<typename Block32X8<W>::type>(
      a, [](auto N, const typename Block32X8<W>::type* w, const cpu::PackedX* const* xs, int64_t groups, float* y, int64_t ldy,
            float bias, auto... tail) { row_block32_x8<W, decltype(N)::value>(w, xs, groups, y, ldy, bias, tail...); });
}

void gemv_block32_x8(const MatMulArgs& a) {
  switch (a.w->dtype) {
    case DType::Q4_0_X8: return gemv_block32_x8_as<DType::Q4_0_X8>(a);
    case DType::Q4_1_X8: return gemv_block32_x8_as<DType::Q4_1_X8>(a);
    case DType::Q5_0_X8: return gemv_block32_x8_as<DType::Q5_0_X8>(a);
    default: return gemv_block32_x8_as<DType::Q5_1_X8>(a);
  }
}

// ------------------------------------------------------------------ IQ4_NL_X8 / IQ4_XS_X8 / MXFP4_X8 (packed at load)
// As the 32-value _X8 forms, with each chunk's nibbles looked up in the 16 signed levels (one
// vpshufb per chunk, shared by the tokens). Signed weights against signed activations take the
// sign trick (|w| x sign(x, w) in vpmaddubsw); a pair can reach 2 x 127 x 127, so every chunk's
// pairs widen to int32 at once. IQ4 runs them at every batch size (no AVX2 prefill tiles: their
// vpmaddubsw would overflow on IQ4's levels offset to unsigned); MXFP4_X8 only decodes here, its
// small levels (+ 12) fit the Q4 tiles.
// Chunk c (values 32c.. of lo, 32(c + 4).. of hi) against T tokens. The chunk loop calling this is
// fully unrolled for 1-2 tokens and kept rolled from 3: unrolled, GCC unpacked all four chunks
// up front and spilled; rolled at 1 token, decode lost ~20% (the next chunk's loads no longer
// overlap this one's sums). Q2_K_X8 measured slower rolled and keeps its unrolled loop.
// q: the chunk's 32 bytes of qs (qs + 32c).
template <int T>
FP_AVX2_INLINE void iq4_x8_chunk(__m256i q, const cpu::PackedX* const* x, int64_t g, int c, __m256i levels, __m256i* dot) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo, hi;
  iq4_x8_split(q, levels, &lo, &hi);
  const __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
  for (int t = 0; t < T; ++t) {
    const uint8_t* xq = x[t][g].q;
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4)));
    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(xl, lo)), ones));
    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ahi, _mm256_sign_epi8(xh, hi)), ones));
  }
}

// `tail`, `tail_blocks`: an IQ4_NL_X8 / MXFP4_X8 row's partial last group (cpu::X8Tail), dotted as
// group `groups` (null, 0: none).
template <class Block, int T, class Tail = BlockMXFP4>
FP_AVX2 void row_iq4_x8(const Block* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias,
                        const Tail* tail = nullptr, int64_t tail_blocks = 0) {
  constexpr int kLines = (sizeof(Block) + 63) / 64;
  const __m256i levels = x8_levels<Block>(false);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  auto chunk_q = [&](int64_t g, int c) FP_AVX2_INLINE_LAMBDA { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[g].qs + 32 * c)); };
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < kLines; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);
    __m256i dot[T];
    for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
    if constexpr (T <= 2) {
      for (int c = 0; c < 4; ++c) iq4_x8_chunk<T>(chunk_q(g, c), x, g, c, levels, dot);
    } else {
#pragma GCC unroll 1
      for (int c = 0; c < 4; ++c) iq4_x8_chunk<T>(chunk_q(g, c), x, g, c, levels, dot);
    }
    const __m256 scale = iq4_x8_scales(w[g]);
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
  }
  if (tail_blocks > 0) {
    __m256i q[4], dot[T];
    __m256 scale;
    tail_group(tail, tail_blocks, q, &scale);
    for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) iq4_x8_chunk<T>(q[c], x, groups, c, levels, dot);
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][groups].d)), acc[t]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + bias;
}

template <class Block>
void matmul_iq4_x8_as(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<Block>(a, [](auto N, const Block* w, const cpu::PackedX* const* xs, int64_t groups, float* y, int64_t ldy,
                                       float bias, auto... tail) {
    row_iq4_x8<Block, decltype(N)::value>(w, xs, groups, y, ldy, bias, tail...);
  });
}

void matmul_iq4_x8(const MatMulArgs& a) {
  if (a.w->dtype == DType::IQ4_NL_X8) matmul_iq4_x8_as<BlockIQ4_NLx8>(a);
  else if (a.w->dtype == DType::MXFP4_X8) matmul_iq4_x8_as<BlockMXFP4x8>(a);
  else matmul_iq4_x8_as<BlockIQ4_XSx8>(a);
}

// Float-like weights: GEMV for a few tokens, packed FMA GEMM beyond. Quantized weights: integer
// dot products at every batch size (the int8 multiply-add rate is above the f32 FMA rate).
void matmul_avx2(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const DType t = a.w->dtype;
  if (t == DType::Q8_0_X8) matmul_q8_0_x8(a);
  else if (t == DType::Q4_K_X8 && a.n <= kGemvMaxTokens) gemv_q4_k_x8(a);
  else if (t == DType::Q6_K_X8 && a.n <= kGemvMaxTokens) gemv_q6_k_x8(a);
  else if (is_block32_x8(t) && t != DType::IQ4_NL_X8 && t != DType::MXFP4_X8 && a.n <= kGemvMaxTokens) gemv_block32_x8(a);
  else if (t == DType::Q3_K_X8 && a.n <= kGemvMaxTokens) gemv_q3_k_x8(a);
  else if (t == DType::Q2_K_X8) matmul_q2_k_x8(a);  // every batch size (Q2_K has no prefill tiles either)
  else if (t == DType::IQ4_NL_X8 || t == DType::IQ4_XS_X8 || (t == DType::MXFP4_X8 && a.n <= kGemvMaxTokens))
    matmul_iq4_x8(a);  // IQ4: every batch size
  else if (a.n > kGemvMaxTokens && q4_tile_type(t) && cpu::interleaved_supported(a))
    gemm_q4_interleaved(a);
  else if (a.n > kGemvMaxTokens && (t == DType::Q6_K || t == DType::Q6_K_X8 || t == DType::Q3_K || t == DType::Q3_K_X8) &&
           cpu::interleaved_supported(a))
    gemm_q6_interleaved(a);
  else if (a.n <= kGemvMaxTokens || dtype_info(t).quantized) gemv(a);
  else gemm(a);
}

std::string refuse_matmul_avx2(const MatMulArgs& a) {
  static const std::string cpu = cpu_features().missing({"avx2", "fma", "f16c"});
  if (!cpu.empty()) return cpu;
  switch (a.w->dtype) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::F8_E4M3:
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q2_K: case DType::Q3_K:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q8_0_X8: case DType::Q4_K_X8: case DType::Q6_K_X8:
    case DType::Q4_0_X8: case DType::Q4_1_X8: case DType::Q5_0_X8: case DType::Q5_1_X8: case DType::Q3_K_X8:
    case DType::Q2_K_X8: case DType::IQ4_NL: case DType::IQ4_XS: case DType::IQ4_NL_X8: case DType::IQ4_XS_X8:
    case DType::MXFP4: case DType::MXFP4_X8: break;
    default: return std::string("no AVX2 kernel for weights of type ") + dtype_name(a.w->dtype);
  }
  if (a.w->block_scale && a.w->dtype != DType::F8_E4M3) return "block scales are only supported on FP8 weights";
  return {};
}

const bool registered = register_kernel(Kernel<MatMulArgs>{"avx2", Backend::CPU, 100, false, refuse_matmul_avx2, matmul_avx2});

}  // namespace
}  // namespace fp
