// kernels/cpu/matmul_interleave.cpp — packing into the interleaved-block layout and the
// row-block / token-tile loop shared by the integer prefill kernels (see the header).
#include "kernels/cpu/matmul_interleave.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/simd_avx2.h"

namespace fp::cpu {

bool partial_group_ok(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL ||
         t == DType::MXFP4 || t == DType::Q4_0_X8 || t == DType::IQ4_NL_X8 || t == DType::MXFP4_X8;
}

bool interleaved_supported(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  const int64_t K = a.w->cols();
  const bool k_ok = K % 256 == 0 || (partial_group_ok(t) && K % 32 == 0);
  return (t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q3_K ||
          t == DType::Q4_K || t == DType::Q4_K_X8 || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q6_K_X8 || is_block32_x8(t) ||
          t == DType::Q3_K_X8 || t == DType::IQ4_XS_X8 || t == DType::IQ4_NL || t == DType::MXFP4) &&
         k_ok && !a.w->block_scale;
}

bool packed_has_mins(DType t) {
  return t == DType::Q4_K || t == DType::Q4_K_X8 || t == DType::Q5_K || t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_1_X8 ||
         t == DType::Q5_1_X8;
}

bool k_quant_activations(DType t) {
  return t == DType::Q2_K_X8 || t == DType::Q3_K || t == DType::Q3_K_X8 || t == DType::Q4_K || t == DType::Q4_K_X8 || t == DType::Q5_K || t == DType::Q6_K ||
         t == DType::Q6_K_X8;
}

// The unsigned weight values of the group's 8 blocks of 32 (block j = values 32j..32j+31 of the
// group, at q + 32j) for the formats packed through scalar code (Q4_1, Q5_0, Q5_1, Q3_K, Q5_K), with their
// scales: scale[j] (scale_hi[j] for Q3_K's second 16 values), min[j] subtracted per unit of sum(x).
// `grp`: the group's first byte.
static void unpack_group_scalar(DType type, const uint8_t* grp, uint8_t q[256], PackedW& p) {
  switch (type) {
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
      for (int j = 0; j < 8; ++j) {
        if (type == DType::Q4_1) {
          const BlockQ4_1& bl = reinterpret_cast<const BlockQ4_1*>(grp)[j];
          for (int k = 0; k < 16; ++k) {
            q[32 * j + k] = bl.qs[k] & 0xf;
            q[32 * j + k + 16] = static_cast<uint8_t>(bl.qs[k] >> 4);
          }
          p.scale[j] = f16_to_f32(bl.d);
          p.min[j] = -f16_to_f32(bl.m);
          continue;
        }
        if (type == DType::Q5_0) q5_values(reinterpret_cast<const BlockQ5_0*>(grp)[j].qs, reinterpret_cast<const BlockQ5_0*>(grp)[j].qh, q + 32 * j);
        else q5_values(reinterpret_cast<const BlockQ5_1*>(grp)[j].qs, reinterpret_cast<const BlockQ5_1*>(grp)[j].qh, q + 32 * j);
        if (type == DType::Q5_0) {
          p.scale[j] = f16_to_f32(reinterpret_cast<const BlockQ5_0*>(grp)[j].d);
          p.min[j] = 0;  // the -16 offset is the activations' init
        } else {
          p.scale[j] = f16_to_f32(reinterpret_cast<const BlockQ5_1*>(grp)[j].d);
          p.min[j] = -f16_to_f32(reinterpret_cast<const BlockQ5_1*>(grp)[j].m);
        }
      }
      return;
    case DType::Q5_K: {
      const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(grp);
      const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
      q5_k_values(b, q);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        q4k_scale_min(j, b.scales, &sc, &m);
        p.scale[j] = d * static_cast<float>(sc);
        p.min[j] = dmin * static_cast<float>(m);
      }
      return;
    }
    case DType::Q3_K: {  // values q - 4, q = low 2 bits | hmask bit << 2 (0..7); 16-value scales
      const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(grp);
      const float d = f16_to_f32(b.d);
      q3_k_values(b, q);
      int8_t sc[16];
      q3_k_scales(b.scales, sc);
      for (int j = 0; j < 8; ++j) {  // block j's two 16-value groups
        p.scale[j] = d * static_cast<float>(sc[2 * j]);
        p.scale_hi[j] = d * static_cast<float>(sc[2 * j + 1]);
      }
      return;
    }
    default: fail("unpack_group_scalar: ", dtype_name(type));
  }
}

// dst lane j, chunk c  <-  block j, bytes 4c..4c+3 (the scalar form, used for activations)
static void interleave(const uint8_t blocks[8][32], uint8_t* dst) {
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j) std::memcpy(dst + c * 32 + j * 4, blocks[j] + 4 * c, 4);
}

// The same for weights, in registers: rows[j] holds block j's 32 bytes; an 8x8 transpose of
// 32-bit words leaves chunk c of every block in out[c]. Weights are packed on every GEMM call,
// so this runs once per weight byte per call and must cost far less than the dot products.
#define FP_PACK_TARGET __attribute__((target("avx2,fma,f16c")))
FP_PACK_TARGET static inline void transpose_store(const __m256i rows[8], uint8_t* dst) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(rows[2 * k], rows[2 * k + 1]);      // chunks 0,1 | 4,5 of blocks 2k, 2k+1
    t[2 * k + 1] = _mm256_unpackhi_epi32(rows[2 * k], rows[2 * k + 1]);  // chunks 2,3 | 6,7
  }
  for (int h = 0; h < 2; ++h) {  // h = 0: blocks 0-3, h = 1: blocks 4-7
    const __m256i* q = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(q[0], q[2]);  // chunk 0 | 4
    u[4 * h + 1] = _mm256_unpackhi_epi64(q[0], q[2]);  // chunk 1 | 5
    u[4 * h + 2] = _mm256_unpacklo_epi64(q[1], q[3]);  // chunk 2 | 6
    u[4 * h + 3] = _mm256_unpackhi_epi64(q[1], q[3]);  // chunk 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * c), _mm256_permute2x128_si256(u[c], u[4 + c], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (c + 4)), _mm256_permute2x128_si256(u[c], u[4 + c], 0x31));
  }
}

FP_PACK_TARGET static inline __m256 f16x8(const uint16_t h[8]) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Group g of an _X8 row of a 32-value format: its chunks, scales and (negated) minimums as they are.
template <DType W>
FP_PACK_TARGET static void pack_block32_x8_group(const uint8_t* grp, PackedW& p) {
  const auto& b = *reinterpret_cast<const typename avx2::Block32X8<W>::type*>(grp);
  for (int c = 0; c < 4; ++c) {
    __m256i lo, hi;
    avx2::block32_x8_chunks<W>(b, c, &lo, &hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * c), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * (c + 4)), hi);
  }
  _mm256_storeu_ps(p.scale, avx2::block32_x8_scales<W>(b));
  _mm256_storeu_ps(p.min, _mm256_sub_ps(_mm256_setzero_ps(), avx2::block32_x8_mins<W>(b)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
}

// IQ4_NL_X8 / IQ4_XS_X8 / MXFP4_X8: the levels + 128 (MXFP4's + 12: avx2::x8_levels), unsigned as
// vpdpbusd and vpmaddubsw take them (the activations' init, -offset x sum(x), takes the offset back),
// and the blocks' scales.
template <class Block>
FP_PACK_TARGET static void pack_iq4_x8_group(const uint8_t* grp, PackedW& p) {
  const Block& b = *reinterpret_cast<const Block*>(grp);
  const __m256i levels = avx2::x8_levels<Block>(true);
  for (int c = 0; c < 4; ++c) {
    __m256i lo, hi;
    avx2::iq4_x8_chunks(b.qs, c, levels, &lo, &hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * c), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * (c + 4)), hi);
  }
  _mm256_storeu_ps(p.scale, avx2::iq4_x8_scales(b));
  _mm256_storeu_ps(p.min, _mm256_setzero_ps());
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
}

// Q6_K_X8 / Q3_K_X8 (already interleaved): chunks t and t + 4 from vector t, the scales of each
// block's two 16-value halves (scale, scale_hi).
template <class Block>
FP_PACK_TARGET static void pack_two_scale_x8_group(const uint8_t* grp, PackedW& p) {
  const Block& b = *reinterpret_cast<const Block*>(grp);
  for (int t = 0; t < 4; ++t) {
    __m256i lo, hi;
    if constexpr (std::is_same_v<Block, BlockQ6_Kx8>) avx2::q6_k_x8_chunks(b, t, &lo, &hi);
    else avx2::q3_k_x8_chunks(b, t, &lo, &hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * t), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * (t + 4)), hi);
  }
  __m256 s_lo, s_hi;
  if constexpr (std::is_same_v<Block, BlockQ6_Kx8>) avx2::q6_k_x8_scales(b, &s_lo, &s_hi);
  else avx2::q3_k_x8_scales(b, &s_lo, &s_hi);
  _mm256_storeu_ps(p.scale, s_lo);
  _mm256_storeu_ps(p.scale_hi, s_hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
}

// One group of 256 values of a row of `type`, starting at `grp`.
FP_PACK_TARGET static void pack_group(DType type, const uint8_t* grp, PackedW& p) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256i rows[8];
  uint16_t h[8];
  if (type == DType::Q8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(grp);
    for (int j = 0; j < 8; ++j) {
      rows[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[j].qs));
      h[j] = b[j].d;
    }
    transpose_store(rows, p.q);
    // Sum of each block's signed bytes: chunk vectors hold block j in lane j, so the lanes add up.
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      __m256i chunk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.q + 32 * c));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, chunk), ones16));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    _mm256_storeu_ps(p.scale, f16x8(h));
    _mm256_storeu_ps(p.min, _mm256_setzero_ps());
  } else if (type == DType::Q4_0) {
    const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(grp);
    for (int j = 0; j < 8; ++j) {
      __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs));
      __m256i qq = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
      rows[j] = _mm256_and_si256(qq, m4);  // low nibbles = elements 0..15, high = 16..31
      h[j] = b[j].d;
    }
    transpose_store(rows, p.q);
    _mm256_storeu_ps(p.scale, f16x8(h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
    _mm256_storeu_ps(p.min, _mm256_setzero_ps());
  } else if (type == DType::Q6_K) {
    // Value 32j + v of the super-block (block j) is 6 bits: 4 from ql, 2 from qh. Per half of
    // 128 values: ql0/ql1's low nibbles are values 0..31 / 32..63, their high nibbles 64..95 /
    // 96..127, each with the qh bits at offset 0, 2, 4, 6.
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(grp);
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * half));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * half + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * half));
      const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
        rows[4 * half + k] = _mm256_or_si256(lows[k], _mm256_slli_epi16(high, 4));
      }
    }
    transpose_store(rows, p.q);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 8; ++j) {
      p.scale[j] = d * static_cast<float>(b.scales[2 * j]);
      p.scale_hi[j] = d * static_cast<float>(b.scales[2 * j + 1]);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
  } else if (type == DType::Q6_K_X8) {  // already interleaved: chunks t and t + 4 from ql / qh vector t
    pack_two_scale_x8_group<BlockQ6_Kx8>(grp, p);
  } else if (type == DType::Q4_K_X8) {  // already interleaved: chunk c's nibbles are chunks c and c + 4
    const BlockQ4_Kx8& b = *reinterpret_cast<const BlockQ4_Kx8*>(grp);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * c), _mm256_and_si256(q, m4));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.q + 32 * (c + 4)), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    }
    __m256 scale, min;
    avx2::q4_k_x8_scales_mins(b, &scale, &min);
    _mm256_storeu_ps(p.scale, scale);
    _mm256_storeu_ps(p.min, min);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
  } else if (type == DType::Q3_K_X8) {  // already interleaved, as Q6_K_X8
    pack_two_scale_x8_group<BlockQ3_Kx8>(grp, p);
  } else if (type == DType::IQ4_NL_X8) {
    pack_iq4_x8_group<BlockIQ4_NLx8>(grp, p);
  } else if (type == DType::MXFP4_X8) {
    pack_iq4_x8_group<BlockMXFP4x8>(grp, p);
  } else if (type == DType::IQ4_XS_X8) {
    pack_iq4_x8_group<BlockIQ4_XSx8>(grp, p);
  } else if (is_block32_x8(type)) {  // already interleaved (Q4_0_X8 ... Q5_1_X8)
    switch (type) {
      case DType::Q4_0_X8: pack_block32_x8_group<DType::Q4_0_X8>(grp, p); break;
      case DType::Q4_1_X8: pack_block32_x8_group<DType::Q4_1_X8>(grp, p); break;
      case DType::Q5_0_X8: pack_block32_x8_group<DType::Q5_0_X8>(grp, p); break;
      default: pack_block32_x8_group<DType::Q5_1_X8>(grp, p);
    }
  } else if (type != DType::Q4_K) {  // the formats unpacked by scalar code
    uint8_t q[256];
    unpack_group_scalar(type, grp, q, p);
    for (int j = 0; j < 8; ++j) rows[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j));
    transpose_store(rows, p.q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
  } else {  // Q4_K: sub-block 2i = low nibbles of qs[32i..], 2i+1 = high nibbles
    const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(grp);
    for (int i = 0; i < 4; ++i) {
      __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * i));
      rows[2 * i] = _mm256_and_si256(q, m4);
      rows[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    transpose_store(rows, p.q);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = b.scales[j] & 63;
      m[j] = b.scales[j + 4] & 63;
      sc[j + 4] = static_cast<uint8_t>((b.scales[j + 8] & 0xf) | ((b.scales[j] >> 6) << 4));
      m[j + 4] = static_cast<uint8_t>((b.scales[j + 8] >> 4) | ((b.scales[j + 4] >> 6) << 4));
    }
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
      p.scale[j] = d * sc[j];
      p.min[j] = dmin * m[j];
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
  }
}

// IQ4_NL / MXFP4 in the file layout: each block's nibbles as the unsigned levels (as pack_iq4_x8_group),
// then the 8x8 word transpose; the scales from the blocks' f16 d / E8M0 bytes.
template <class Block>
FP_PACK_TARGET static void pack_nl_group(const uint8_t* grp, PackedW& p) {
  constexpr bool kMx = std::is_same_v<Block, BlockMXFP4>;
  const Block* b = reinterpret_cast<const Block*>(grp);
  const __m256i levels = kMx ? avx2::mxfp4_levels(true) : avx2::iq4_levels(true), m4 = _mm256_set1_epi8(0x0f);  // unsigned
  __m256i rows[8];
  for (int j = 0; j < 8; ++j) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs));
    rows[j] = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4));
  }
  transpose_store(rows, p.q);
  for (int j = 0; j < 8; ++j) {
    if constexpr (kMx) p.scale[j] = mxfp4_half_scale(b[j].e);
    else p.scale[j] = f16_to_f32(b[j].d);
  }
  _mm256_storeu_ps(p.min, _mm256_setzero_ps());
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.init), _mm256_setzero_si256());
}

FP_PACK_TARGET void pack_weights(const Tensor& w, int64_t o, PackedW* dst) {
  const DType type = w.dtype;
  const int64_t K = w.cols(), full = K / 256, tail = K % 256, group_bytes = row_bytes(type, 256);
  const uint8_t* row = w.row_ptr(o);
  auto pack = [](DType t, const uint8_t* grp, PackedW& p) {
    if (t == DType::IQ4_NL) pack_nl_group<BlockIQ4_NL>(grp, p);
    else if (t == DType::MXFP4) pack_nl_group<BlockMXFP4>(grp, p);
    else pack_group(t, grp, p);
  };
  for (int64_t g = 0; g < full; ++g) pack(type, row + g * group_bytes, dst[g]);
  if (tail == 0) return;
  // A row of a 32-value format that ends inside a group (partial_group_ok): its last blocks
  // zero-padded to a group, the padding's scales, minimums and offsets zeroed (the activations'
  // padding is zero too: pack_activations), so it adds exactly nothing.
  FP_CHECK(partial_group_ok(type) && tail % 32 == 0, "pack_weights: rows of ", K, " ", dtype_name(type), " values end inside a group");
  alignas(32) uint8_t last[8 * sizeof(BlockQ8_0)] = {};
  FP_CHECK(group_bytes <= static_cast<int64_t>(sizeof last), "pack_weights: ", dtype_name(type), " groups of ", group_bytes, " bytes");
  // Q4_0_X8 / IQ4_NL_X8 / MXFP4_X8 rows end in a partial group: back to plain blocks first.
  if (is_block32_x8(type)) unpack_block32_x8_tail(type, row + full * group_bytes, last, tail / 32);
  else std::memcpy(last, row + full * group_bytes, static_cast<size_t>(row_bytes(type, tail)));
  PackedW& p = dst[full];
  pack(block32_base(type), last, p);
  for (int64_t j = tail / 32; j < 8; ++j) {
    p.scale[j] = p.min[j] = 0;
    p.init[j] = 0;
  }
}

void pack_activations(DType wtype, const float* x, const BlockQ8_0* xq, int64_t K, PackedX* dst) {
  const int64_t groups = interleaved_groups(K), blocks32 = K / QK8_0;
  wtype = block32_base(wtype);  // Q4_0_X8 ... Q5_1_X8 dot the same activations as their file formats
  const bool iq4 = wtype == DType::IQ4_NL || wtype == DType::IQ4_XS || wtype == DType::IQ4_XS_X8, mxfp4 = wtype == DType::MXFP4;
  uint8_t blocks[8][32];
  if (k_quant_activations(wtype)) {  // (rows a multiple of 256)
    std::vector<BlockQ8_K> q(static_cast<size_t>(groups));
    quantize_act_q8_k(x, q.data(), K);
    // Q6_K / Q3_K weights are q - 32 / q - 4: the offset's share starts each half.
    const int offset = wtype == DType::Q6_K || wtype == DType::Q6_K_X8 ? 32 : wtype == DType::Q3_K || wtype == DType::Q3_K_X8 ? 4 : 0;
    for (int64_t g = 0; g < groups; ++g) {
      PackedX& p = dst[g];
      const BlockQ8_K& b = q[static_cast<size_t>(g)];
      for (int j = 0; j < 8; ++j) {
        std::memcpy(blocks[j], b.qs + 32 * j, 32);
        p.d[j] = b.d;
        p.init[j] = -offset * b.bsums[2 * j];
        p.init_hi[j] = -offset * b.bsums[2 * j + 1];
        p.bsum[j] = b.d * static_cast<float>(b.bsums[2 * j] + b.bsums[2 * j + 1]);
        p.sum16[j] = b.bsums[2 * j];
        p.sum16[8 + j] = b.bsums[2 * j + 1];
      }
      interleave(blocks, p.q);
    }
    return;
  }
  std::vector<BlockQ8_0> own;
  if (!xq) {
    own.resize(static_cast<size_t>(blocks32));
    quantize_act_q8_0(x, own.data(), K);
    xq = own.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    PackedX& p = dst[g];
    for (int j = 0; j < 8; ++j) {
      if (g * 8 + j >= blocks32) {  // past the end of a row that ends inside the group: zeros
        std::memset(blocks[j], 0, 32);
        p.d[j] = p.bsum[j] = 0;
        p.init[j] = p.init_hi[j] = 0;
        continue;
      }
      const BlockQ8_0& b = xq[g * 8 + j];
      int32_t sum = 0;
      for (int k = 0; k < 32; ++k) {
        // Q8_0 weights are signed, so the activations become the unsigned operand (x + 128).
        blocks[j][k] = wtype == DType::Q8_0 ? static_cast<uint8_t>(b.qs[k] + 128) : static_cast<uint8_t>(b.qs[k]);
        sum += b.qs[k];
      }
      p.d[j] = f16_to_f32(b.d);
      // The unsigned weights carry an offset (Q4_0: q = w + 8, Q5_0: q = w + 16, Q8_0_X8: q = w + 128)
      // whose share of the dot product, offset x sum(x), starts the accumulator negated; Q4_1 /
      // Q5_1's minimum applies per unit of sum(x) (bsum).
      // IQ4's levels meet the integer kernels plus 128, MXFP4's plus 12 (avx2::x8_levels; the AVX2
      // row kernels dot them signed and ignore init).
      p.init[j] = wtype == DType::Q4_0             ? -8 * sum
                  : wtype == DType::Q5_0           ? -16 * sum
                  : wtype == DType::Q8_0_X8 || iq4 ? -128 * sum
                  : mxfp4                          ? -avx2::kMxfp4Offset * sum
                                                   : 0;
      p.bsum[j] = wtype == DType::Q4_1 || wtype == DType::Q5_1 ? p.d[j] * static_cast<float>(sum) : 0;
      p.init_hi[j] = 0;
    }
    interleave(blocks, p.q);
  }
}

std::vector<PackedX> pack_all_activations(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), groups = interleaved_groups(K);
  std::vector<PackedX> xp(static_cast<size_t>(a.n * groups));
  const bool q8_0_acts = !k_quant_activations(w.dtype);
  thread_pool().parallel_for(a.n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      pack_activations(w.dtype, a.x + i * K, a.xq && q8_0_acts ? a.xq + i * (K / QK8_0) : nullptr, K,
                       xp.data() + i * groups);
  });
  return xp;
}

void gemm_interleaved(const MatMulArgs& a, int rows_per_tile, int tokens_per_tile, const InterleavedTile& tile,
                      int64_t group_block) {
  FP_CHECK(rows_per_tile >= 1 && rows_per_tile <= kMaxTileRows && tokens_per_tile >= 1 && tokens_per_tile <= kMaxTileTokens,
           "gemm_interleaved: tile of ", rows_per_tile, "x", tokens_per_tile, " is out of range");
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), groups = interleaved_groups(K);
  const int64_t gb = group_block > 0 ? std::min(group_block, groups) : groups;
  const std::vector<PackedX> xp = pack_all_activations(a);
  constexpr int64_t kRows = 32;
  const int64_t kR = rows_per_tile, kT = tokens_per_tile;
  thread_pool().parallel_for((out + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    std::vector<PackedW> wp(static_cast<size_t>(kRows * groups));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t o0 = blk * kRows, rows = std::min(kRows, out - o0);
      for (int64_t r = 0; r < rows; ++r) pack_weights(w, o0 + r, wp.data() + r * groups);
      // Groups in blocks of gb: the token tile's activations of one block stay in L1 while
      // every row tile of the row block passes over them. Blocks after the first add their
      // partial sums (written by the tile to `part`, without the bias) into y.
      for (int64_t g0 = 0; g0 < groups; g0 += gb) {
        const int64_t gn = std::min(gb, groups - g0);
        for (int64_t t0 = 0; t0 < a.n; t0 += kT) {
          const int T = static_cast<int>(std::min(kT, a.n - t0));
          const PackedX* xs[kMaxTileTokens];
          for (int t = 0; t < T; ++t) xs[t] = xp.data() + (t0 + t) * groups + g0;
          for (int64_t r0 = 0; r0 < rows; r0 += kR) {
            const int R = static_cast<int>(std::min(kR, rows - r0));
            const PackedW* ws[kMaxTileRows];
            for (int r = 0; r < R; ++r) ws[r] = wp.data() + (r0 + r) * groups + g0;
            float* y = a.y + t0 * out + o0 + r0;
            if (g0 == 0) {
              tile(R, T, ws, xs, gn, y, out, a.bias ? a.bias + o0 + r0 : nullptr);
              continue;
            }
            float part[kMaxTileTokens * kMaxTileRows];
            tile(R, T, ws, xs, gn, part, R, nullptr);
            for (int t = 0; t < T; ++t)
              for (int r = 0; r < R; ++r) y[t * out + r] += part[t * R + r];
          }
        }
      }
    }
  });
}

}  // namespace fp::cpu
