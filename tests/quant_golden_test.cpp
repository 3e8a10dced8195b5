// tests/quant_golden_test.cpp — every GGUF block format's dequantizer against llama.cpp's own
// (its `gguf` Python package: scripts/make_quant_golden.py wrote tests/golden/quant_blocks.bin
// from random blocks), bit for bit; then each format's quantizer round-trips within a bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/dtype.h"
#include "backend_ops.h"

namespace fp {
namespace {

struct GoldenFormat {
  std::string name;
  int64_t values = 0;
  std::vector<uint8_t> raw;
  std::vector<float> expected;
};

std::vector<GoldenFormat> read_golden() {
  const std::string path = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/quant_blocks.bin";
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<GoldenFormat> out;
  if (b.size() < 8 || std::memcmp(b.data(), "FPQG", 4) != 0) {
    ADD_FAILURE() << path << " is missing or not a quant golden file";
    return out;
  }
  uint32_t count, at = 8;
  std::memcpy(&count, b.data() + 4, 4);
  for (uint32_t i = 0; i < count; ++i) {
    GoldenFormat g;
    uint32_t n, bytes;
    if (at + 16 > b.size()) break;
    g.name.assign(reinterpret_cast<const char*>(b.data() + at), strnlen(reinterpret_cast<const char*>(b.data() + at), 8));
    std::memcpy(&n, b.data() + at + 8, 4);
    std::memcpy(&bytes, b.data() + at + 12, 4);
    at += 16;
    if (at + bytes + 4ull * n > b.size()) break;
    g.values = n;
    g.raw.assign(b.begin() + at, b.begin() + at + bytes);
    at += bytes;
    g.expected.resize(n);
    std::memcpy(g.expected.data(), b.data() + at, 4ull * n);
    at += 4 * n;
    out.push_back(std::move(g));
  }
  EXPECT_EQ(out.size(), count) << path << " is truncated";
  return out;
}

TEST(QuantGolden, DequantizersMatchLlamaCppsOwn) {
  const auto formats = read_golden();
  ASSERT_EQ(formats.size(), 12u);
  for (const auto& g : formats) {
    DType t;
    ASSERT_TRUE(dtype_from_name(g.name, &t)) << g.name;
    ASSERT_EQ(static_cast<int64_t>(g.raw.size()), row_bytes(t, g.values)) << g.name;
    // The GGUF type id is the enum value: a file's tensor of this type loads as it.
    DType from_file;
    ASSERT_TRUE(dtype_from_gguf(static_cast<uint32_t>(t), &from_file)) << g.name;
    std::vector<float> got(static_cast<size_t>(g.values));
    dequantize_row(t, g.raw.data(), got.data(), g.values);
    int mismatches = 0;
    for (int64_t i = 0; i < g.values; ++i) {
      // llama.cpp's package multiplies in another order for some formats (d * scale first, or
      // d * q - dmin * m as one expression): equal to float rounding, not always bit for bit.
      const float e = g.expected[static_cast<size_t>(i)], tol = 1e-6f * std::max(1.0f, std::fabs(e));
      if (std::fabs(got[static_cast<size_t>(i)] - e) > tol && ++mismatches <= 3)
        ADD_FAILURE() << g.name << " value " << i << ": " << got[static_cast<size_t>(i)] << " vs llama.cpp's " << e;
    }
    EXPECT_EQ(mismatches, 0) << g.name;
  }
}

// Each quantizer writes blocks its dequantizer reads back close to the input (Gaussian values,
// as weights are), the error bounded by the format's bits.
TEST(QuantGolden, QuantizersRoundTripWithinTheirFormatsError) {
  struct Case {
    DType t;
    double rel_rms;
  };
  const auto x = test::random_floats(4096, 11);
  for (auto c : {Case{DType::Q4_1, 0.1}, Case{DType::Q5_0, 0.055}, Case{DType::Q5_1, 0.05}, Case{DType::Q5_K, 0.05},
                 Case{DType::Q3_K, 0.2}, Case{DType::Q2_K, 0.4}, Case{DType::IQ4_NL, 0.1}, Case{DType::IQ4_XS, 0.1}}) {
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes(c.t, 4096)));
    quantize_row(c.t, x.data(), q.data(), 4096);
    std::vector<float> y(4096);
    dequantize_row(c.t, q.data(), y.data(), 4096);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      ref += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), c.rel_rms) << dtype_name(c.t);
    EXPECT_GT(std::sqrt(err / ref), 0.0) << dtype_name(c.t) << " lost nothing: the test would not see a broken round trip";
  }
}

}  // namespace
}  // namespace fp
