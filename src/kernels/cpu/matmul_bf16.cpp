// kernels/cpu/matmul_bf16.cpp — matmul on AVX512-BF16 (Zen 4 and later, Cooper Lake, Sapphire
// Rapids): vdpbf16ps multiplies 16 pairs of BF16 values and adds both products to 16 f32 lanes,
// twice the f32 FMA rate or more, so the activations are rounded to BF16 once per call (as
// llama.cpp's BF16 path does; `ref_bf16act` is the reference that rounds the same way).
//  - BF16 weights, up to 32 tokens (decode, batched decode): dot products on the rows in place,
//    4 rows x 4 tokens per tile: one load and one vdpbf16ps per 32 weights and token, so a core
//    streams more than the AVX2 GEMV's widening and FMAs let it (27 vs 21 GB/s in L3), and 2-4
//    tokens run 3x faster than its token groups.
//  - BF16 and F16 weights beyond 32 tokens, and quantized weights (every GGUF block format and
//    the repacked forms) beyond 256 tokens (prefill): packed panels, the F16 and quantized rows
//    converted and rounded to BF16 as they are packed. Fewer tokens of quantized weights stay with the
//    integer kernels (the conversion would not pay).
//
//  - `amxbf16` (Sapphire Rapids and later): the same panels multiplied by AMX tiles instead —
//    TDPBF16PS multiplies a 16-token x 32-value tile by a 16-pair x 16-row tile into a 16 x 16
//    f32 tile, 8192 products per instruction. The panel's [pair][row] words are already the
//    layout of two B tiles side by side; 32 tokens x 32 rows of sums live in four C tiles.
//
// Layout: a panel is 32 weight rows x a K chunk, packed as [pair p][row r] 32-bit words (the
// two BF16 values of row r at columns 2p, 2p+1), so one zmm load holds 16 rows' pair p. The
// micro-kernel keeps 8 tokens x 32 rows of f32 sums in 16 zmm registers; per pair it loads the
// panel's two vectors and multiplies each with every token's pair broadcast from memory.
#include <algorithm>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

// GCC 12's AVX-512 conversion intrinsics start from _mm512_undefined_*(), which its flow analysis
// reports as "may be used uninitialized" once inlined (GCC bug 105593); nothing here is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FP_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace fp {
namespace {

constexpr int64_t kNR = 32;      // weight rows per panel
constexpr int64_t kMR = 8;       // tokens per micro-kernel call
constexpr int64_t kKC = 512;     // K chunk, in columns (even)
constexpr int64_t kPanels = 4;   // panels packed together per K chunk (64 KiB of L2)
constexpr int64_t kFewTokens = 32;  // up to this many tokens: dot products on the rows in place, no packing
constexpr int64_t kAmxMinTokensBf16 = 8;  // AMX on BF16 weights beyond this many tokens (a shape-class line)
// Quantized weights from this many tokens on: below it, dequantizing every weight to BF16 once
// per call cost more than the faster products gave back (Q8_0_X8 at 256 tokens: 0.7-1.0x the
// integer kernel; Q4_K_X8 1.4-1.8x; at 512 all gain, 1.1-1.4x; bench/RESULTS.md).
constexpr int64_t kQuantizedMinTokens = 256;

FP_BF16 inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
FP_BF16 inline __m512i as_si(__m512bh v) { return (__m512i)v; }

// One row of K activations to BF16 (round to nearest even, subnormals to zero), into dst.
FP_BF16 void round_row(const float* x, int64_t K, uint16_t* dst) {
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(dst + k, as_si(v));
  }
  for (; k < K; ++k) dst[k] = f32_to_bf16_daz(x[k]);
}

// The calling thread's buffer `Slot`, at least n long, kept between calls (contents are left
// over from the last one): a fresh vector of this size is mapped memory, and every call paid its
// page faults and zeroing again (~0.8 ms of a 0.6 ms AMX call at 200 tokens: enough to lose a
// timed choice it should win). Cache-line aligned: the AMX tiles load from it.
template <class T, int Slot>
cpu::AlignedVector<T>& scratch_buffer(size_t n) {
  thread_local cpu::AlignedVector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// x [n, K] f32 -> [n, Kp] BF16 pairs (Kp = K rounded up to even, the pad a zero).
void round_activations(const float* x, int64_t n, int64_t K, cpu::AlignedVector<uint32_t>& out) {
  const int64_t words = (K + 1) / 2;
  out.assign(static_cast<size_t>(n * words), 0);
  thread_pool().parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) round_row(x + i * K, K, reinterpret_cast<uint16_t*>(out.data() + i * words));
  });
}

// ---- packing: rows of BF16 values into [pair][row] panels ----
// 16 x 16 32-bit words transposed in registers: r[i] becomes column i.
FP_BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// dst[p * 32 + r] = word p (BF16 values 2p, 2p + 1) of rows[r] for p < words, r < 32; a null row
// is zero. 16 rows x 16 words at a time through transpose16.
FP_BF16 void pack_rows(const uint16_t* const* rows, int64_t words, uint32_t* dst) {
  for (int half = 0; half < 2; ++half) {
    const uint16_t* const* hr = rows + 16 * half;
    uint32_t* hd = dst + 16 * half;
    int64_t p = 0;
    for (; p + 16 <= words; p += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = hr[i] ? _mm512_loadu_si512(hr[i] + 2 * p) : _mm512_setzero_si512();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(hd + (p + i) * kNR, r[i]);
    }
    for (; p < words; ++p)
      for (int i = 0; i < 16; ++i) {
        uint32_t word = 0;
        if (hr[i]) std::memcpy(&word, hr[i] + 2 * p, 4);
        hd[p * kNR + i] = word;
      }
  }
}

// Rows [o0, o0 + rows) x columns [k0, k0 + kc) of the BF16 matrix w ([out][K]) packed as
// dst[p * 32 + r] = (w[o0 + r][k0 + 2p], w[o0 + r][k0 + 2p + 1]); missing rows and the pad
// column of an odd K are zero.
void pack_panel(const uint16_t* w, int64_t K, int64_t o0, int64_t rows, int64_t k0, int64_t kc, uint32_t* dst) {
  if (K % 2 == 0) {  // whole pairs (kc is even too)
    const uint16_t* row_ptrs[kNR] = {};
    for (int64_t r = 0; r < rows; ++r) row_ptrs[r] = w + (o0 + r) * K + k0;
    return pack_rows(row_ptrs, kc / 2, dst);
  }
  const int64_t pairs = (kc + 1) / 2;  // odd K: value by value, the last pair padded with zero
  std::memset(dst, 0, static_cast<size_t>(pairs * kNR) * 4);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = w + (o0 + r) * K + k0;
    for (int64_t k = 0; k < kc; ++k) reinterpret_cast<uint16_t*>(dst + (k / 2) * kNR + r)[k % 2] = row[k];
  }
}

// ---- quantized rows to BF16 (the dequantized value rounded as the activations are) ----
FP_BF16 inline void store_bf16(uint16_t* out, __m512 lo, __m512 hi) { _mm512_storeu_si512(out, as_si(_mm512_cvtne2ps_pbh(hi, lo))); }

// 8 x 8 32-bit words transposed (AVX2 registers): c[i] becomes column i.
FP_BF16 inline void transpose8(__m256i c[8]) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_castsi256_ps(c[i]);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256* q = t + 4 * h;
    r[4 * h + 0] = _mm256_shuffle_ps(q[0], q[2], 0x44);
    r[4 * h + 1] = _mm256_shuffle_ps(q[0], q[2], 0xEE);
    r[4 * h + 2] = _mm256_shuffle_ps(q[1], q[3], 0x44);
    r[4 * h + 3] = _mm256_shuffle_ps(q[1], q[3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_castps_si256(_mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
    c[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
  }
}

// Q8_0_X8 groups (8 blocks of 32): chunk c's word j holds block j's values 4c..4c+3 (+128), so
// the transposed chunks are the blocks' bytes in order; value = d_j x (u - 128).
FP_BF16 void q8_0_x8_to_bf16(const BlockQ8_0x8* g, int64_t groups, uint16_t* out) {
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t gi = 0; gi < groups; ++gi, out += QK8_0X8) {
    __m256i c[8];
    for (int i = 0; i < 8; ++i) c[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g[gi].qs + 32 * i));
    transpose8(c);
    alignas(32) float dj[8];  // the 8 blocks' scales, F16 to f32 at once
    _mm256_store_ps(dj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g[gi].d))));
    for (int j = 0; j < 8; ++j) {
      const __m512 d = _mm512_set1_ps(dj[j]);
      const __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c[j])), offset);
      const __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c[j], 1)), offset);
      store_bf16(out + 32 * j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)), _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
    }
  }
}

// Q4_K_X8 super-blocks (8 sub-blocks of 32): chunk t's word j holds sub-block j's values 4t+k
// (low nibbles) and 16+4t+k (high); value = d sc_j q - dmin m_j, in the reference's order of
// operations (product, then difference), so the f32 value is the reference's exactly. A
// sub-block has 16 values at most: they are computed once (q = 0..15) and rounded to BF16 into a
// table, which vpermw indexes by the 32 nibbles (no per-value conversion or product).
FP_BF16 void q4_k_x8_to_bf16(const BlockQ4_Kx8* b, int64_t blocks, uint16_t* out) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m512 q16 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t bi = 0; bi < blocks; ++bi, out += QK_K) {
    const BlockQ4_Kx8& q = b[bi];
    const float d = f16_to_f32(q.d), dmin = f16_to_f32(q.dmin);
    uint32_t mins_lo;
    std::memcpy(&mins_lo, q.scales + 8, 4);
    // Words (t, j) of the four chunks: after a 4 x 4 transpose in each 128-bit half, vector k
    // holds sub-block k's 16 bytes (low half) and sub-block 4 + k's (high half).
    __m256i c[4];
    for (int t = 0; t < 4; ++t) c[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.qs + 32 * t));
    const __m256i a0 = _mm256_unpacklo_epi32(c[0], c[1]), a1 = _mm256_unpackhi_epi32(c[0], c[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(c[2], c[3]), a3 = _mm256_unpackhi_epi32(c[2], c[3]);
    const __m256i v[4] = {_mm256_unpacklo_epi64(a0, a2), _mm256_unpackhi_epi64(a0, a2), _mm256_unpacklo_epi64(a1, a3),
                          _mm256_unpackhi_epi64(a1, a3)};
    for (int j = 0; j < 8; ++j) {
      const __m128i bytes = j < 4 ? _mm256_castsi256_si128(v[j]) : _mm256_extracti128_si256(v[j - 4], 1);
      const int sc = q.scales[j] & 63, m = ((q.scales[j] >> 6) << 4) | ((mins_lo >> (4 * j)) & 15);
      const __m512 d1 = _mm512_set1_ps(d * static_cast<float>(sc)), m1 = _mm512_set1_ps(dmin * static_cast<float>(m));
      const __m512i table = _mm512_zextsi256_si512(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(_mm512_mul_ps(d1, q16), m1))));
      const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), _mm_and_si128(bytes, low4));
      _mm512_storeu_si512(out + 32 * j, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nibbles), table));
    }
  }
}

// The K-quant layouts scaled per 16 values (Q3_K_X8, Q6_K_X8): the chunks assembled as the
// decode kernels do (simd_avx2.h), transposed so that vector j holds block j's 32 values in
// order; value = (d sc) (q - offset) with the scales of values 0..15 and 16..31 — Q3_K's exact in
// f32 in any order, Q6_K's in the reference's order (d sc exact, the product rounds once, as
// there). The scalar dequantizer took ~1.6 ns per Q6_K weight: half of an AMX call at 512 tokens.
template <class Block, int kOffset, void (*Chunks)(const Block&, int, __m256i*, __m256i*),
          void (*Scales)(const Block&, __m256*, __m256*)>
FP_BF16 void scaled16_x8_to_bf16(const Block* b, int64_t blocks, uint16_t* out) {
  const __m512i offset = _mm512_set1_epi32(kOffset);
  for (int64_t bi = 0; bi < blocks; ++bi, out += QK_K) {
    __m256i c[8];
    for (int t = 0; t < 4; ++t) Chunks(b[bi], t, &c[t], &c[t + 4]);
    transpose8(c);
    __m256 s_lo, s_hi;
    Scales(b[bi], &s_lo, &s_hi);
    alignas(32) float lo_scale[8], hi_scale[8];
    _mm256_store_ps(lo_scale, s_lo);
    _mm256_store_ps(hi_scale, s_hi);
    for (int j = 0; j < 8; ++j) {
      const __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c[j])), offset);
      const __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c[j], 1)), offset);
      store_bf16(out + 32 * j, _mm512_mul_ps(_mm512_set1_ps(lo_scale[j]), _mm512_cvtepi32_ps(lo)),
                 _mm512_mul_ps(_mm512_set1_ps(hi_scale[j]), _mm512_cvtepi32_ps(hi)));
    }
  }
}
constexpr auto q3_k_x8_to_bf16 = scaled16_x8_to_bf16<BlockQ3_Kx8, 4, avx2::q3_k_x8_chunks, avx2::q3_k_x8_scales>;
constexpr auto q6_k_x8_to_bf16 = scaled16_x8_to_bf16<BlockQ6_Kx8, 32, avx2::q6_k_x8_chunks, avx2::q6_k_x8_scales>;

// Q2_K_X8 super-blocks, the same way: value = (d sc) q - dmin m per 16 values (as dequant_q2_k).
FP_BF16 void q2_k_x8_to_bf16(const BlockQ2_Kx8* b, int64_t blocks, uint16_t* out) {
  for (int64_t bi = 0; bi < blocks; ++bi, out += QK_K) {
    __m256i c[8];
    for (int t = 0; t < 4; ++t) avx2::q2_k_x8_chunks(b[bi], t, &c[t], &c[t + 4]);
    transpose8(c);
    const float d = f16_to_f32(b[bi].d), dmin = f16_to_f32(b[bi].dmin);
    for (int j = 0; j < 8; ++j) {
      const uint8_t s_lo = b[bi].scales[j], s_hi = b[bi].scales[8 + j];
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c[j])));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c[j], 1)));
      store_bf16(out + 32 * j,
                 _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(s_lo & 15)), lo),
                               _mm512_set1_ps(dmin * static_cast<float>(s_lo >> 4))),
                 _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(s_hi & 15)), hi),
                               _mm512_set1_ps(dmin * static_cast<float>(s_hi >> 4))));
    }
  }
}

// Q4_0_X8 ... Q5_1_X8 groups, the same way: value = d (q - offset), or d q + m (exact d q, one
// rounding). As for Q4_K: a block's values for q = 0..31 (4 or 5 bits) rounded once into a
// table of 32 BF16 values, which vpermw indexes by the block's 32 q.
template <DType W>
FP_BF16 void block32_x8_to_bf16(const void* src, int64_t groups, uint16_t* out) {
  using Traits = avx2::Block32X8<W>;
  const auto* g = static_cast<const typename Traits::type*>(src);
  const __m512 offset = _mm512_set1_ps(static_cast<float>(Traits::kOffset));
  const __m512 q_lo = _mm512_sub_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), offset);
  const __m512 q_hi = _mm512_add_ps(q_lo, _mm512_set1_ps(16.0f));  // q - offset, exact
  for (int64_t gi = 0; gi < groups; ++gi, out += 256) {
    __m256i c[8];
    for (int t = 0; t < 4; ++t) avx2::block32_x8_chunks<W>(g[gi], t, &c[t], &c[t + 4]);
    transpose8(c);
    alignas(32) float dj[8], mj[8] = {};  // the 8 blocks' scales (and mins), F16 to f32 at once
    _mm256_store_ps(dj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g[gi].d))));
    if constexpr (Traits::kMins) _mm256_store_ps(mj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g[gi].m))));
    for (int j = 0; j < 8; ++j) {
      const __m512 d = _mm512_set1_ps(dj[j]), m = _mm512_set1_ps(mj[j]);
      const __m512i table =
          as_si(_mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_mul_ps(d, q_hi), m), _mm512_add_ps(_mm512_mul_ps(d, q_lo), m)));
      _mm512_storeu_si512(out + 32 * j, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(c[j]), table));
    }
  }
}

// IQ4_NL_X8 groups / IQ4_XS_X8 super-blocks, the same way: value = scale_j x level (one rounding).
template <class Block>
FP_BF16 void iq4_x8_to_bf16(const void* src, int64_t groups, uint16_t* out) {
  const auto* g = static_cast<const Block*>(src);
  const __m256i levels = avx2::x8_levels<Block>(false);
  for (int64_t gi = 0; gi < groups; ++gi, out += 256) {
    __m256i c[8];
    for (int t = 0; t < 4; ++t) avx2::iq4_x8_chunks(g[gi].qs, t, levels, &c[t], &c[t + 4]);
    transpose8(c);
    alignas(32) float scale[8];
    _mm256_store_ps(scale, avx2::iq4_x8_scales(g[gi]));
    for (int j = 0; j < 8; ++j) {
      const __m512 d = _mm512_set1_ps(scale[j]);
      store_bf16(out + 32 * j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c[j])))),
                 _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c[j], 1)))));
    }
  }
}

// F16 values to BF16 (through f32: exact, then rounded as the activations are), 32 at a time;
// the scalar dequantizer took ~1 ns per weight, more than the AMX products at 512 tokens.
FP_BF16 void f16_to_bf16(const uint16_t* src, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 16)));
    store_bf16(out + i, lo, hi);
  }
  for (; i < n; ++i) out[i] = f32_to_bf16_daz(f16_to_f32(src[i]));
}

// Columns [k0, k0 + kc) of a quantized (or F16) row as BF16 (kc a multiple of the block): the
// layouts the CPU loader repacks to by vector code, the others (F16 too) through the f32
// dequantizer (scratch).
void quantized_row_to_bf16(const Tensor& w, int64_t o, int64_t k0, int64_t kc, uint16_t* out, float* f32) {
  const auto& info = dtype_info(w.dtype);
  const uint8_t* src = w.row_ptr(o) + k0 / info.block_elems * info.block_bytes;
  if (w.dtype == DType::F16) return f16_to_bf16(reinterpret_cast<const uint16_t*>(src), kc, out);
  if (w.dtype == DType::Q8_0_X8) return q8_0_x8_to_bf16(reinterpret_cast<const BlockQ8_0x8*>(src), kc / QK8_0X8, out);
  if (w.dtype == DType::Q4_K_X8) return q4_k_x8_to_bf16(reinterpret_cast<const BlockQ4_Kx8*>(src), kc / QK_K, out);
  if (w.dtype == DType::Q6_K_X8) return q6_k_x8_to_bf16(reinterpret_cast<const BlockQ6_Kx8*>(src), kc / QK_K, out);
  if (w.dtype == DType::Q3_K_X8) return q3_k_x8_to_bf16(reinterpret_cast<const BlockQ3_Kx8*>(src), kc / QK_K, out);
  if (w.dtype == DType::Q2_K_X8) return q2_k_x8_to_bf16(reinterpret_cast<const BlockQ2_Kx8*>(src), kc / QK_K, out);
  // Q4_0_X8 / IQ4_NL_X8 / MXFP4_X8: a row's partial last group (core/dtype.h) through the dequantizer.
  switch (w.dtype) {
    case DType::Q4_0_X8:
      if (kc % 256 == 0) return block32_x8_to_bf16<DType::Q4_0_X8>(src, kc / 256, out);
      break;
    case DType::Q4_1_X8: return block32_x8_to_bf16<DType::Q4_1_X8>(src, kc / 256, out);
    case DType::Q5_0_X8: return block32_x8_to_bf16<DType::Q5_0_X8>(src, kc / 256, out);
    case DType::Q5_1_X8: return block32_x8_to_bf16<DType::Q5_1_X8>(src, kc / 256, out);
    case DType::IQ4_NL_X8:
      if (kc % 256 == 0) return iq4_x8_to_bf16<BlockIQ4_NLx8>(src, kc / 256, out);
      break;
    case DType::IQ4_XS_X8: return iq4_x8_to_bf16<BlockIQ4_XSx8>(src, kc / 256, out);
    case DType::MXFP4_X8:
      if (kc % 256 == 0) return iq4_x8_to_bf16<BlockMXFP4x8>(src, kc / 256, out);
      break;
    default: break;
  }
  dequantize_row(w.dtype, src, f32, kc);
  round_row(f32, kc, out);
}

// Columns per piece of a quantized panel: 32 rows of 256 BF16 values are 16 KiB, so the rows
// written by the dequantizer are still in L1 when pack_rows reads them back (a block of every
// format divides 256; kc is a multiple of the block, so the last piece is too).
constexpr int64_t kQuantPiece = 256;

// The panel of rows [o0, o0 + rows) x columns [k0, k0 + kc) of quantized weights, through BF16
// rows in scratch ([32][kQuantPiece] values) and pack_rows, a piece of columns at a time.
void pack_panel_quantized(const Tensor& w, int64_t o0, int64_t rows, int64_t k0, int64_t kc, uint32_t* dst, float* f32,
                          uint16_t* bf16) {
  const auto& info = dtype_info(w.dtype);
  const int64_t piece_bytes = kQuantPiece / info.block_elems * info.block_bytes;
  for (int64_t c0 = 0; c0 < kc; c0 += kQuantPiece) {
    const int64_t cols = std::min(kQuantPiece, kc - c0), even = (cols + 1) / 2 * 2;  // an odd F16 K: a zero pad value
    // The next piece of every row on its way into L1 while this one converts: the rows lie
    // K / 256 blocks apart, a stride the hardware prefetchers do not follow across pages, and
    // the dequantizer waited on its loads (perf: a third of its samples).
    if (c0 + kQuantPiece < kc)
      for (int64_t r = 0; r < rows; ++r) {
        const char* next = reinterpret_cast<const char*>(w.row_ptr(o0 + r)) + (k0 + c0 + kQuantPiece) / info.block_elems * info.block_bytes;
        for (int64_t b = 0; b < piece_bytes; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      }
    const uint16_t* row_ptrs[kNR] = {};
    for (int64_t r = 0; r < rows; ++r) {
      quantized_row_to_bf16(w, o0 + r, k0 + c0, cols, bf16 + r * even, f32);
      if (even != cols) bf16[r * even + cols] = 0;
      row_ptrs[r] = bf16 + r * even;
    }
    pack_rows(row_ptrs, even / 2, dst + c0 / 2 * kNR);
  }
}

// y[t][0..cols) (+)= sum over the chunk's pairs of x[t] . panel, for MR tokens.
template <int MR>
FP_BF16 void micro_kernel(const uint32_t* x, int64_t ldx, const uint32_t* pack, int64_t pairs, float* y, int64_t ldy,
                          int64_t cols, bool first, const float* bias) {
  __m512 lo[MR], hi[MR];
  for (int t = 0; t < MR; ++t) lo[t] = hi[t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = as_bh(_mm512_loadu_si512(pack + p * kNR));
    const __m512bh b1 = as_bh(_mm512_loadu_si512(pack + p * kNR + 16));
    for (int t = 0; t < MR; ++t) {
      const __m512bh a = as_bh(_mm512_set1_epi32(static_cast<int>(x[t * ldx + p])));
      lo[t] = _mm512_dpbf16_ps(lo[t], a, b0);
      hi[t] = _mm512_dpbf16_ps(hi[t], a, b1);
    }
  }
  alignas(64) float tmp[kNR];
  for (int t = 0; t < MR; ++t) {
    float* yr = y + t * ldy;
    _mm512_store_ps(tmp, lo[t]);
    _mm512_store_ps(tmp + 16, hi[t]);
    if (first) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = tmp[c] + (bias ? bias[c] : 0.0f);
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] += tmp[c];
    }
  }
}

using MicroKernel = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, int64_t, bool, const float*);
constexpr MicroKernel kMicro[kMR + 1] = {nullptr,          micro_kernel<1>, micro_kernel<2>, micro_kernel<3>, micro_kernel<4>,
                                         micro_kernel<5>, micro_kernel<6>, micro_kernel<7>, micro_kernel<8>};

// ---- a few tokens (batched decode, an MoE expert's share of a prefill): dot products ----
// sums[t * R + r] = w_r . x_t over K, the rows read in place (no packing) 32 values at a time,
// each weight vector serving T tokens and each activation vector R rows. The tail of K is a
// masked load of both.
template <int R, int T>
FP_BF16 void dot_tile(const uint16_t* const* rows, const uint16_t* x, int64_t ldx, int64_t K, float* sums) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    for (int r = 0; r < R; ++r)  // each row's next line, 2 KiB ahead (the hardware prefetchers lag a kernel that computes)
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + k) + 2048, _MM_HINT_T0);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = as_bh(_mm512_loadu_si512(rows[r] + k));
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(x + t * ldx + k));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  if (k < K) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = as_bh(_mm512_maskz_loadu_epi16(m, rows[r] + k));
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_maskz_loadu_epi16(m, x + t * ldx + k));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  alignas(64) float lanes[16];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      _mm512_store_ps(lanes, acc[r][t]);
      float v = 0;
      for (float l : lanes) v += l;
      sums[t * R + r] = v;
    }
}

using DotTile = void (*)(const uint16_t* const*, const uint16_t*, int64_t, int64_t, float*);
template <int R>
constexpr DotTile kDotRow[5] = {nullptr, dot_tile<R, 1>, dot_tile<R, 2>, dot_tile<R, 3>, dot_tile<R, 4>};
constexpr const DotTile* kDot[5] = {nullptr, kDotRow<1>, kDotRow<2>, kDotRow<3>, kDotRow<4>};

void matmul_bf16_few(const MatMulArgs& a, const cpu::AlignedVector<uint32_t>& xb, int64_t words) {
  const int64_t K = a.w->cols(), ldx = 2 * words;
  const auto* w = static_cast<const uint16_t*>(a.w->data);
  const auto* x = reinterpret_cast<const uint16_t*>(xb.data());
  cpu::row_token_tiles(a, [&](int R, int T, int64_t o, int64_t i, float* sums) {
    const uint16_t* rows[4];
    for (int r = 0; r < R; ++r) rows[r] = w + (o + r) * K;
    kDot[R][T](rows, x + i * ldx, ldx, K, sums);
  });
}

void matmul_bf16(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), words = (K + 1) / 2;
  cpu::AlignedVector<uint32_t> xb;
  round_activations(a.x, a.n, K, xb);
  if (a.n <= kFewTokens) return matmul_bf16_few(a, xb, words);
  const auto* wd = static_cast<const uint16_t*>(w.data);
  const bool converted = w.dtype != DType::BF16;  // F16 or quantized: to BF16 as packed
  const int64_t group_rows = kNR * kPanels, groups = (out + group_rows - 1) / group_rows;
  thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    auto& pack = scratch_buffer<uint32_t, 1>(static_cast<size_t>(kPanels * (kKC / 2) * kNR));
    auto& f32 = scratch_buffer<float, 2>(converted ? static_cast<size_t>(kQuantPiece) : 0);
    auto& bf16 = scratch_buffer<uint16_t, 3>(converted ? static_cast<size_t>(kNR * kQuantPiece) : 0);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o_begin = g * group_rows, o_end = std::min(out, o_begin + group_rows);
      const int64_t panels = (o_end - o_begin + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t kc = std::min(kKC, K - k0), pairs = (kc + 1) / 2;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t o0 = o_begin + p * kNR;
          if (converted)
            pack_panel_quantized(w, o0, std::min(kNR, o_end - o0), k0, kc, pack.data() + p * (kKC / 2) * kNR, f32.data(),
                                 bf16.data());
          else
            pack_panel(wd, K, o0, std::min(kNR, o_end - o0), k0, kc, pack.data() + p * (kKC / 2) * kNR);
        }
        for (int64_t i0 = 0; i0 < a.n; i0 += kMR) {
          const int64_t mr = std::min(kMR, a.n - i0);
          for (int64_t p = 0; p < panels; ++p) {
            const int64_t o0 = o_begin + p * kNR;
            kMicro[mr](xb.data() + i0 * words + k0 / 2, words, pack.data() + p * (kKC / 2) * kNR, pairs, a.y + i0 * out + o0,
                       out, std::min(kNR, o_end - o0), k0 == 0, a.bias ? a.bias + o0 : nullptr);
          }
        }
      }
    }
  });
}

// ---- AMX: the packed panels through tile matrix multiplies ----
// Tiles 0-3: the 2 x 2 blocks of 16 tokens x 16 rows of f32 sums; 4-5: 16 tokens x 32 BF16
// activations; 6-7: 16 pairs x 16 rows of the panel (amx_tiles.h: every tile 16 rows of 64 bytes).
FP_AMX void amx_configure() { _tile_loadconfig(&cpu::kAmxTiles); }

constexpr int64_t kAmxTokens = 32;  // tokens per block: two A tiles
constexpr int64_t kAmxPairs = 16;   // pairs per tile step: a B tile's rows
#ifndef FP_AMX_KC
#define FP_AMX_KC 4096
#endif
// K chunk, in columns: the C tiles are loaded and stored once per chunk, so long chunks won
// (1B prefill: 256 columns 0.8x, 1024 1.15x, 4096 1.25x the speed of 512); the group's four
// panels of 4096 columns take 1 MiB of L2.
constexpr int64_t kAmxKC = FP_AMX_KC;

// c[t][r] for 32 tokens x 32 rows (row stride ldc floats) = c (or the bias rows `init`, on the
// first chunk) + x[t] . panel over `steps` x 16 pairs. x holds, per step, the 32 tokens' 16
// pairs in a row (2 KiB: both A tiles, contiguous); the panel 32 words per pair. `ahead`
// (optional): ahead_lines cache lines from there per step prefetched into L2.
FP_AMX void amx_block(const uint32_t* x, const uint32_t* pack, int64_t steps, float* c, int64_t ldc, const float* init,
                      const char* ahead, int64_t ahead_lines) {
  // GCC's tile load and store intrinsics are asm statements that do not name the memory they
  // read and write: the barriers keep every store to the operands before them, every read of
  // the sums after.
  asm volatile("" ::: "memory");
  const int64_t sc = ldc * 4;
  if (init) {  // 16 copies of the bias row (or zeros), stride 32 floats
    _tile_loadd(0, init, 128);
    _tile_loadd(1, init + 16, 128);
    _tile_loadd(2, init, 128);
    _tile_loadd(3, init + 16, 128);
  } else {
    _tile_loadd(0, c, sc);
    _tile_loadd(1, c + 16, sc);
    _tile_loadd(2, c + 16 * ldc, sc);
    _tile_loadd(3, c + 16 * ldc + 16, sc);
  }
  for (int64_t s = 0; s < steps; ++s) {
    const uint32_t* xs = x + s * kAmxTokens * kAmxPairs;
    const uint32_t* ps = pack + s * kAmxPairs * kNR;
    // The next step's operands (2 KiB each, from L2) into L1 while this step's products run: a
    // tile load waits for its data, and the hardware prefetchers do not run ahead of it (1B
    // prefill 512: 1.29x; two steps ahead or one operand only gained less, bench/RESULTS.md).
    if (s + 1 < steps)
      for (int line = 0; line < 32; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(xs + kAmxTokens * kAmxPairs) + 64 * line, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ps + kAmxPairs * kNR) + 64 * line, _MM_HINT_T0);
      }
    if (ahead)
      for (int64_t line = 0; line < ahead_lines; ++line) _mm_prefetch(ahead + (s * ahead_lines + line) * 64, _MM_HINT_T2);
    _tile_loadd(4, xs, kAmxPairs * 4);
    _tile_loadd(5, xs + 16 * kAmxPairs, kAmxPairs * 4);
    _tile_loadd(6, ps, kNR * 4);
    _tile_loadd(7, ps + 16, kNR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  _tile_stored(1, c + 16, sc);
  _tile_stored(2, c + 16 * ldc, sc);
  _tile_stored(3, c + 16 * ldc + 16, sc);
  asm volatile("" ::: "memory");
}

FP_AMX void amx_release() { _tile_release(); }

// As matmul_bf16's panel path, with the activations laid out as the A tiles read them: per
// block of 32 tokens and step of 16 pairs, the 32 rows of 64 bytes in a row (tokens padded to a
// multiple of 32 and pairs to a multiple of 16 with zeros, as are the panels' pad pairs, so
// that every tile is whole). Rows of a token-major matrix K values apart fell in few L1 sets
// and left the tile loads waiting. A block of sums that is not whole (the last tokens, the last
// rows) goes through a 32 x 32 scratch block.
void matmul_amx(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), words = (K + 1) / 2;
  const int64_t all_steps = (words + kAmxPairs - 1) / kAmxPairs;
  const int64_t blocks = (a.n + kAmxTokens - 1) / kAmxTokens;
  const int64_t block_words = all_steps * kAmxTokens * kAmxPairs;  // one token block, every step
  auto& xb = scratch_buffer<uint32_t, 0>(static_cast<size_t>(blocks * block_words));
  const int64_t pad_tokens = blocks * kAmxTokens - a.n;  // the last block's missing tokens are zeros
  for (int64_t s = 0; pad_tokens > 0 && s < all_steps; ++s)
    std::memset(xb.data() + (blocks - 1) * block_words + (s * kAmxTokens + kAmxTokens - pad_tokens) * kAmxPairs, 0,
                static_cast<size_t>(pad_tokens * kAmxPairs) * 4);
  thread_pool().parallel_for(a.n, 1, [&](int64_t i0, int64_t i1) {
    std::vector<uint32_t> row(static_cast<size_t>(all_steps * kAmxPairs), 0);
    for (int64_t i = i0; i < i1; ++i) {
      round_row(a.x + i * K, K, reinterpret_cast<uint16_t*>(row.data()));
      uint32_t* dst = xb.data() + (i / kAmxTokens) * block_words + (i % kAmxTokens) * kAmxPairs;
      for (int64_t s = 0; s < all_steps; ++s)
        std::memcpy(dst + s * kAmxTokens * kAmxPairs, row.data() + s * kAmxPairs, kAmxPairs * 4);
    }
  });
  const auto* wd = static_cast<const uint16_t*>(w.data);
  const bool converted = w.dtype != DType::BF16;  // F16 or quantized: to BF16 as packed
  const int64_t group_rows = kNR * kPanels, groups = (out + group_rows - 1) / group_rows;
  thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    amx_configure();  // the tile configuration is each thread's own
    auto& pack = scratch_buffer<uint32_t, 1>(static_cast<size_t>(kPanels * (kAmxKC / 2) * kNR));
    auto& f32 = scratch_buffer<float, 2>(converted ? static_cast<size_t>(kQuantPiece) : 0);
    auto& bf16 = scratch_buffer<uint16_t, 3>(converted ? static_cast<size_t>(kNR * kQuantPiece) : 0);
    alignas(64) float init[kPanels][16 * kNR];  // per panel, 16 copies of its bias row (first chunk)
    alignas(64) float scratch[kAmxTokens * kNR];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o_begin = g * group_rows, o_end = std::min(out, o_begin + group_rows);
      const int64_t panels = (o_end - o_begin + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kAmxKC) {
        const int64_t kc = std::min(kAmxKC, K - k0), pairs = (kc + 1) / 2;
        const int64_t steps = (pairs + kAmxPairs - 1) / kAmxPairs;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t o0 = o_begin + p * kNR;
          if (k0 == 0)  // once per panel, not per token block: the fill took 6% of a 1B prefill
            for (int64_t r = 0; r < 16; ++r)
              for (int64_t col = 0; col < kNR; ++col)
                init[p][r * kNR + col] = a.bias && o0 + col < o_end ? a.bias[o0 + col] : 0.0f;
          uint32_t* dst = pack.data() + p * (kAmxKC / 2) * kNR;
          if (converted)
            pack_panel_quantized(w, o0, std::min(kNR, o_end - o0), k0, kc, dst, f32.data(), bf16.data());
          else
            pack_panel(wd, K, o0, std::min(kNR, o_end - o0), k0, kc, dst);
          std::memset(dst + pairs * kNR, 0, static_cast<size_t>((steps * kAmxPairs - pairs) * kNR) * 4);
        }
        // Token blocks outer: a block's activations (32 tokens x the chunk) serve every panel
        // of the group from L2 before the next block's are read.
        for (int64_t i0 = 0; i0 < a.n; i0 += kAmxTokens) {
          const int64_t rows = std::min(kAmxTokens, a.n - i0);
          const uint32_t* xs = xb.data() + (i0 / kAmxTokens) * block_words + (k0 / 2 / kAmxPairs) * kAmxTokens * kAmxPairs;
          for (int64_t p = 0; p < panels; ++p) {
            const int64_t o0 = o_begin + p * kNR, cols = std::min(kNR, o_end - o0);
            const float* first = k0 == 0 ? init[p] : nullptr;
            const uint32_t* ps = pack.data() + p * (kAmxKC / 2) * kNR;
            float* y = a.y + i0 * out + o0;
            // The next token block's share of the chunk on its way into L2 while this block
            // computes, spread over the group's panels: a tile load that misses L2 waits for
            // each of its 16 lines, and the first panel of every block read its activations from
            // L3 (alone: 1.04-1.14x at 512 tokens, a 1B BF16 prefill 1.03x; bench/RESULTS.md).
            const char* ahead = nullptr;
            const int64_t ahead_lines = (kAmxTokens * kAmxPairs * 4 / 64 + panels - 1) / panels;
            if (i0 + kAmxTokens < a.n) ahead = reinterpret_cast<const char*>(xs + block_words) + p * steps * ahead_lines * 64;
            if (rows == kAmxTokens && cols == kNR) {
              amx_block(xs, ps, steps, y, out, first, ahead, ahead_lines);
              continue;
            }
            if (!first)
              for (int64_t t = 0; t < rows; ++t) std::memcpy(scratch + t * kNR, y + t * out, static_cast<size_t>(cols) * 4);
            amx_block(xs, ps, steps, scratch, kNR, first, ahead, ahead_lines);
            for (int64_t t = 0; t < rows; ++t) std::memcpy(y + t * out, scratch + t * kNR, static_cast<size_t>(cols) * 4);
          }
        }
      }
    }
    amx_release();
  });
}

// What both BF16-product kernels need of the weights: BF16, or F16 or a quantized format (every
// GGUF block format and its repacked forms), converted and rounded to BF16 as they are packed.
std::string refuse_weights(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (t != DType::BF16 && t != DType::F16 && !dtype_info(t).quantized)
    return std::string("only BF16, F16 and quantized weights (these are ") + dtype_name(t) + ")";
  if (a.w->block_scale) return "block-scaled weights";
  if (!a.w->is_contiguous()) return "non-contiguous weights";
  return {};
}

std::string refuse_bf16(const MatMulArgs& a) {
  static const std::string cpu = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"});
  if (!cpu.empty()) return cpu;
  if (dtype_info(a.w->dtype).quantized && a.n <= kQuantizedMinTokens)
    return "quantized weights of up to 256 tokens: the integer kernels (converting them to BF16 would not pay)";
  if (a.w->dtype == DType::F16 && a.n <= kFewTokens)
    return "F16 weights of up to 32 tokens: the dot tiles read BF16 rows only (avx512 multiplies F16 in f32)";
  return refuse_weights(a);
}

// Timed against the candidates below it (registry.h): whether the BF16 panels beat the integer
// tiles on quantized prefill depends on the core, not on its features (1.4-1.6x faster on Zen 4,
// 0.4x on Sapphire Rapids; bench/RESULTS.md), so the first call of each class times them. BF16
// and F16 weights are not timed: the rival there (avx512) multiplies in f32, and a race between
// the two precisions let each process (each rank of a split model) pick its own numbers (a BF16
// Qwen3-MoE split across two ranks differed from one rank by 0.3-0.4%); the BF16 products stream
// the weights faster (27 vs 21 GB/s) and multiply at twice the rate, so they keep their rank.
bool timed_for_quantized(const MatMulArgs& a) { return dtype_info(a.w->dtype).quantized; }
const bool registered = register_kernel(Kernel<MatMulArgs>{.name = "avx512bf16",
                                                           .priority = 210,
                                                           .refuse = refuse_bf16,
                                                           .run = matmul_bf16,
                                                           .timed = true,
                                                           .timed_for = timed_for_quantized});

std::string refuse_amx(const MatMulArgs& a) {
  static const std::string cpu = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"});
  if (!cpu.empty()) return cpu;
  if (!amx_tile_permission().empty()) return amx_tile_permission();
  // BF16 weights from 9 tokens on (the gemm32 class, timed against the dot tiles): with
  // cache-line-aligned operands a padded 32-token block already beat them at 12 and 16 tokens
  // (1.2-3x, 1-2 threads, bench/RESULTS.md). Quantized weights from 33 on: below, the integer
  // kernels won (0.35-0.5x at 12 and 16 tokens, level at 32). F16 weights from 33 on too: AMX
  // was faster from 16 tokens, but rounding them to BF16 is not the same product as avx512's
  // f32 one, and decode (batched or not) keeps F16's precision; ranks that race on their own
  // must not land on kernels of different precision for one step (tests/mpi's F16 layouts did).
  if (a.n <= kAmxMinTokensBf16) return "up to 8 tokens: the AVX512-BF16 dot tiles (a 32-token AMX block would be mostly padding)";
  if (dtype_info(a.w->dtype).quantized && a.n <= kFewTokens)
    return "quantized weights of up to 32 tokens: the integer kernels (faster here)";
  if (a.w->dtype == DType::F16 && a.n <= kFewTokens)
    return "F16 weights of up to 32 tokens: avx512 multiplies them in f32 (decode keeps F16's precision)";
  // Quantized weights too from 33 tokens on (where the AVX512-BF16 panels wait for 257): timed
  // against the integer tiles, AMX won at 64 tokens already (0.29 vs 0.38-0.58 ms, Sapphire Rapids).
  return refuse_weights(a);
}

// Timed too: ranked first, it races avx512bf16 and the integer tiles below it.
const bool amx_registered = register_kernel(Kernel<MatMulArgs>{
    .name = "amxbf16", .priority = 220, .refuse = refuse_amx, .run = matmul_amx, .timed = true});

}  // namespace
}  // namespace fp
