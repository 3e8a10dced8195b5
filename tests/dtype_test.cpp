// tests/dtype_test.cpp — scalar float conversions and the GGUF block formats against
// independent computations: exhaustive F16/FP8 round trips, rounding, quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace fp {
namespace {

TEST(DType, F16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "pattern " << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                    // overflow to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);   // below half the smallest subnormal
}

TEST(DType, F16RoundsToNearestEven) {
  // Compare with rounding done in double on the neighbouring representable values.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) {
    float x = i % 2 ? u(rng) : u(rng) * 1e-6f;
    uint16_t h = f32_to_f16(x);
    float y = f16_to_f32(h);
    if (std::isinf(y)) {
      EXPECT_GE(std::fabs(x), 65504.0f);
      continue;
    }
    // No other f16 value is strictly closer.
    for (int d : {-1, 1}) {
      uint16_t n = static_cast<uint16_t>(h + d);
      float z = f16_to_f32(n);
      if (std::isnan(z) || std::isinf(z) || ((n ^ h) & 0x8000)) continue;
      EXPECT_LE(std::fabs(static_cast<double>(y) - x), std::fabs(static_cast<double>(z) - x)) << x;
    }
  }
}

TEST(DType, BF16) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // exactly half way: ties to even (down)
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // half way above odd: up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 10);
  for (int i = 0; i < 10000; ++i) {
    float x = n(rng);
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(x)), x, std::fabs(x) * (1.0f / 256));
  }
}

TEST(DType, Fp8E4M3EveryCode) {
  for (int c = 0; c < 256; ++c) {
    float f = fp8e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    uint8_t back = f32_to_fp8e4m3(f);
    if (f == 0.0f) EXPECT_EQ(back & 0x7f, 0);
    else EXPECT_EQ(back, c) << "code " << c;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);   // half way between 1 and 1.125: ties to even
}

// Relative RMS error of quantize -> dequantize on Gaussian data, per format.
double quant_error(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, n)));
  quantize_row(t, x.data(), q.data(), n);
  dequantize_row(t, q.data(), y.data(), n);
  double se = 0, ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    se += (x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]) * (x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]);
    ss += x[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
  }
  return std::sqrt(se / ss);
}

TEST(DType, QuantizationErrorWithinFormatBounds) {
  // Bounds from the formats' bit widths: 8-bit ~0.5%, 6-bit ~2-3%, 4-bit ~10-12%.
  struct Case { DType t; double bound; };
  for (auto c : {Case{DType::F16, 1e-3}, Case{DType::BF16, 5e-3}, Case{DType::Q8_0, 0.01}, Case{DType::Q6_K, 0.04},
                 Case{DType::Q4_0, 0.15}, Case{DType::Q4_K, 0.15}, Case{DType::F8_E4M3, 0.05}}) {
    for (int64_t n : {256, 512, 4096}) {
      double e = quant_error(c.t, n, static_cast<uint32_t>(n));
      EXPECT_LT(e, c.bound) << dtype_name(c.t) << " n=" << n;
      EXPECT_GT(e, 0.0) << dtype_name(c.t) << " should be lossy";
    }
  }
}

TEST(DType, Q8_0MatchesGgmlRounding) {
  // d = max|x|/127, q = round half away from zero (x / d).
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.25f;
  BlockQ8_0 b;
  quantize_row_q8_0(x, &b, 32);
  float d = f16_to_f32(b.d);
  EXPECT_NEAR(d, 4.0f / 127, 1e-5);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b.qs[i], static_cast<int8_t>(std::round(x[i] / (4.0f / 127))));
}

TEST(DType, KnownBlockDequantization) {
  // Q4_0: one block with d = 0.5 and nibbles j -> value (j - 8) * 0.5.
  BlockQ4_0 b4;
  b4.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_0, &b4, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f);
  }
  // Q6_K: all quants 32 (zero), so the row dequantizes to zeros whatever the scales.
  BlockQ6_K b6{};
  std::memset(b6.ql, 0, sizeof b6.ql);
  std::memset(b6.qh, 0xaa, sizeof b6.qh);  // high bits 2 -> q = 32 -> 0
  for (auto& s : b6.scales) s = 3;
  b6.d = f32_to_f16(1.0f);
  float z[256];
  dequantize_row(DType::Q6_K, &b6, z, 256);
  for (float v : z) EXPECT_EQ(v, 0.0f);
}

// MXFP4 (OCP MX spec): an E2M1 value (sign, 2 exponent bits with bias 1, 1 mantissa bit;
// exponent 0 subnormal: 0 or 0.5) times 2^(e - 127). Every nibble under every scale byte,
// decoded here from the bits, against dequantize_row; and the quantizer: exact on values the
// format holds, within half a level step below the top level, within a step above it.
TEST(DType, Mxfp4EveryCodeAndScale) {
  auto e2m1 = [](int q) {
    const int sign = q >> 3, exp = (q >> 1) & 3, man = q & 1;
    const double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
    return sign ? -mag : mag;
  };
  BlockMXFP4 b;
  for (int e = 0; e < 255; ++e) {
    b.e = static_cast<uint8_t>(e);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(DType::MXFP4, &b, y, 32);
    for (int j = 0; j < 16; ++j) {
      // As floats: 6 x 2^126 and beyond overflow to infinity, the smallest scales are subnormal.
      ASSERT_EQ(y[j], static_cast<float>(e2m1(j) * std::ldexp(1.0, e - 127))) << "code " << j << " scale " << e;
      ASSERT_EQ(y[j + 16], static_cast<float>(e2m1(15 - j) * std::ldexp(1.0, e - 127))) << "code " << 15 - j << " scale " << e;
    }
  }
  EXPECT_EQ(row_bytes(DType::MXFP4, 64), 34);
  DType t;
  EXPECT_TRUE(dtype_from_gguf(39, &t));
  EXPECT_EQ(t, DType::MXFP4);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    float x[32], y[32];
    const float scale = std::ldexp(1.0f, trial % 40 - 20);
    for (float& v : x) v = nd(rng) * scale;
    quantize_row(DType::MXFP4, x, &b, 32);
    dequantize_row(DType::MXFP4, &b, y, 32);
    // The shared exponent puts amax in [4, 8) x 2^(e-127) (the OCP choice): levels there are a
    // step 2^(e-126) apart and top out at 6, so values up to 6 x 2^(e-127) land within half a
    // step, the few above it (clipped to 6) within a step.
    const double step = std::ldexp(1.0, b.e - 126);
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(x[j] - y[j]), step * (std::fabs(x[j]) <= 3 * step ? 0.5 : 1.0) * (1 + 1e-6)) << j;
    std::memcpy(x, y, sizeof x);  // representable values come back exactly
    quantize_row(DType::MXFP4, x, &b, 32);
    dequantize_row(DType::MXFP4, &b, y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(x[j], y[j]) << j;
  }
}

TEST(DType, RowBytesRejectsPartialBlocks) {
  EXPECT_EQ(row_bytes(DType::Q4_K, 512), 288);
  EXPECT_EQ(row_bytes(DType::F16, 7), 14);
  EXPECT_THROW(row_bytes(DType::Q8_0, 33), Error);
  DType t;
  EXPECT_TRUE(dtype_from_name("q4_k", &t));
  EXPECT_EQ(t, DType::Q4_K);
  EXPECT_TRUE(dtype_from_name("q5_k", &t));
  EXPECT_EQ(t, DType::Q5_K);
  EXPECT_FALSE(dtype_from_name("iq2_xxs", &t));
}

}  // namespace
}  // namespace fp
