// core/dtype.cpp — dtype table, scalar float conversions and the GGUF block formats'
// dequantizers and (simple, ggml-compatible layout) quantizers.
#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"

namespace fp {

const DTypeInfo& dtype_info(DType t) {
  static const DTypeInfo f32{"F32", 1, 4, false}, f16{"F16", 1, 2, false}, bf16{"BF16", 1, 2, false},
      f8{"F8_E4M3", 1, 1, false}, q8_0{"Q8_0", QK8_0, sizeof(BlockQ8_0), true},
      q4_0{"Q4_0", QK4_0, sizeof(BlockQ4_0), true}, q4_1{"Q4_1", QK5_0, sizeof(BlockQ4_1), true},
      q5_0{"Q5_0", QK5_0, sizeof(BlockQ5_0), true}, q5_1{"Q5_1", QK5_0, sizeof(BlockQ5_1), true},
      q2_k{"Q2_K", QK_K, sizeof(BlockQ2_K), true}, q3_k{"Q3_K", QK_K, sizeof(BlockQ3_K), true},
      q4_k{"Q4_K", QK_K, sizeof(BlockQ4_K), true}, q5_k{"Q5_K", QK_K, sizeof(BlockQ5_K), true},
      q6_k{"Q6_K", QK_K, sizeof(BlockQ6_K), true},
      q8_0_x8{"Q8_0_X8", QK8_0X8, sizeof(BlockQ8_0x8), true}, q4_k_x8{"Q4_K_X8", QK_K, sizeof(BlockQ4_Kx8), true},
      q6_k_x8{"Q6_K_X8", QK_K, sizeof(BlockQ6_Kx8), true}, q4_0_x8{"Q4_0_X8", 32, sizeof(BlockQ4_0), true},
      q4_1_x8{"Q4_1_X8", 256, sizeof(BlockQ4_1x8), true}, q5_0_x8{"Q5_0_X8", 256, sizeof(BlockQ5_0x8), true},
      q5_1_x8{"Q5_1_X8", 256, sizeof(BlockQ5_1x8), true}, q3_k_x8{"Q3_K_X8", QK_K, sizeof(BlockQ3_Kx8), true},
      q2_k_x8{"Q2_K_X8", QK_K, sizeof(BlockQ2_Kx8), true}, iq4_nl{"IQ4_NL", 32, sizeof(BlockIQ4_NL), true},
      mxfp4{"MXFP4", 32, sizeof(BlockMXFP4), true}, mxfp4_x8{"MXFP4_X8", 32, sizeof(BlockMXFP4), true},
      iq4_xs{"IQ4_XS", QK_K, sizeof(BlockIQ4_XS), true}, iq4_nl_x8{"IQ4_NL_X8", 32, sizeof(BlockIQ4_NL), true},
      iq4_xs_x8{"IQ4_XS_X8", QK_K, sizeof(BlockIQ4_XSx8), true}, i8{"I8", 1, 1, false}, u8{"U8", 1, 1, false}, i16{"I16", 1, 2, false},
      i32{"I32", 1, 4, false}, i64{"I64", 1, 8, false}, f64{"F64", 1, 8, false};
  switch (t) {
    case DType::F32: return f32;
    case DType::F16: return f16;
    case DType::BF16: return bf16;
    case DType::F8_E4M3: return f8;
    case DType::Q8_0: return q8_0;
    case DType::Q4_0: return q4_0;
    case DType::Q4_1: return q4_1;
    case DType::Q5_0: return q5_0;
    case DType::Q5_1: return q5_1;
    case DType::Q2_K: return q2_k;
    case DType::Q3_K: return q3_k;
    case DType::Q4_K: return q4_k;
    case DType::Q5_K: return q5_k;
    case DType::Q6_K: return q6_k;
    case DType::Q8_0_X8: return q8_0_x8;
    case DType::Q4_K_X8: return q4_k_x8;
    case DType::Q6_K_X8: return q6_k_x8;
    case DType::Q4_0_X8: return q4_0_x8;
    case DType::Q4_1_X8: return q4_1_x8;
    case DType::Q5_0_X8: return q5_0_x8;
    case DType::Q5_1_X8: return q5_1_x8;
    case DType::Q3_K_X8: return q3_k_x8;
    case DType::Q2_K_X8: return q2_k_x8;
    case DType::IQ4_NL: return iq4_nl;
    case DType::MXFP4: return mxfp4;
    case DType::MXFP4_X8: return mxfp4_x8;
    case DType::IQ4_XS: return iq4_xs;
    case DType::IQ4_NL_X8: return iq4_nl_x8;
    case DType::IQ4_XS_X8: return iq4_xs_x8;
    case DType::I8: return i8;
    case DType::U8: return u8;
    case DType::I16: return i16;
    case DType::I32: return i32;
    case DType::I64: return i64;
    case DType::F64: return f64;
  }
  fail("unknown dtype id ", static_cast<uint32_t>(t));
}

bool dtype_from_gguf(uint32_t g, DType* out) {
  switch (g) {
    case 0: case 1: case 2: case 3: case 6: case 7: case 8: case 10: case 11: case 12: case 13: case 14: case 20: case 23: case 24: case 25: case 26: case 27: case 28: case 30: case 39:
      *out = static_cast<DType>(g);
      return true;
    default:
      return false;
  }
}

bool dtype_from_name(const std::string& name, DType* out) {
  std::string up = name;
  for (auto& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up == "FP8" || up == "F8" || up == "F8_E4M3" || up == "FP8_E4M3") {
    *out = DType::F8_E4M3;
    return true;
  }
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                  DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::I8, DType::I16, DType::I32, DType::I64, DType::F64}) {
    if (up == dtype_info(t).name) {
      *out = t;
      return true;
    }
  }
  return false;
}

int64_t row_bytes(DType t, int64_t n) {
  const auto& info = dtype_info(t);
  FP_CHECK(n >= 0 && n % info.block_elems == 0, "row of ", n, " elements is not a multiple of the ", info.name,
           " block size ", info.block_elems);
  return n / info.block_elems * info.block_bytes;
}

// ---- scalars ------------------------------------------------------------------------

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while (!(mant & 0x400));
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (absx < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    // value = absx as float; f16 subnormal unit = 2^-24.
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // exact (power of two)
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t exp = ((absx >> 23) - 127 + 15);
  uint32_t mant = absx & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into exponent is correct
  return static_cast<uint16_t>(sign | h);
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

uint16_t f32_to_bf16_daz(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0) return static_cast<uint16_t>((x >> 16) & 0x8000u);
  return f32_to_bf16(f);
}

float fp8e4m3_to_f32(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // mant/8 * 2^-6
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Candidates are all non-negative codes 0..0x7e, increasing in value; find the nearest (ties to even code).
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code whose value >= a
    int mid = (lo + hi) / 2;
    if (fp8e4m3_to_f32(static_cast<uint8_t>(mid)) < a) lo = mid + 1; else hi = mid;
  }
  int code = lo;
  if (code > 0) {
    float up = fp8e4m3_to_f32(static_cast<uint8_t>(code)), down = fp8e4m3_to_f32(static_cast<uint8_t>(code - 1));
    if (a - down < up - a || (a - down == up - a && ((code - 1) & 1) == 0)) code = code - 1;
  }
  return static_cast<uint8_t>(sign | code);
}

// ---- block formats ------------------------------------------------------------------

// ---- the values of the formats with high bits apart (shared by the kernels) ----------

// The 5-bit values of a Q5_0 / Q5_1 block (0..31): the nibbles as Q4_0's, bit j of qh on top.
void q5_values(const uint8_t* qs, const uint8_t* qh_bytes, uint8_t q[32]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0xf) | (((qh >> j) & 1) << 4));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

void q5_k_values(const BlockQ5_K& b, uint8_t q[QK_K]) {
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 32; ++l)
      q[32 * s + l] = static_cast<uint8_t>(((b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xf) | (((b.qh[l] >> s) & 1) << 4));
}

void q3_k_values(const BlockQ3_K& b, uint8_t q[QK_K]) {
  for (int v = 0; v < QK_K; ++v) {
    const int low = (b.qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3, high = (b.hmask[v % 32] >> (v / 32)) & 1;
    q[v] = static_cast<uint8_t>(low | (high << 2));
  }
}

// Q3_K's 16 signed six-bit scales (-32..31).
void q3_k_scales(const uint8_t* s, int8_t out[16]) {
  for (int g = 0; g < 16; ++g) {
    const int lo = (s[g % 8] >> (4 * (g / 8))) & 0xf, hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    out[g] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

// Q4_K / Q5_K's 12 scale bytes pack 8 six-bit scales and 8 six-bit mins.
void q4k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

namespace {

void check_blocks(DType t, int64_t n) { (void)row_bytes(t, n); }

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float d = f16_to_f32(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = d * b[i].qs[j];
  }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float d = f16_to_f32(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[i * QK4_0 + j] = d * ((b[i].qs[j] & 0xf) - 8);
      y[i * QK4_0 + j + QK4_0 / 2] = d * ((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = d * (b[i].qs[j] & 0xf) + m;
      y[i * 32 + j + 16] = d * (b[i].qs[j] >> 4) + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    q5_values(b[i].qs, b[i].qh, q);
    for (int j = 0; j < 32; ++j) y[i * 32 + j] = d * (q[j] - 16);
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    q5_values(b[i].qs, b[i].qh, q);
    for (int j = 0; j < 32; ++j) y[i * 32 + j] = d * q[j] + m;
  }
}

// The 2-bit values of a Q2_K / Q3_K super-block, in order: value 128h + 32s + l is bits 2s..2s+1
// of qs[32h + l].
void k_low2_values(const uint8_t* qs, uint8_t q[QK_K]) {
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * s + l] = static_cast<uint8_t>((qs[32 * h + l] >> (2 * s)) & 3);
}

void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    k_low2_values(b[i].qs, q);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * (b[i].scales[g] & 0xf), ml = dmin * (b[i].scales[g] >> 4);
      for (int l = 0; l < 16; ++l) y[i * QK_K + 16 * g + l] = dl * q[16 * g + l] - ml;
    }
  }
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  uint8_t q[QK_K];
  int8_t sc[16];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    q3_k_values(b[i], q);
    q3_k_scales(b[i].scales, sc);
    for (int v = 0; v < QK_K; ++v) y[i * QK_K + v] = d * sc[v / 16] * (q[v] - 4);
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2) {
      uint8_t sc, m;
      q4k_scale_min(is, b[i].scales, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      q4k_scale_min(is + 1, b[i].scales, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    q5_k_values(b[i], q);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      q4k_scale_min(s, b[i].scales, &sc, &m);
      for (int l = 0; l < 32; ++l) *y++ = d * sc * q[32 * s + l] - dmin * m;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        int is = l / 16;
        int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIq4nlValues[b[i].qs[j] & 15];
      y[j + 16] = d * kIq4nlValues[b[i].qs[j] >> 4];
    }
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    for (int j = 0; j < 8; ++j, y += 32) {
      const float d = f16_to_f32(b[i].d) * static_cast<float>(iq4_xs_scale(b[i], j));
      for (int k = 0; k < 16; ++k) {
        y[k] = d * kIq4nlValues[b[i].qs[16 * j + k] & 15];
        y[k + 16] = d * kIq4nlValues[b[i].qs[16 * j + k] >> 4];
      }
    }
}

void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * QK4_0;
    float amax = 0, max = 0;
    for (int j = 0; j < QK4_0; ++j)
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      int q0 = std::min(15, static_cast<int>(v[j] * id + 8.5f));
      int q1 = std::min(15, static_cast<int>(v[j + QK4_0 / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// The IQ4 level nearest v (kIq4nlValues is ascending: a binary search over the midpoints).
int iq4_nearest(float v) {
  int lo = 0, hi = 15;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (v > 0.5f * static_cast<float>(kIq4nlValues[mid] + kIq4nlValues[mid + 1])) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// 32 values on the IQ4 levels: the scale that puts the largest magnitude on level 0 (-127), then one
// least-squares refit of the scale to the chosen levels (kept when it lowers the error). Simple, not
// ggml's search.
float iq4_block_scale(const float* v, uint8_t q[32]) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(v[j]) > amax) {
      amax = std::fabs(v[j]);
      max = v[j];
    }
  if (amax == 0) {
    std::fill(q, q + 32, static_cast<uint8_t>(8));
    return 0;
  }
  auto fit = [&](float d, uint8_t* out) {
    float err = 0;
    for (int j = 0; j < 32; ++j) {
      out[j] = static_cast<uint8_t>(iq4_nearest(v[j] / d));
      const float e = v[j] - d * kIq4nlValues[out[j]];
      err += e * e;
    }
    return err;
  };
  const float d0 = max / static_cast<float>(kIq4nlValues[0]);
  const float err0 = fit(d0, q);
  float sxv = 0, svv = 0;
  for (int j = 0; j < 32; ++j) {
    sxv += v[j] * kIq4nlValues[q[j]];
    svv += static_cast<float>(kIq4nlValues[q[j]] * kIq4nlValues[q[j]]);
  }
  const float d1 = svv > 0 ? sxv / svv : d0;
  uint8_t q1[32];
  if (d1 != 0 && fit(d1, q1) < err0) {
    std::copy(q1, q1 + 32, q);
    return d1;
  }
  return d0;
}

void store_nibbles32(const uint8_t q[32], uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

void dequant_mxfp4(const BlockMXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = mxfp4_half_scale(b[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kMxfp4Values[b[i].qs[j] & 15];
      y[j + 16] = d * kMxfp4Values[b[i].qs[j] >> 4];
    }
  }
}

// MXFP4: the shared exponent puts the block's largest magnitude in E2M1's top binade (4..6 x
// 2^(e-127)), as the OCP spec and llama.cpp choose it; each value then takes its nearest level
// (ties to the lower code: the level of smaller magnitude, or +0 over -0).
void quant_mxfp4(const float* x, BlockMXFP4* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + 32 * i;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    int e = 0;
    if (amax > 0 && std::isfinite(amax)) e = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
    b[i].e = static_cast<uint8_t>(e);
    const float d = mxfp4_half_scale(b[i].e);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
      int best = 0;
      float err = std::numeric_limits<float>::infinity();
      for (int c = 0; c < 16; ++c) {
        const float diff = std::fabs(xb[j] - d * static_cast<float>(kMxfp4Values[c]));
        if (diff < err) err = diff, best = c;
      }
      q[j] = static_cast<uint8_t>(best);
    }
    store_nibbles32(q, b[i].qs);
  }
}

void quant_iq4_nl(const float* x, BlockIQ4_NL* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t q[32];
    b[i].d = f32_to_f16(iq4_block_scale(x + 32 * i, q));
    const float d = f16_to_f32(b[i].d);  // the levels again against the stored scale
    if (d != 0)
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(iq4_nearest(x[32 * i + j] / d));
    store_nibbles32(q, b[i].qs);
  }
}

// IQ4_XS: each block's scale as IQ4_NL's, then d = the largest-magnitude one / -32 so the six-bit
// scales ls_j = round(scale_j / d) + 32 fall in 0..63, and the levels again against d * (ls_j - 32).
void quant_iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + QK_K * i;
    uint8_t q[32];
    float scale[8], amax = 0, max = 0;
    for (int j = 0; j < 8; ++j) {
      scale[j] = iq4_block_scale(v + 32 * j, q);
      if (std::fabs(scale[j]) > amax) {
        amax = std::fabs(scale[j]);
        max = scale[j];
      }
    }
    BlockIQ4_XS& out = b[i];
    out.d = f32_to_f16(max / -32.0f);
    const float d = f16_to_f32(out.d);
    out.scales_h = 0;
    std::memset(out.scales_l, 0, sizeof out.scales_l);
    for (int j = 0; j < 8; ++j) {
      const int ls = d == 0 ? 32 : std::clamp(static_cast<int>(std::lround(scale[j] / d)) + 32, 0, 63);
      out.scales_l[j / 2] |= static_cast<uint8_t>((ls & 15) << (4 * (j % 2)));
      out.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * j));
      const float dl = d * static_cast<float>(ls - 32);
      for (int k = 0; k < 32; ++k) q[k] = dl == 0 ? 8 : static_cast<uint8_t>(iq4_nearest(v[32 * j + k] / dl));
      store_nibbles32(q, out.qs + 16 * j);
    }
  }
}

// Q4_K / Q5_K: per 32-element sub-block, scale = (max - min) / (levels - 1) and min = -min (>= 0),
// both quantized to 6 bits against the super-block's d and dmin, then the values to 0..levels-1.
// Simple, not error-optimal.
void quant_k_affine(const float* v, int levels, uint16_t* d_out, uint16_t* dmin_out, uint8_t scales[12], uint8_t q[QK_K]) {
  float sub_scale[8], sub_min[8];
  for (int s = 0; s < 8; ++s) {
    float lo = v[s * 32], hi = v[s * 32];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, v[s * 32 + l]);
      hi = std::max(hi, v[s * 32 + l]);
    }
    lo = std::min(lo, 0.0f);
    sub_scale[s] = (hi - lo) / static_cast<float>(levels - 1);
    sub_min[s] = -lo;
  }
  const float max_sc = *std::max_element(sub_scale, sub_scale + 8), max_m = *std::max_element(sub_min, sub_min + 8);
  *d_out = f32_to_f16(max_sc / 63.0f);
  *dmin_out = f32_to_f16(max_m / 63.0f);
  const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
  uint8_t ls[8], lm[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = static_cast<uint8_t>(d > 0 ? std::min(63, static_cast<int>(std::lround(sub_scale[s] / d))) : 0);
    lm[s] = static_cast<uint8_t>(dmin > 0 ? std::min(63, static_cast<int>(std::lround(sub_min[s] / dmin))) : 0);
  }
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xf) | ((lm[j + 4] & 0xf) << 4));
  }
  for (int s = 0; s < 8; ++s) {
    const float sd = d * ls[s], sm = dmin * lm[s];
    for (int l = 0; l < 32; ++l) {
      const int qi = sd > 0 ? static_cast<int>(std::lround((v[s * 32 + l] + sm) / sd)) : 0;
      q[s * 32 + l] = static_cast<uint8_t>(std::clamp(qi, 0, levels - 1));
    }
  }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    quant_k_affine(x + i * QK_K, 16, &b[i].d, &b[i].dmin, b[i].scales, q);
    for (int j = 0; j < QK_K; j += 64)
      for (int l = 0; l < 32; ++l) b[i].qs[j / 2 + l] = static_cast<uint8_t>(q[j + l] | (q[j + 32 + l] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    quant_k_affine(x + i * QK_K, 32, &b[i].d, &b[i].dmin, b[i].scales, q);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[32 * s + l];
        if (s % 2 == 0) b[i].qs[32 * (s / 2) + l] = v & 0xf;
        else b[i].qs[32 * (s / 2) + l] = static_cast<uint8_t>(b[i].qs[32 * (s / 2) + l] | ((v & 0xf) << 4));
        b[i].qh[l] = static_cast<uint8_t>(b[i].qh[l] | ((v >> 4) << s));
      }
  }
}

// Q4_1 / Q5_1: per block d = (max - min) / (levels - 1), m = min, q = round((x - m) / d).
void quant_affine_block(const float* v, int levels, uint16_t* d_out, uint16_t* m_out, uint8_t q[32]) {
  const float lo = *std::min_element(v, v + 32), hi = *std::max_element(v, v + 32);
  *d_out = f32_to_f16((hi - lo) / static_cast<float>(levels - 1));
  *m_out = f32_to_f16(lo);
  const float d = f16_to_f32(*d_out), m = f16_to_f32(*m_out);
  for (int j = 0; j < 32; ++j)
    q[j] = static_cast<uint8_t>(d > 0 ? std::clamp(static_cast<int>(std::lround((v[j] - m) / d)), 0, levels - 1) : 0);
}

void store_q5_bits(const uint8_t q[32], uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

void quant_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    quant_affine_block(x + i * 32, 16, &b[i].d, &b[i].m, q);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

void quant_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    quant_affine_block(x + i * 32, 32, &b[i].d, &b[i].m, q);
    store_q5_bits(q, b[i].qs, b[i].qh);
  }
}

// Q5_0: as Q4_0, the value of largest magnitude mapped to -16.
void quant_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * 32;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    b[i].d = f32_to_f16(max / -16.0f);
    const float d = f16_to_f32(b[i].d), id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::floor(v[j] * id + 16.5f)), 0, 31));
    store_q5_bits(q, b[i].qs, b[i].qh);
  }
}

void store_k_low2(const uint8_t q[QK_K], uint8_t* qs) {
  std::memset(qs, 0, QK_K / 4);
  for (int v = 0; v < QK_K; ++v) qs[32 * (v / 128) + v % 32] = static_cast<uint8_t>(qs[32 * (v / 128) + v % 32] | ((q[v] & 3) << (2 * ((v / 32) % 4))));
}

// Q2_K: per 16-element group, scale = (max - min) / 3 and min = -min (>= 0), both to 4 bits
// against d = max scale / 15 and dmin = max min / 15.
void quant_q2_k(const float* x, BlockQ2_K* b, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * QK_K;
    float gs[16], gm[16];
    for (int g = 0; g < 16; ++g) {
      const float lo = std::min(0.0f, *std::min_element(v + 16 * g, v + 16 * g + 16)), hi = *std::max_element(v + 16 * g, v + 16 * g + 16);
      gs[g] = (hi - lo) / 3.0f;
      gm[g] = -lo;
    }
    b[i].d = f32_to_f16(*std::max_element(gs, gs + 16) / 15.0f);
    b[i].dmin = f32_to_f16(*std::max_element(gm, gm + 16) / 15.0f);
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int g = 0; g < 16; ++g) {
      const int ls = d > 0 ? std::min(15, static_cast<int>(std::lround(gs[g] / d))) : 0;
      const int lm = dmin > 0 ? std::min(15, static_cast<int>(std::lround(gm[g] / dmin))) : 0;
      b[i].scales[g] = static_cast<uint8_t>(ls | (lm << 4));
      const float sd = d * ls, sm = dmin * lm;
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<uint8_t>(sd > 0 ? std::clamp(static_cast<int>(std::lround((v[16 * g + l] + sm) / sd)), 0, 3) : 0);
    }
    store_k_low2(q, b[i].qs);
  }
}

// Q3_K: per 16-element group, scale = the value of largest magnitude / -4 (values -4..3), as a
// six-bit signed multiple of d = max |scale| / 32.
void quant_q3_k(const float* x, BlockQ3_K* b, int64_t nb) {
  uint8_t q[QK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * QK_K;
    float gs[16], amax_s = 0;
    for (int g = 0; g < 16; ++g) {
      float amax = 0, max = 0;
      for (int l = 0; l < 16; ++l)
        if (std::fabs(v[16 * g + l]) > amax) {
          amax = std::fabs(v[16 * g + l]);
          max = v[16 * g + l];
        }
      gs[g] = max / -4.0f;
      amax_s = std::max(amax_s, std::fabs(gs[g]));
    }
    b[i].d = f32_to_f16(amax_s / 32.0f);
    const float d = f16_to_f32(b[i].d);
    std::memset(b[i].scales, 0, sizeof b[i].scales);
    std::memset(b[i].hmask, 0, sizeof b[i].hmask);
    for (int g = 0; g < 16; ++g) {
      const int sc = d > 0 ? std::clamp(static_cast<int>(std::lround(gs[g] / d)), -32, 31) : 0;
      const int u = sc + 32;
      b[i].scales[g % 8] = static_cast<uint8_t>(b[i].scales[g % 8] | ((u & 0xf) << (4 * (g / 8))));
      b[i].scales[8 + g % 4] = static_cast<uint8_t>(b[i].scales[8 + g % 4] | ((u >> 4) << (2 * (g / 4))));
      const float gd = d * sc;
      for (int l = 0; l < 16; ++l) {
        const int qi = gd != 0 ? std::clamp(static_cast<int>(std::lround(v[16 * g + l] / gd)), -4, 3) : 0;
        const int v3 = 16 * g + l;
        q[v3] = static_cast<uint8_t>(qi + 4);  // 0..7: bit 2 set <=> the value is not offset by -4
        b[i].hmask[v3 % 32] = static_cast<uint8_t>(b[i].hmask[v3 % 32] | ((q[v3] >> 2) << (v3 / 32)));
      }
    }
    store_k_low2(q, b[i].qs);
  }
}

// Q6_K: per 16-element group, scale = max|x|/32 quantized to int8 against d = max scale/127.
void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * QK_K;
    float gs[16];
    for (int g = 0; g < 16; ++g) {
      float amax = 0, max = 0;
      for (int l = 0; l < 16; ++l)
        if (std::fabs(v[g * 16 + l]) > amax) {
          amax = std::fabs(v[g * 16 + l]);
          max = v[g * 16 + l];
        }
      gs[g] = max / -32.0f;
    }
    float amax_s = 0;
    for (float s : gs) amax_s = std::max(amax_s, std::fabs(s));
    float d = amax_s / 127.0f;
    b[i].d = f32_to_f16(d);
    d = f16_to_f32(b[i].d);
    uint8_t q[QK_K];
    for (int g = 0; g < 16; ++g) {
      int sc = d > 0 ? std::clamp(static_cast<int>(std::lround(gs[g] / d)), -128, 127) : 0;
      b[i].scales[g] = static_cast<int8_t>(sc);
      float gd = d * sc;
      for (int l = 0; l < 16; ++l) {
        int qi = gd != 0 ? static_cast<int>(std::lround(v[g * 16 + l] / gd)) : 0;
        q[g * 16 + l] = static_cast<uint8_t>(std::clamp(qi, -32, 31) + 32);
      }
    }
    for (int n = 0; n < QK_K; n += 128) {
      uint8_t* ql = b[i].ql + n / 2;
      uint8_t* qh = b[i].qh + n / 4;
      for (int l = 0; l < 32; ++l) {
        uint8_t q1 = q[n + l], q2 = q[n + l + 32], q3 = q[n + l + 64], q4 = q[n + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xf) | ((q3 & 0xf) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xf) | ((q4 & 0xf) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

}  // namespace

void pack_q8_0_x8(const BlockQ8_0* src, BlockQ8_0x8* dst, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) {
    BlockQ8_0 b[8];
    std::memcpy(b, src + 8 * g, sizeof b);  // a copy first: dst may overlap src
    BlockQ8_0x8& p = dst[g];
    for (int j = 0; j < 8; ++j) {
      p.d[j] = b[j].d;
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 4; ++k) p.qs[32 * c + 4 * j + k] = static_cast<uint8_t>(b[j].qs[4 * c + k] + 128);
    }
  }
}

void unpack_q8_0_x8(const BlockQ8_0x8* src, BlockQ8_0* dst, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) {
    BlockQ8_0x8 p;
    std::memcpy(&p, src + g, sizeof p);
    BlockQ8_0* b = dst + 8 * g;
    for (int j = 0; j < 8; ++j) {
      b[j].d = p.d[j];
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 4; ++k) b[j].qs[4 * c + k] = static_cast<int8_t>(p.qs[32 * c + 4 * j + k] - 128);
    }
  }
}

void pack_q4_k_x8(const BlockQ4_K* src, BlockQ4_Kx8* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ4_K b;
    std::memcpy(&b, src + i, sizeof b);  // a copy first: dst may overlap src
    BlockQ4_Kx8 p{};
    p.d = b.d;
    p.dmin = b.dmin;
    uint32_t mins_lo = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4k_scale_min(j, b.scales, &sc, &m);
      p.scales[j] = static_cast<uint8_t>(sc | (m >> 4) << 6);
      mins_lo |= static_cast<uint32_t>(m & 15) << (4 * j);
    }
    for (int k = 0; k < 4; ++k) p.scales[8 + k] = static_cast<uint8_t>(mins_lo >> (8 * k));
    // Q4_K keeps sub-block j's value v in qs[32 * (j / 2) + v]: the low nibble for even j.
    auto value = [&](int j, int v) {
      const uint8_t q = b.qs[32 * (j / 2) + v];
      return j % 2 ? q >> 4 : q & 15;
    };
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 4; ++k) p.qs[32 * t + 4 * j + k] = static_cast<uint8_t>(value(j, 4 * t + k) | value(j, 16 + 4 * t + k) << 4);
    std::memcpy(dst + i, &p, sizeof p);
  }
}

void unpack_q4_k_x8(const BlockQ4_Kx8* src, BlockQ4_K* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ4_Kx8 p;
    std::memcpy(&p, src + i, sizeof p);
    BlockQ4_K b{};
    b.d = p.d;
    b.dmin = p.dmin;
    uint32_t mins_lo = 0;
    for (int k = 0; k < 4; ++k) mins_lo |= static_cast<uint32_t>(p.scales[8 + k]) << (8 * k);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = p.scales[j] & 63;
      m[j] = static_cast<uint8_t>((p.scales[j] >> 6) << 4 | ((mins_lo >> (4 * j)) & 15));
    }
    for (int j = 0; j < 4; ++j) {  // the inverse of q4k_scale_min
      b.scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
      b.scales[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
      b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 4; ++k) {
          const uint8_t q = p.qs[32 * t + 4 * j + k];
          for (int half = 0; half < 2; ++half) {
            const int v = 16 * half + 4 * t + k, nibble = half ? q >> 4 : q & 15;
            uint8_t& dst_q = b.qs[32 * (j / 2) + v];
            dst_q = static_cast<uint8_t>(j % 2 ? (dst_q & 15) | nibble << 4 : (dst_q & 0xf0) | nibble);
          }
        }
    std::memcpy(dst + i, &b, sizeof b);
  }
}

namespace {
// The 2-bit plane of the K-quant _X8 forms (Q6_K_X8's qh, Q3_K_X8's and Q2_K_X8's qs): byte
// 32u + 4j + k holds bits `shift`..`shift`+1 of block j's values 8u + k, 16 + 8u + k, 8u + 4 + k and
// 16 + 8u + 4 + k (q: the super-block's 256 values in order) at bits 0, 2, 4, 6.
uint8_t plane2_byte(const uint8_t* q, int j, int k, int u, int shift) {
  auto v = [&](int at) { return (q[32 * j + at] >> shift) & 3; };
  return static_cast<uint8_t>(v(8 * u + k) | v(16 + 8 * u + k) << 2 | v(8 * u + 4 + k) << 4 | v(16 + 8 * u + 4 + k) << 6);
}
// The 2 bits of block j's value 4c + k in such a plane (chunk c < 4 low, else high).
int plane2_value(const uint8_t* plane, int j, int k, int c) {
  const int t = c % 4;
  return plane[32 * (t / 2) + 4 * j + k] >> (4 * (t % 2) + 2 * (c / 4)) & 3;
}
// Q2_K / Q3_K's own layout: value v's 2 bits at bits 2s of qs[32h + l] (v = 128h + 32s + l).
void put_k_low2(uint8_t* qs, int v, int low) { qs[32 * (v / 128) + v % 32] |= static_cast<uint8_t>(low << (2 * ((v / 32) % 4))); }
}  // namespace

void pack_q3_k_x8(const BlockQ3_K* src, BlockQ3_Kx8* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ3_K b;
    std::memcpy(&b, src + i, sizeof b);  // a copy first: dst may overlap src
    uint8_t q[QK_K];
    q3_k_values(b, q);
    int8_t sc[16];
    q3_k_scales(b.scales, sc);
    BlockQ3_Kx8 p{};
    p.d = b.d;
    uint32_t top = 0;
    for (int j = 0; j < 8; ++j) {
      const int lo = sc[2 * j] + 32, hi = sc[2 * j + 1] + 32;  // 0..63
      p.scales[j] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      top |= static_cast<uint32_t>(lo >> 4) << (2 * j) | static_cast<uint32_t>(hi >> 4) << (16 + 2 * j);
      for (int k = 0; k < 4; ++k) {
        for (int u = 0; u < 2; ++u) p.qs[32 * u + 4 * j + k] = plane2_byte(q, j, k, u, 0);
        for (int c = 0; c < 8; ++c) p.hmask[4 * j + k] |= static_cast<uint8_t>((q[32 * j + 4 * c + k] >> 2) << c);
      }
    }
    std::memcpy(p.scales + 8, &top, 4);
    std::memcpy(dst + i, &p, sizeof p);
  }
}

void unpack_q3_k_x8(const BlockQ3_Kx8* src, BlockQ3_K* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ3_Kx8 p;
    std::memcpy(&p, src + i, sizeof p);
    BlockQ3_K b{};
    b.d = p.d;
    uint32_t top;
    std::memcpy(&top, p.scales + 8, 4);
    for (int j = 0; j < 8; ++j) {
      for (int half = 0; half < 2; ++half) {  // group g = 2j + half, Q3_K's scale layout (q3_k_scales)
        const int g = 2 * j + half;
        const int s6 = (p.scales[j] >> (4 * half) & 15) | (top >> (16 * half + 2 * j) & 3) << 4;
        b.scales[g % 8] |= static_cast<uint8_t>((s6 & 15) << (4 * (g / 8)));
        b.scales[8 + g % 4] |= static_cast<uint8_t>((s6 >> 4) << (2 * (g / 4)));
      }
      for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 8; ++c) {  // value 4c + k of block j
          const int value = 32 * j + 4 * c + k;
          put_k_low2(b.qs, value, plane2_value(p.qs, j, k, c));
          b.hmask[value % 32] |= static_cast<uint8_t>((p.hmask[4 * j + k] >> c & 1) << (value / 32));
        }
    }
    std::memcpy(dst + i, &b, sizeof b);
  }
}

void pack_q2_k_x8(const BlockQ2_K* src, BlockQ2_Kx8* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ2_K b;
    std::memcpy(&b, src + i, sizeof b);  // a copy first: dst may overlap src
    uint8_t q[QK_K];
    k_low2_values(b.qs, q);
    BlockQ2_Kx8 p{};
    p.d = b.d;
    p.dmin = b.dmin;
    for (int j = 0; j < 8; ++j) {
      p.scales[j] = b.scales[2 * j];
      p.scales[8 + j] = b.scales[2 * j + 1];
      for (int k = 0; k < 4; ++k)
        for (int u = 0; u < 2; ++u) p.qs[32 * u + 4 * j + k] = plane2_byte(q, j, k, u, 0);
    }
    std::memcpy(dst + i, &p, sizeof p);
  }
}

void unpack_q2_k_x8(const BlockQ2_Kx8* src, BlockQ2_K* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ2_Kx8 p;
    std::memcpy(&p, src + i, sizeof p);
    BlockQ2_K b{};
    b.d = p.d;
    b.dmin = p.dmin;
    for (int j = 0; j < 8; ++j) {
      b.scales[2 * j] = p.scales[j];
      b.scales[2 * j + 1] = p.scales[8 + j];
      for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 8; ++c) put_k_low2(b.qs, 32 * j + 4 * c + k, plane2_value(p.qs, j, k, c));
    }
    std::memcpy(dst + i, &b, sizeof b);
  }
}

DType block32_x8(DType t) {
  switch (t) {
    case DType::Q4_0: return DType::Q4_0_X8;
    case DType::Q4_1: return DType::Q4_1_X8;
    case DType::Q5_0: return DType::Q5_0_X8;
    case DType::Q5_1: return DType::Q5_1_X8;
    case DType::IQ4_NL: return DType::IQ4_NL_X8;
    case DType::MXFP4: return DType::MXFP4_X8;
    default: return t;
  }
}

DType block32_base(DType t) {
  switch (t) {
    case DType::Q4_0_X8: return DType::Q4_0;
    case DType::Q4_1_X8: return DType::Q4_1;
    case DType::Q5_0_X8: return DType::Q5_0;
    case DType::Q5_1_X8: return DType::Q5_1;
    case DType::IQ4_NL_X8: return DType::IQ4_NL;
    case DType::MXFP4_X8: return DType::MXFP4;
    default: return t;
  }
}

namespace {

// One group of 8 blocks <-> its _X8 form (core/dtype.h). The fields a format lacks (Q4_0's m and
// qh, ...) are skipped through `if constexpr`.
template <class B> constexpr bool kHasMin = std::is_same_v<B, BlockQ4_1> || std::is_same_v<B, BlockQ5_1>;
template <class B> constexpr bool kHasQh = std::is_same_v<B, BlockQ5_0> || std::is_same_v<B, BlockQ5_1>;

template <class B, class P>
void pack_group32(const B* src, P* dst) {
  B b[8];
  std::memcpy(b, src, sizeof b);  // a copy first: dst may overlap src
  P p{};
  for (int j = 0; j < 8; ++j) {
    if constexpr (std::is_same_v<B, BlockMXFP4>) p.e[j] = b[j].e;
    else p.d[j] = b[j].d;
    if constexpr (kHasMin<B>) p.m[j] = b[j].m;
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < 4; ++k) p.qs[32 * t + 4 * j + k] = b[j].qs[4 * t + k];
    if constexpr (kHasQh<B>) {
      uint32_t qh;
      std::memcpy(&qh, b[j].qh, 4);
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 4; ++k) p.qh[4 * j + k] |= static_cast<uint8_t>((qh >> (4 * c + k) & 1) << c);
    }
  }
  std::memcpy(dst, &p, sizeof p);
}

template <class B, class P>
void unpack_group32(const P* src, B* dst) {
  P p;
  std::memcpy(&p, src, sizeof p);
  B b[8] = {};
  for (int j = 0; j < 8; ++j) {
    if constexpr (std::is_same_v<B, BlockMXFP4>) b[j].e = p.e[j];
    else b[j].d = p.d[j];
    if constexpr (kHasMin<B>) b[j].m = p.m[j];
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < 4; ++k) b[j].qs[4 * t + k] = p.qs[32 * t + 4 * j + k];
    if constexpr (kHasQh<B>) {
      uint32_t qh = 0;
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 4; ++k) qh |= static_cast<uint32_t>(p.qh[4 * j + k] >> c & 1) << (4 * c + k);
      std::memcpy(b[j].qh, &qh, 4);
    }
  }
  std::memcpy(dst, b, sizeof b);
}

template <class B, class P>
void pack_groups32(const void* src, void* dst, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) pack_group32(static_cast<const B*>(src) + 8 * g, static_cast<P*>(dst) + g);
}
template <class B, class P>
void unpack_groups32(const void* src, void* dst, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) unpack_group32(static_cast<const P*>(src) + g, static_cast<B*>(dst) + 8 * g);
}

}  // namespace

void pack_block32_x8(DType base, const void* src, void* dst, int64_t groups) {
  switch (base) {
    case DType::Q4_0: return pack_groups32<BlockQ4_0, BlockQ4_0x8>(src, dst, groups);
    case DType::Q4_1: return pack_groups32<BlockQ4_1, BlockQ4_1x8>(src, dst, groups);
    case DType::Q5_0: return pack_groups32<BlockQ5_0, BlockQ5_0x8>(src, dst, groups);
    case DType::Q5_1: return pack_groups32<BlockQ5_1, BlockQ5_1x8>(src, dst, groups);
    case DType::IQ4_NL: return pack_groups32<BlockIQ4_NL, BlockIQ4_NLx8>(src, dst, groups);
    case DType::MXFP4: return pack_groups32<BlockMXFP4, BlockMXFP4x8>(src, dst, groups);
    default: fail("pack_block32_x8: ", dtype_name(base), " has no _X8 form");
  }
}

void unpack_block32_x8(DType packed, const void* src, void* dst, int64_t groups) {
  switch (packed) {
    case DType::Q4_0_X8: return unpack_groups32<BlockQ4_0, BlockQ4_0x8>(src, dst, groups);
    case DType::Q4_1_X8: return unpack_groups32<BlockQ4_1, BlockQ4_1x8>(src, dst, groups);
    case DType::Q5_0_X8: return unpack_groups32<BlockQ5_0, BlockQ5_0x8>(src, dst, groups);
    case DType::Q5_1_X8: return unpack_groups32<BlockQ5_1, BlockQ5_1x8>(src, dst, groups);
    case DType::IQ4_NL_X8: return unpack_groups32<BlockIQ4_NL, BlockIQ4_NLx8>(src, dst, groups);
    case DType::MXFP4_X8: return unpack_groups32<BlockMXFP4, BlockMXFP4x8>(src, dst, groups);
    default: fail("unpack_block32_x8: ", dtype_name(packed), " is not an _X8 form of a 32-value format");
  }
}

// The bytes of a row's blocks after its last whole group: Q4_0_X8, IQ4_NL_X8 and MXFP4_X8 rows
// may have some (core/dtype.h).
static int64_t block32_tail_bytes(DType base, int64_t n) {
  FP_CHECK(n % 256 == 0 || (block32_x8_takes_tail(base) && n % 32 == 0), "a ", dtype_name(block32_x8(base)), " row of ", n,
           " values: only Q4_0_X8, IQ4_NL_X8 and MXFP4_X8 rows may end inside a group of 256 (at a block of 32)");
  return n % 256 / 32 * dtype_info(base).block_bytes;
}

// A tail's n < 8 plain blocks (a scale of `scale_bytes`, then 16 bytes of nibbles each) as a
// partial group: the n scales, then chunk t = every block's bytes 4t..4t+3 (t < 4), 4n bytes
// each. A decode kernel reads chunk t with one masked load (lane j = block j), as a whole group's.
static void pack_block32_tail(DType base, const void* src, void* dst, int64_t n) {
  const int64_t bb = dtype_info(base).block_bytes, sb = bb - 16;
  uint8_t plain[8 * sizeof(BlockQ4_0)];
  std::memcpy(plain, src, static_cast<size_t>(n * bb));  // dst may equal src
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t j = 0; j < n; ++j) std::memcpy(out + j * sb, plain + j * bb, static_cast<size_t>(sb));
  for (int t = 0; t < 4; ++t)
    for (int64_t j = 0; j < n; ++j) std::memcpy(out + n * sb + 4 * n * t + 4 * j, plain + j * bb + sb + 4 * t, 4);
}
void unpack_block32_x8_tail(DType packed, const void* src, void* dst, int64_t n) {
  const DType base = block32_base(packed);
  const int64_t bb = dtype_info(base).block_bytes, sb = bb - 16;
  FP_CHECK(block32_x8_takes_tail(base) && n >= 0 && n < 8, "unpack_block32_x8_tail: ", dtype_name(packed), ", ", n, " blocks");
  uint8_t part[8 * sizeof(BlockQ4_0)];
  std::memcpy(part, src, static_cast<size_t>(n * bb));  // dst may equal src
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(out + j * bb, part + j * sb, static_cast<size_t>(sb));
    for (int t = 0; t < 4; ++t) std::memcpy(out + j * bb + sb + 4 * t, part + n * sb + 4 * n * t + 4 * j, 4);
  }
}

void pack_block32_x8_row(DType base, const void* src, void* dst, int64_t n) {
  const int64_t tail = block32_tail_bytes(base, n), whole = n / 256 * 8 * dtype_info(base).block_bytes;
  pack_block32_x8(base, src, dst, n / 256);
  if (tail)
    pack_block32_tail(base, static_cast<const uint8_t*>(src) + whole, static_cast<uint8_t*>(dst) + whole, n % 256 / 32);
}

void unpack_block32_x8_row(DType packed, const void* src, void* dst, int64_t n) {
  const DType base = block32_base(packed);
  const int64_t tail = block32_tail_bytes(base, n), whole = n / 256 * 8 * dtype_info(base).block_bytes;
  unpack_block32_x8(packed, src, dst, n / 256);
  if (tail)
    unpack_block32_x8_tail(packed, static_cast<const uint8_t*>(src) + whole, static_cast<uint8_t*>(dst) + whole, n % 256 / 32);
}

void pack_iq4_xs_x8(const BlockIQ4_XS* src, BlockIQ4_XSx8* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    const BlockIQ4_XS b = src[i];  // a copy first: dst may overlap src
    BlockIQ4_XSx8 p{b.d, b.scales_h, {}, {}};
    std::memcpy(p.scales_l, b.scales_l, sizeof p.scales_l);
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 4; ++t)
        for (int k = 0; k < 4; ++k) p.qs[32 * t + 4 * j + k] = b.qs[16 * j + 4 * t + k];
    std::memcpy(dst + i, &p, sizeof p);
  }
}

void unpack_iq4_xs_x8(const BlockIQ4_XSx8* src, BlockIQ4_XS* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    const BlockIQ4_XSx8 p = src[i];
    BlockIQ4_XS b{p.d, p.scales_h, {}, {}};
    std::memcpy(b.scales_l, p.scales_l, sizeof b.scales_l);
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 4; ++t)
        for (int k = 0; k < 4; ++k) b.qs[16 * j + 4 * t + k] = p.qs[32 * t + 4 * j + k];
    std::memcpy(dst + i, &b, sizeof b);
  }
}

namespace {
// The 256 six-bit values (0..63, the weight being d * scale * (q - 32)) of a Q6_K super-block, in order.
void q6_k_values(const BlockQ6_K& b, uint8_t q[QK_K]) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo0 = b.ql[64 * h + l], lo1 = b.ql[64 * h + l + 32], hi = b.qh[32 * h + l];
      q[128 * h + l] = static_cast<uint8_t>((lo0 & 15) | (hi & 3) << 4);
      q[128 * h + l + 32] = static_cast<uint8_t>((lo1 & 15) | ((hi >> 2) & 3) << 4);
      q[128 * h + l + 64] = static_cast<uint8_t>((lo0 >> 4) | ((hi >> 4) & 3) << 4);
      q[128 * h + l + 96] = static_cast<uint8_t>((lo1 >> 4) | ((hi >> 6) & 3) << 4);
    }
}
}  // namespace

void pack_q6_k_x8(const BlockQ6_K* src, BlockQ6_Kx8* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ6_K b;
    std::memcpy(&b, src + i, sizeof b);  // a copy first: dst may overlap src
    uint8_t q[QK_K];
    q6_k_values(b, q);
    BlockQ6_Kx8 p{};
    p.d = b.d;
    auto v = [&](int j, int at) { return q[32 * j + at]; };  // block j's value `at`
    for (int j = 0; j < 8; ++j) {
      p.scales[j] = b.scales[2 * j];
      p.scales[8 + j] = b.scales[2 * j + 1];
      for (int k = 0; k < 4; ++k) {
        for (int t = 0; t < 4; ++t)
          p.ql[32 * t + 4 * j + k] = static_cast<uint8_t>((v(j, 4 * t + k) & 15) | (v(j, 16 + 4 * t + k) & 15) << 4);
        for (int u = 0; u < 2; ++u) p.qh[32 * u + 4 * j + k] = plane2_byte(q, j, k, u, 4);
      }
    }
    std::memcpy(dst + i, &p, sizeof p);
  }
}

void unpack_q6_k_x8(const BlockQ6_Kx8* src, BlockQ6_K* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    BlockQ6_Kx8 p;
    std::memcpy(&p, src + i, sizeof p);
    uint8_t q[QK_K];
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 4; ++k) {
        for (int t = 0; t < 4; ++t) {
          const uint8_t lo = p.ql[32 * t + 4 * j + k];
          q[32 * j + 4 * t + k] = lo & 15;
          q[32 * j + 16 + 4 * t + k] = lo >> 4;
        }
        for (int u = 0; u < 2; ++u) {
          const uint8_t hi = p.qh[32 * u + 4 * j + k];
          q[32 * j + 8 * u + k] = static_cast<uint8_t>(q[32 * j + 8 * u + k] | (hi & 3) << 4);
          q[32 * j + 16 + 8 * u + k] = static_cast<uint8_t>(q[32 * j + 16 + 8 * u + k] | ((hi >> 2) & 3) << 4);
          q[32 * j + 8 * u + 4 + k] = static_cast<uint8_t>(q[32 * j + 8 * u + 4 + k] | ((hi >> 4) & 3) << 4);
          q[32 * j + 16 + 8 * u + 4 + k] = static_cast<uint8_t>(q[32 * j + 16 + 8 * u + 4 + k] | (hi >> 6) << 4);
        }
      }
    BlockQ6_K b{};
    b.d = p.d;
    for (int j = 0; j < 8; ++j) {
      b.scales[2 * j] = p.scales[j];
      b.scales[2 * j + 1] = p.scales[8 + j];
    }
    for (int h = 0; h < 2; ++h)  // Q6_K's own packing of the values (as quant_q6_k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = q[128 * h + l], q2 = q[128 * h + l + 32], q3 = q[128 * h + l + 64], q4 = q[128 * h + l + 96];
        b.ql[64 * h + l] = static_cast<uint8_t>((q1 & 15) | (q3 & 15) << 4);
        b.ql[64 * h + l + 32] = static_cast<uint8_t>((q2 & 15) | (q4 & 15) << 4);
        b.qh[32 * h + l] = static_cast<uint8_t>((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
      }
    std::memcpy(dst + i, &b, sizeof b);
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* b, int64_t n) {
  check_blocks(DType::Q8_0, n);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const float* v = x + i * QK8_0;
    float amax = 0;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(v[j]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < QK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(v[j] * id));
  }
}

void dequantize_row(DType t, const void* src, float* y, int64_t n) {
  check_blocks(t, n);
  switch (t) {
    case DType::F32: std::memcpy(y, src, n * 4); return;
    case DType::F16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = fp8e4m3_to_f32(s[i]);
      return;
    }
    case DType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), y, n / QK8_0); return;
    case DType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), y, n / QK4_0); return;
    case DType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), y, n / QK5_0); return;
    case DType::Q5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), y, n / QK5_0); return;
    case DType::Q5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), y, n / QK5_0); return;
    case DType::Q2_K: dequant_q2_k(static_cast<const BlockQ2_K*>(src), y, n / QK_K); return;
    case DType::Q3_K: dequant_q3_k(static_cast<const BlockQ3_K*>(src), y, n / QK_K); return;
    case DType::Q4_K: dequant_q4_k(static_cast<const BlockQ4_K*>(src), y, n / QK_K); return;
    case DType::Q5_K: dequant_q5_k(static_cast<const BlockQ5_K*>(src), y, n / QK_K); return;
    case DType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), y, n / QK_K); return;
    case DType::IQ4_NL: dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), y, n / 32); return;
    case DType::MXFP4: dequant_mxfp4(static_cast<const BlockMXFP4*>(src), y, n / 32); return;
    case DType::IQ4_XS: dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), y, n / QK_K); return;
    case DType::IQ4_XS_X8:
      for (int64_t g = 0; g < n / QK_K; ++g) {
        BlockIQ4_XS b;
        unpack_iq4_xs_x8(static_cast<const BlockIQ4_XSx8*>(src) + g, &b, 1);
        dequant_iq4_xs(&b, y + g * QK_K, 1);
      }
      return;
    case DType::Q8_0_X8:
      for (int64_t g = 0; g < n / QK8_0X8; ++g) {
        BlockQ8_0 b[8];
        unpack_q8_0_x8(static_cast<const BlockQ8_0x8*>(src) + g, b, 1);
        dequant_q8_0(b, y + g * QK8_0X8, 8);
      }
      return;
    case DType::Q4_K_X8:
      for (int64_t g = 0; g < n / QK_K; ++g) {
        BlockQ4_K b;
        unpack_q4_k_x8(static_cast<const BlockQ4_Kx8*>(src) + g, &b, 1);
        dequant_q4_k(&b, y + g * QK_K, 1);
      }
      return;
    case DType::Q6_K_X8:
      for (int64_t g = 0; g < n / QK_K; ++g) {
        BlockQ6_K b;
        unpack_q6_k_x8(static_cast<const BlockQ6_Kx8*>(src) + g, &b, 1);
        dequant_q6_k(&b, y + g * QK_K, 1);
      }
      return;
    case DType::Q2_K_X8:
      for (int64_t g = 0; g < n / QK_K; ++g) {
        BlockQ2_K b;
        unpack_q2_k_x8(static_cast<const BlockQ2_Kx8*>(src) + g, &b, 1);
        dequant_q2_k(&b, y + g * QK_K, 1);
      }
      return;
    case DType::Q3_K_X8:
      for (int64_t g = 0; g < n / QK_K; ++g) {
        BlockQ3_K b;
        unpack_q3_k_x8(static_cast<const BlockQ3_Kx8*>(src) + g, &b, 1);
        dequant_q3_k(&b, y + g * QK_K, 1);
      }
      return;
    case DType::Q4_0_X8: case DType::Q4_1_X8: case DType::Q5_0_X8: case DType::Q5_1_X8: case DType::IQ4_NL_X8: case DType::MXFP4_X8: {
      const DType base = block32_base(t);
      const int64_t group_bytes = 8 * dtype_info(base).block_bytes;
      alignas(8) uint8_t blocks[8 * sizeof(BlockQ5_1)];
      for (int64_t g = 0; g < n / 256; ++g) {
        unpack_block32_x8(t, static_cast<const uint8_t*>(src) + g * group_bytes, blocks, 1);
        dequantize_row(base, blocks, y + g * 256, 256);
      }
      if (block32_tail_bytes(base, n) > 0) {  // a row's last blocks, a partial group (the call checks n)
        unpack_block32_x8_tail(t, static_cast<const uint8_t*>(src) + n / 256 * group_bytes, blocks, n % 256 / 32);
        dequantize_row(base, blocks, y + n / 256 * 256, n % 256);
      }
      return;
    }
    case DType::F64: {
      auto s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(s[i]);
      return;
    }
    default: fail("cannot dequantize ", dtype_name(t), " to F32");
  }
}

std::vector<uint8_t> quantize_to_bytes(DType t, const float* src, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes(t, n)));
  quantize_row(t, src, out.data(), n);
  return out;
}

void quantize_row(DType t, const float* x, void* dst, int64_t n) {
  check_blocks(t, n);
  switch (t) {
    case DType::F32: std::memcpy(dst, x, n * 4); return;
    case DType::F16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(x[i]);
      return;
    }
    case DType::BF16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8e4m3(x[i]);
      return;
    }
    case DType::Q8_0: quantize_row_q8_0(x, static_cast<BlockQ8_0*>(dst), n); return;
    case DType::Q4_0: quant_q4_0(x, static_cast<BlockQ4_0*>(dst), n / QK4_0); return;
    case DType::Q4_1: quant_q4_1(x, static_cast<BlockQ4_1*>(dst), n / QK5_0); return;
    case DType::Q5_0: quant_q5_0(x, static_cast<BlockQ5_0*>(dst), n / QK5_0); return;
    case DType::Q5_1: quant_q5_1(x, static_cast<BlockQ5_1*>(dst), n / QK5_0); return;
    case DType::Q2_K: quant_q2_k(x, static_cast<BlockQ2_K*>(dst), n / QK_K); return;
    case DType::Q3_K: quant_q3_k(x, static_cast<BlockQ3_K*>(dst), n / QK_K); return;
    case DType::Q4_K: quant_q4_k(x, static_cast<BlockQ4_K*>(dst), n / QK_K); return;
    case DType::Q5_K: quant_q5_k(x, static_cast<BlockQ5_K*>(dst), n / QK_K); return;
    case DType::Q6_K: quant_q6_k(x, static_cast<BlockQ6_K*>(dst), n / QK_K); return;
    case DType::IQ4_NL: quant_iq4_nl(x, static_cast<BlockIQ4_NL*>(dst), n / 32); return;
    case DType::MXFP4: quant_mxfp4(x, static_cast<BlockMXFP4*>(dst), n / 32); return;
    case DType::IQ4_XS: quant_iq4_xs(x, static_cast<BlockIQ4_XS*>(dst), n / QK_K); return;
    case DType::IQ4_XS_X8:  // as IQ4_XS, then repacked in place
      quant_iq4_xs(x, static_cast<BlockIQ4_XS*>(dst), n / QK_K);
      pack_iq4_xs_x8(static_cast<const BlockIQ4_XS*>(dst), static_cast<BlockIQ4_XSx8*>(dst), n / QK_K);
      return;
    case DType::Q8_0_X8:  // as Q8_0, then repacked in place
      quantize_row_q8_0(x, static_cast<BlockQ8_0*>(dst), n);
      pack_q8_0_x8(static_cast<const BlockQ8_0*>(dst), static_cast<BlockQ8_0x8*>(dst), n / QK8_0X8);
      return;
    case DType::Q4_K_X8:  // as Q4_K, then repacked in place
      quant_q4_k(x, static_cast<BlockQ4_K*>(dst), n / QK_K);
      pack_q4_k_x8(static_cast<const BlockQ4_K*>(dst), static_cast<BlockQ4_Kx8*>(dst), n / QK_K);
      return;
    case DType::Q6_K_X8:  // as Q6_K, then repacked in place
      quant_q6_k(x, static_cast<BlockQ6_K*>(dst), n / QK_K);
      pack_q6_k_x8(static_cast<const BlockQ6_K*>(dst), static_cast<BlockQ6_Kx8*>(dst), n / QK_K);
      return;
    case DType::Q2_K_X8:  // as Q2_K, then repacked in place
      quant_q2_k(x, static_cast<BlockQ2_K*>(dst), n / QK_K);
      pack_q2_k_x8(static_cast<const BlockQ2_K*>(dst), static_cast<BlockQ2_Kx8*>(dst), n / QK_K);
      return;
    case DType::Q3_K_X8:  // as Q3_K, then repacked in place
      quant_q3_k(x, static_cast<BlockQ3_K*>(dst), n / QK_K);
      pack_q3_k_x8(static_cast<const BlockQ3_K*>(dst), static_cast<BlockQ3_Kx8*>(dst), n / QK_K);
      return;
    case DType::Q4_0_X8: case DType::Q4_1_X8: case DType::Q5_0_X8: case DType::Q5_1_X8: case DType::IQ4_NL_X8:
    case DType::MXFP4_X8:  // as the base, then repacked in place
      quantize_row(block32_base(t), x, dst, n);
      pack_block32_x8_row(block32_base(t), dst, dst, n);
      return;
    default: fail("cannot quantize F32 to ", dtype_name(t));
  }
}

}  // namespace fp
