// kernels/cpu/simd_avx2.h — small AVX2 building blocks shared by the AVX2 kernels: loading
// 8 weights of any float-like dtype as f32, horizontal sums, the int8 dot step. Functions
// carry the target attribute, so these files build without -mavx2 and run only after the
// dispatcher has checked the CPU (see core/cpu_features.h).
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"

#define FP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FP_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
// For a lambda inside an FP_AVX2 function (lambdas do not inherit the target): [&](...) FP_AVX2_INLINE_LAMBDA { ... }
#define FP_AVX2_INLINE_LAMBDA __attribute__((target("avx2,fma,f16c"), always_inline))

namespace fp::avx2 {

// A vector loaded once and used by several multiplies (one activation chunk against each row of
// a tile): the empty asm makes it live in a register. Otherwise GCC folds the load into every
// vpmaddubsw that uses it, and Zen 3's two 256-bit loads per cycle, not its multiply pipes,
// bound the loop (bench/mca_loops.py: the 2x3 Q4 tile's chunk loop went from 8 loads to 5;
// with the loop also unrolled, 4.1 -> 3.2 cycles per chunk).
FP_AVX2_INLINE __m256i in_register(__m256i v) {
  __asm__("" : "+x"(v));
  return v;
}

FP_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

FP_AVX2_INLINE int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

FP_AVX2_INLINE __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
FP_AVX2_INLINE __m256 load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
// E4M3 -> f32 without a table: place the 7 magnitude bits where an f16's exponent and
// mantissa go (exponent bias 15 instead of 7) and the sign bit at f16's, convert, then scale
// by 2^8. Subnormals come out right too. (The NaN code 0x7f maps to 480; weights have none.)
FP_AVX2_INLINE __m256 load_fp8_unscaled(const uint8_t* p) {  // returns value / 256
  __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7);
  __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
  return _mm256_cvtph_ps(_mm_or_si128(mag, sign));
}
constexpr float kFp8Rescale = 256.0f;

// Loads 8 weights of a float-like dtype as f32 (FP8 comes back divided by 256).
template <DType T>
FP_AVX2_INLINE __m256 load8(const void* base, int64_t k) {
  if constexpr (T == DType::F32) return _mm256_loadu_ps(static_cast<const float*>(base) + k);
  if constexpr (T == DType::F16) return load_f16(static_cast<const uint16_t*>(base) + k);
  if constexpr (T == DType::BF16) return load_bf16(static_cast<const uint16_t*>(base) + k);
  if constexpr (T == DType::F8_E4M3) return load_fp8_unscaled(static_cast<const uint8_t*>(base) + k);
}

// sum of a[i]*b[i] over 32 signed bytes, as 8 int32 lanes (|a|, |b| <= 127).
FP_AVX2_INLINE __m256i dot_i8(__m256i a, __m256i b) {
  __m256i ua = _mm256_sign_epi8(a, a);
  __m256i sb = _mm256_sign_epi8(b, a);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sb), _mm256_set1_epi16(1));
}

// sum of u[i]*s[i] for unsigned u (< 128) and signed s, as 8 int32 lanes, each lane
// multiplied by the int16 scales in `scale16` (per pair of bytes).
FP_AVX2_INLINE __m256i dot_u8_scaled(__m256i u, __m256i s, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

// Byte j of the result = 0xff where bit j of x is set: each byte picks the byte of x holding its
// bit, then tests that one bit.
FP_AVX2_INLINE __m256i bits_to_bytes(uint32_t x) {
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)),
                                            _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

// The 32-value formats repacked at load (Q4_0_X8, Q4_1_X8, Q5_0_X8, Q5_1_X8; core/dtype.h): their
// group type, whether they carry a minimum (weight d * q + m) or a fifth bit, and the offset of
// q (weight d * (q - offset)) for the others.
template <DType T> struct Block32X8;
template <> struct Block32X8<DType::Q4_0_X8> { using type = BlockQ4_0x8; static constexpr bool kMins = false, kFive = false; static constexpr int kOffset = 8; };
template <> struct Block32X8<DType::Q4_1_X8> { using type = BlockQ4_1x8; static constexpr bool kMins = true, kFive = false; static constexpr int kOffset = 0; };
template <> struct Block32X8<DType::Q5_0_X8> { using type = BlockQ5_0x8; static constexpr bool kMins = false, kFive = true; static constexpr int kOffset = 16; };
template <> struct Block32X8<DType::Q5_1_X8> { using type = BlockQ5_1x8; static constexpr bool kMins = true, kFive = true; static constexpr int kOffset = 0; };

// Chunks c and c + 4 (c < 4) of a group as unsigned values (0..15, or 0..31 with the fifth bit):
// byte 4j + k of chunk c = block j's value 4c + k.
template <DType T>
FP_AVX2_INLINE void block32_x8_chunks(const typename Block32X8<T>::type& b, int c, __m256i* lo, __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
  *lo = _mm256_and_si256(q, m4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
  if constexpr (Block32X8<T>::kFive) {  // bit c (c + 4) of each qh byte to bit 4: 16-bit shifts of at most
    // 4 places, so no bit of the neighbouring byte reaches bit 4
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - c)), bit4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(c)), bit4));
  }
}

// The 8 blocks' scales (and minimums, for the formats with one) as f32, lane j = block j.
template <DType T>
FP_AVX2_INLINE __m256 block32_x8_scales(const typename Block32X8<T>::type& b) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
}
template <DType T>
FP_AVX2_INLINE __m256 block32_x8_mins(const typename Block32X8<T>::type& b) {
  if constexpr (Block32X8<T>::kMins) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.m)));
  else return _mm256_setzero_ps();
}

// d x the 8 scales and dmin x the 8 mins of a Q4_K_X8 super-block (core/dtype.h), lane j = sub-block j.
FP_AVX2_INLINE void q4_k_x8_scales_mins(const BlockQ4_Kx8& b, __m256* scale, __m256* min) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
  uint32_t lo4;
  std::memcpy(&lo4, b.scales + 8, 4);
  const __m256i min_lo = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(lo4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(15));
  const __m256i min_hi = _mm256_srli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xc0)), 2);
  *scale = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(63))), _mm256_set1_ps(_cvtsh_ss(b.d)));
  *min = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_or_si256(min_hi, min_lo)), _mm256_set1_ps(_cvtsh_ss(b.dmin)));
}

// Chunks t and t + 4 (t < 4) of a Q6_K_X8 super-block (core/dtype.h) as bytes 0..63: the low
// nibbles of ql chunk t with the high bits of qh vector t / 2 at bits 0 / 2 (t even) or 4 / 6 (t odd).
FP_AVX2_INLINE void q6_k_x8_chunks(const BlockQ6_Kx8& b, int t, __m256i* lo, __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 32 * t));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * (t / 2)));
  const __m256i h_lo = t % 2 == 0 ? _mm256_slli_epi16(h, 4) : h;  // the high bits moved to bits 4..5
  const __m256i h_hi = t % 2 == 0 ? _mm256_slli_epi16(h, 2) : _mm256_srli_epi16(h, 2);
  *lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(h_lo, m30));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_and_si256(h_hi, m30));
}

// d x the scales of a Q6_K_X8 super-block's blocks: values 0..15 (lo) and 16..31 (hi), lane j = block j.
FP_AVX2_INLINE void q6_k_x8_scales(const BlockQ6_Kx8& b, __m256* lo, __m256* hi) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
  *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)))), d);
  *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales + 8)))), d);
}

// Chunks t and t + 4 (t < 4) of a Q3_K_X8 super-block (core/dtype.h) as 3-bit values 0..7: the
// plane's 2 bits (bits 4 (t % 2) and 4 (t % 2) + 2 of qs vector t / 2) and hmask bit t / t + 4 as 4.
// 16-bit shifts of at most 6 places, masked to bits 0..1 or 2, never take a neighbouring byte's bits.
FP_AVX2_INLINE void q3_k_x8_chunks(const BlockQ3_Kx8& b, int t, __m256i* lo, __m256i* hi) {
  const __m256i m3 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (t / 2)));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
  const int shift = 4 * (t % 2);
  const __m256i h_lo = t <= 2 ? _mm256_sll_epi16(h, _mm_cvtsi32_si128(2 - t)) : _mm256_srl_epi16(h, _mm_cvtsi32_si128(t - 2));
  *lo = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), m3), _mm256_and_si256(h_lo, bit2));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift + 2)), m3),
                        _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(t + 2)), bit2));
}

// d x the signed scales of a Q3_K_X8 super-block's blocks: values 0..15 (lo) and 16..31 (hi), lane j = block j.
FP_AVX2_INLINE void q3_k_x8_scales(const BlockQ3_Kx8& b, __m256* lo, __m256* hi) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
  uint32_t top;
  std::memcpy(&top, b.scales + 8, 4);
  const __m256i t = _mm256_set1_epi32(static_cast<int>(top)), m3 = _mm256_set1_epi32(3), m15 = _mm256_set1_epi32(15);
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), off = _mm256_set1_epi32(32);
  const __m256i s_lo = _mm256_or_si256(_mm256_and_si256(v, m15), _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(t, shifts), m3), 4));
  const __m256i s_hi = _mm256_or_si256(_mm256_srli_epi32(v, 4),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(t, _mm256_add_epi32(shifts, _mm256_set1_epi32(16))), m3), 4));
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
  *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s_lo, off)), d);
  *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s_hi, off)), d);
}

// Chunks t and t + 4 (t < 4) of a Q2_K_X8 super-block: the plane's 2-bit values, as Q3_K_X8's.
FP_AVX2_INLINE void q2_k_x8_chunks(const BlockQ2_Kx8& b, int t, __m256i* lo, __m256i* hi) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (t / 2)));
  const int shift = 4 * (t % 2);
  *lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), m3);
  *hi = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift + 2)), m3);
}

// A Q2_K_X8 super-block's 4-bit scales (d x scale, as f32) and mins (as int32) of its blocks'
// values 0..15 (lo) and 16..31 (hi), lane j = block j.
FP_AVX2_INLINE void q2_k_x8_scales_mins(const BlockQ2_Kx8& b, __m256* s_lo, __m256* s_hi, __m256i* m_lo, __m256i* m_hi) {
  const __m256i m15 = _mm256_set1_epi32(15);
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales + 8)));
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
  *s_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo, m15)), d);
  *s_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi, m15)), d);
  *m_lo = _mm256_srli_epi32(lo, 4);
  *m_hi = _mm256_srli_epi32(hi, 4);
}

// IQ4_NL / IQ4_XS: the 16 levels (kIq4nlValues) in both 128-bit lanes, for vpshufb; with
// `plus128` each level + 128 (its top bit flipped: unsigned 1..241), vpdpbusd's unsigned operand.
FP_AVX2_INLINE __m256i iq4_levels(bool plus128) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  return plus128 ? _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))) : v;
}

// MXFP4's 16 levels (E2M1 doubled to integers, core/dtype.h) in each 128-bit lane, for vpshufb;
// `offset`: each level + kMxfp4Offset (unsigned 0..24). So small a range lets AVX2's vpmaddubsw
// take them as its unsigned operand too (pairs <= 2 x 24 x 128, four chunks within int16), where
// IQ4's + 128 would overflow it.
inline constexpr int kMxfp4Offset = 12;
FP_AVX2_INLINE __m256i mxfp4_levels(bool offset = false) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
  return offset ? _mm256_add_epi8(v, _mm256_set1_epi8(kMxfp4Offset)) : v;
}

// The levels an _X8 form of 16-level nibbles indexes: IQ4_NL_X8 / IQ4_XS_X8 kIq4nlValues,
// MXFP4_X8 kMxfp4Values; `offset`: made unsigned, as the integer kernels' unsigned operand (IQ4
// + 128, MXFP4 + kMxfp4Offset; the activations' init, cpu::PackedX, takes the offset back).
template <class Block>
FP_AVX2_INLINE __m256i x8_levels(bool offset) {
  if constexpr (std::is_same_v<Block, BlockMXFP4x8>) return mxfp4_levels(offset);
  else return iq4_levels(offset);
}

// Chunks c and c + 4 (c < 4) of an IQ4_NL_X8 group or IQ4_XS_X8 super-block (qs interleaved as
// BlockQ4_0x8's) as the levels their nibbles index in `levels` (iq4_levels): from the 32 bytes q
// at qs + 32c (iq4_x8_split), or from qs (iq4_x8_chunks).
FP_AVX2_INLINE void iq4_x8_split(__m256i q, __m256i levels, __m256i* lo, __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  *lo = _mm256_shuffle_epi8(levels, _mm256_and_si256(q, m4));
  *hi = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
}
FP_AVX2_INLINE void iq4_x8_chunks(const uint8_t* qs, int c, __m256i levels, __m256i* lo, __m256i* hi) {
  iq4_x8_split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c)), levels, lo, hi);
}

// The 8 blocks' scales as f32, lane j = block j: IQ4_NL_X8's f16 d[j]; IQ4_XS_X8's d * (ls_j - 32),
// ls_j's low 4 bits at bits 4j of the u32 scales_l, its high 2 at bits 2j of scales_h.
FP_AVX2_INLINE __m256 iq4_x8_scales(const BlockIQ4_NLx8& b) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
}
// 2^(e_j - 128) for 8 E8M0 bytes e_j (one per int32 lane), exactly as mxfp4_half_scale (e = 0, 1 are
// subnormal: 2^-128, 2^-127).
FP_AVX2_INLINE __m256 e8m0_half_scales(__m256i e) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
}
// MXFP4_X8's: its 8 E8M0 bytes' scales.
FP_AVX2_INLINE __m256 iq4_x8_scales(const BlockMXFP4x8& b) {
  return e8m0_half_scales(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.e))));
}
// The partial group of n < 8 blocks that ends an _X8 row (core/dtype.h, block32_x8_takes_tail) as
// one zero-padded group: q[t] = chunk t (lane j = block j's nibble bytes 4t..4t+3) by a masked
// load, and the blocks' scales (zero past n). Nothing is read past the row: the masked loads take
// only the n lanes, and the scales' 16 (MXFP4: 8) bytes lie inside the 18n (17n) of the group.
// MXFP4_X8's scales are E8M0 bytes, Q4_0_X8's / IQ4_NL_X8's f16 (the tail pointer is typed by
// the plain block: BlockIQ4_NL has BlockQ4_0's layout).
FP_AVX2_INLINE __m256i tail_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
FP_AVX2_INLINE void tail_chunks(const uint8_t* chunks, int64_t n, __m256i in, __m256i q[4]) {
  for (int t = 0; t < 4; ++t) q[t] = _mm256_maskload_epi32(reinterpret_cast<const int*>(chunks + 4 * n * t), in);
}
FP_AVX2_INLINE void tail_group(const BlockMXFP4* b, int64_t n, __m256i q[4], __m256* scale) {
  const auto* g = reinterpret_cast<const uint8_t*>(b);
  const __m256i in = tail_lanes(n);
  tail_chunks(g + n, n, in, q);
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g)));
  *scale = _mm256_and_ps(e8m0_half_scales(e), _mm256_castsi256_ps(in));
}
FP_AVX2_INLINE void tail_group(const BlockQ4_0* b, int64_t n, __m256i q[4], __m256* scale) {
  const auto* g = reinterpret_cast<const uint8_t*>(b);
  const __m256i in = tail_lanes(n);
  tail_chunks(g + 2 * n, n, in, q);
  *scale = _mm256_and_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g))), _mm256_castsi256_ps(in));
}
FP_AVX2_INLINE __m256 iq4_x8_scales(const BlockIQ4_XSx8& b) {
  uint32_t lo4;
  std::memcpy(&lo4, b.scales_l, 4);
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(lo4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                      _mm256_set1_epi32(15));
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                      _mm256_set1_epi32(3));
  const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(_cvtsh_ss(b.d)));
}

}  // namespace fp::avx2
