// tests/repack_test.cpp — Q8_0, Q4_K, Q6_K, Q3_K, Q2_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS weights repacked at load into
// their _X8 forms (model/repack.h): the repacking is exact both ways (in place too) and dequantizes
// to the same values; a model of each gives the same logits repacked or not, mapped or copied
// (--no-mmap), on the fast kernels and on the forced reference; what is not repackable (short
// rows, other dtypes) stays as it was.
// Also where the weights go by default (resolve_weight_memory: copied when that suits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend_ops.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/registry.h"
#include "model/model.h"
#include "model/repack.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

// Random Q8_0 blocks over the whole int8 range (-128 too, which ggml's quantizer never writes).
std::vector<BlockQ8_0> random_blocks(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> q(-128, 127), h(0, 0x7bff);
  std::vector<BlockQ8_0> b(static_cast<size_t>(n));
  for (auto& blk : b) {
    blk.d = static_cast<uint16_t>(h(rng));
    for (auto& v : blk.qs) v = static_cast<int8_t>(q(rng));
  }
  return b;
}

TEST(Repack, RoundTripsExactlyAndInPlace) {
  for (int64_t groups : {1, 3, 64}) {
    auto src = random_blocks(8 * groups, static_cast<uint32_t>(groups));
    std::vector<BlockQ8_0x8> packed(static_cast<size_t>(groups));
    pack_q8_0_x8(src.data(), packed.data(), groups);
    // The layout: block j's value 4c + k at qs[32c + 4j + k], plus 128.
    EXPECT_EQ(packed[0].qs[32 * 2 + 4 * 5 + 3], static_cast<uint8_t>(src[5].qs[4 * 2 + 3] + 128));
    EXPECT_EQ(packed[0].d[7], src[7].d);
    std::vector<BlockQ8_0> back(src.size());
    unpack_q8_0_x8(packed.data(), back.data(), groups);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockQ8_0)), 0) << groups << " groups";
    // In place: the same bytes as the out-of-place repacking.
    std::vector<BlockQ8_0> inplace = src;
    pack_q8_0_x8(inplace.data(), reinterpret_cast<BlockQ8_0x8*>(inplace.data()), groups);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockQ8_0x8)), 0);
    unpack_q8_0_x8(reinterpret_cast<const BlockQ8_0x8*>(inplace.data()), inplace.data(), groups);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockQ8_0)), 0);
    // Dequantized: the same floats as the Q8_0 blocks.
    const int64_t n = groups * QK8_0X8;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q8_0, src.data(), a.data(), n);
    dequantize_row(DType::Q8_0_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::Q8_0_X8, 2048), row_bytes(DType::Q8_0, 2048));
  EXPECT_THROW(row_bytes(DType::Q8_0_X8, 32), Error);  // a row holds whole groups of 256
}

// Random Q4_K super-blocks: every bit of the scales and the nibbles random.
std::vector<BlockQ4_K> random_q4_k(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  std::vector<BlockQ4_K> b(static_cast<size_t>(n));
  for (auto& blk : b) {
    blk.d = static_cast<uint16_t>(h(rng));
    blk.dmin = static_cast<uint16_t>(h(rng));
    for (auto& v : blk.scales) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : blk.qs) v = static_cast<uint8_t>(byte(rng));
  }
  return b;
}

TEST(Repack, Q4_KRoundTripsExactlyAndInPlace) {
  for (int64_t blocks : {1, 3, 64}) {
    const auto src = random_q4_k(blocks, static_cast<uint32_t>(blocks));
    std::vector<BlockQ4_Kx8> packed(static_cast<size_t>(blocks));
    pack_q4_k_x8(src.data(), packed.data(), blocks);
    // The layout: sub-block 3 (the high nibbles of Q4_K's qs[32..63]) value 4 * 2 + 1 sits in the
    // low nibble of qs[32 * 2 + 4 * 3 + 1], its value 16 + 4 * 2 + 1 in the high nibble; scale 3
    // is the low 6 bits of byte 3 (Q4_K: the low 6 bits of scales[3]).
    EXPECT_EQ(packed[0].qs[32 * 2 + 4 * 3 + 1] & 15, src[0].qs[32 + 4 * 2 + 1] >> 4);
    EXPECT_EQ(packed[0].qs[32 * 2 + 4 * 3 + 1] >> 4, src[0].qs[32 + 16 + 4 * 2 + 1] >> 4);
    EXPECT_EQ(packed[0].scales[3] & 63, src[0].scales[3] & 63);
    std::vector<BlockQ4_K> back(src.size());
    unpack_q4_k_x8(packed.data(), back.data(), blocks);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockQ4_K)), 0) << blocks << " blocks";
    std::vector<BlockQ4_K> inplace = src;
    pack_q4_k_x8(inplace.data(), reinterpret_cast<BlockQ4_Kx8*>(inplace.data()), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockQ4_Kx8)), 0);
    unpack_q4_k_x8(reinterpret_cast<const BlockQ4_Kx8*>(inplace.data()), inplace.data(), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockQ4_K)), 0);
    const int64_t n = blocks * QK_K;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q4_K, src.data(), a.data(), n);
    dequantize_row(DType::Q4_K_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::Q4_K_X8, 2048), row_bytes(DType::Q4_K, 2048));
}

// Random Q6_K super-blocks: every bit of the values and scales random.
std::vector<BlockQ6_K> random_q6_k(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  std::vector<BlockQ6_K> b(static_cast<size_t>(n));
  for (auto& blk : b) {
    blk.d = static_cast<uint16_t>(h(rng));
    for (auto& v : blk.ql) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : blk.qh) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : blk.scales) v = static_cast<int8_t>(byte(rng) - 128);
  }
  return b;
}

TEST(Repack, Q6_KRoundTripsExactlyAndInPlace) {
  for (int64_t blocks : {1, 3, 64}) {
    const auto src = random_q6_k(blocks, static_cast<uint32_t>(blocks) + 7);
    std::vector<BlockQ6_Kx8> packed(static_cast<size_t>(blocks));
    pack_q6_k_x8(src.data(), packed.data(), blocks);
    // The layout: block 5's value 30 = 16 + 4t + k (t = 3, k = 2) is the super-block's value 190,
    // in Q6_K the low nibble of ql[64 + 62] with bits 2..3 of qh[32 + 30] (the second half's value
    // 32 + 30); Q6_K_X8 keeps its low bits in ql[32 * 3 + 4 * 5 + 2]'s high nibble and its high bits
    // in qh[32 * 1 + 4 * 5 + 2] at bits 6..7 (chunk 2u + 1 = 3, the high-nibble value).
    EXPECT_EQ(packed[0].ql[32 * 3 + 4 * 5 + 2] >> 4, src[0].ql[64 + 62] & 15);
    EXPECT_EQ(packed[0].qh[32 + 4 * 5 + 2] >> 6, (src[0].qh[32 + 30] >> 2) & 3);
    EXPECT_EQ(packed[0].scales[8 + 5], src[0].scales[11]);
    std::vector<BlockQ6_K> back(src.size());
    unpack_q6_k_x8(packed.data(), back.data(), blocks);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockQ6_K)), 0) << blocks << " blocks";
    std::vector<BlockQ6_K> inplace = src;
    pack_q6_k_x8(inplace.data(), reinterpret_cast<BlockQ6_Kx8*>(inplace.data()), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockQ6_Kx8)), 0);
    unpack_q6_k_x8(reinterpret_cast<const BlockQ6_Kx8*>(inplace.data()), inplace.data(), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockQ6_K)), 0);
    const int64_t n = blocks * QK_K;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q6_K, src.data(), a.data(), n);
    dequantize_row(DType::Q6_K_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::Q6_K_X8, 2048), row_bytes(DType::Q6_K, 2048));
}

// Random Q3_K super-blocks, every bit random (finite d): repacked and back exactly, in place too.
TEST(Repack, Q3_KRoundTripsExactlyAndInPlace) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  for (int64_t blocks : {1, 3, 64}) {
    std::vector<BlockQ3_K> src(static_cast<size_t>(blocks));
    for (auto& b : src) {
      for (auto& v : b.hmask) v = static_cast<uint8_t>(byte(rng));
      for (auto& v : b.qs) v = static_cast<uint8_t>(byte(rng));
      for (auto& v : b.scales) v = static_cast<uint8_t>(byte(rng));
      b.d = static_cast<uint16_t>(h(rng));
    }
    std::vector<BlockQ3_Kx8> packed(static_cast<size_t>(blocks));
    pack_q3_k_x8(src.data(), packed.data(), blocks);
    // The layout: block j's value 4c + k (3 bits) from the plane and the mask; its scales.
    uint8_t q[QK_K];
    q3_k_values(src[0], q);
    int8_t sc[16];
    q3_k_scales(src[0].scales, sc);
    for (int j : {0, 5, 7})
      for (int c = 0; c < 8; ++c) {
        const int k = (j + c) % 4, t = c % 4, shift = 4 * (t % 2) + 2 * (c / 4);
        const int low = packed[0].qs[32 * (t / 2) + 4 * j + k] >> shift & 3, high = packed[0].hmask[4 * j + k] >> c & 1;
        EXPECT_EQ(low | high << 2, q[32 * j + 4 * c + k]) << "block " << j << " chunk " << c;
      }
    uint32_t top;
    std::memcpy(&top, packed[0].scales + 8, 4);
    EXPECT_EQ(((packed[0].scales[6] >> 4) | (top >> (16 + 12) & 3) << 4) - 32, sc[13]);
    std::vector<BlockQ3_K> back(src.size());
    unpack_q3_k_x8(packed.data(), back.data(), blocks);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockQ3_K)), 0) << blocks << " blocks";
    std::vector<BlockQ3_K> inplace = src;
    pack_q3_k_x8(inplace.data(), reinterpret_cast<BlockQ3_Kx8*>(inplace.data()), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockQ3_Kx8)), 0);
    unpack_q3_k_x8(reinterpret_cast<const BlockQ3_Kx8*>(inplace.data()), inplace.data(), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockQ3_K)), 0);
    const int64_t n = blocks * QK_K;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q3_K, src.data(), a.data(), n);
    dequantize_row(DType::Q3_K_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::Q3_K_X8, 2048), row_bytes(DType::Q3_K, 2048));
  EXPECT_EQ(repacked_dtype(DType::Q3_K), DType::Q3_K_X8);
}

// Random Q2_K super-blocks, every bit random (finite d, dmin): repacked and back exactly, in place too.
TEST(Repack, Q2_KRoundTripsExactlyAndInPlace) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  for (int64_t blocks : {1, 3, 64}) {
    std::vector<BlockQ2_K> src(static_cast<size_t>(blocks));
    for (auto& b : src) {
      for (auto& v : b.scales) v = static_cast<uint8_t>(byte(rng));
      for (auto& v : b.qs) v = static_cast<uint8_t>(byte(rng));
      b.d = static_cast<uint16_t>(h(rng));
      b.dmin = static_cast<uint16_t>(h(rng));
    }
    std::vector<BlockQ2_Kx8> packed(static_cast<size_t>(blocks));
    pack_q2_k_x8(src.data(), packed.data(), blocks);
    // The layout: block j's value 4c + k from the plane (Q2_K: bits 2s of qs[32h + l] for value
    // 128h + 32s + l); its groups' scale bytes.
    for (int j : {0, 3, 6})
      for (int c = 0; c < 8; ++c) {
        const int k = (j + 2 * c) % 4, t = c % 4, shift = 4 * (t % 2) + 2 * (c / 4), v = 32 * j + 4 * c + k;
        EXPECT_EQ(packed[0].qs[32 * (t / 2) + 4 * j + k] >> shift & 3, src[0].qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4)) & 3)
            << "block " << j << " chunk " << c;
      }
    EXPECT_EQ(packed[0].scales[8 + 3], src[0].scales[7]);
    std::vector<BlockQ2_K> back(src.size());
    unpack_q2_k_x8(packed.data(), back.data(), blocks);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockQ2_K)), 0) << blocks << " blocks";
    std::vector<BlockQ2_K> inplace = src;
    pack_q2_k_x8(inplace.data(), reinterpret_cast<BlockQ2_Kx8*>(inplace.data()), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockQ2_Kx8)), 0);
    unpack_q2_k_x8(reinterpret_cast<const BlockQ2_Kx8*>(inplace.data()), inplace.data(), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockQ2_K)), 0);
    const int64_t n = blocks * QK_K;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q2_K, src.data(), a.data(), n);
    dequantize_row(DType::Q2_K_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::Q2_K_X8, 2048), row_bytes(DType::Q2_K, 2048));
  EXPECT_EQ(repacked_dtype(DType::Q2_K), DType::Q2_K_X8);
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 groups of 8 blocks: every byte random (finite f16
// scales and minimums; MXFP4's scale bytes any), repacked and back exactly (in place too),
// dequantizing to the same floats.
// Q4_0 / IQ4_NL / MXFP4 rows of any multiple of 32: the blocks after the last whole group form a
// partial group (core/dtype.h): the n scales, then chunk t = every block's bytes 4t..4t+3. Rows
// with 1..7 such blocks, after 0, 1 and 4 whole groups, pack and unpack exactly (in place too),
// dequantize as the file layout does, and keep the layout the decode kernels' masked loads read.
TEST(Repack, RowsEndingInAPartialGroupRoundTripExactly) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  for (DType base : {DType::Q4_0, DType::IQ4_NL, DType::MXFP4}) {
    const DType packed_type = block32_x8(base);
    SCOPED_TRACE(dtype_name(packed_type));
    const int64_t bb = dtype_info(base).block_bytes, sb = bb - 16;
    for (int64_t groups : {0, 1, 4})
      for (int64_t tail = 1; tail < 8; ++tail) {
        const int64_t n = groups * 256 + tail * 32, blocks = n / 32;
        std::vector<uint8_t> src(static_cast<size_t>(blocks * bb));
        for (auto& v : src) v = static_cast<uint8_t>(byte(rng));
        if (sb == 2)
          for (int64_t b = 0; b < blocks; ++b) {
            const auto v = static_cast<uint16_t>(h(rng));
            std::memcpy(src.data() + b * bb, &v, 2);
          }
        std::vector<uint8_t> packed(src.size()), back(src.size());
        pack_block32_x8_row(base, src.data(), packed.data(), n);
        unpack_block32_x8_row(packed_type, packed.data(), back.data(), n);
        ASSERT_EQ(back, src) << n << " values";
        std::vector<uint8_t> inplace = src;
        pack_block32_x8_row(base, inplace.data(), inplace.data(), n);
        ASSERT_EQ(inplace, packed);
        unpack_block32_x8_row(packed_type, inplace.data(), inplace.data(), n);
        ASSERT_EQ(inplace, src);
        std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        dequantize_row(base, src.data(), a.data(), n);
        dequantize_row(packed_type, packed.data(), b.data(), n);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << n << " values";
        // The partial group's layout: block j's scale at sb * j, its byte 4t + k at sb * tail + 4 * tail * t + 4j + k.
        const uint8_t* part = packed.data() + groups * 8 * bb;
        const uint8_t* plain = src.data() + groups * 8 * bb;
        for (int64_t j = 0; j < tail; ++j) {
          ASSERT_EQ(std::memcmp(part + sb * j, plain + bb * j, static_cast<size_t>(sb)), 0);
          for (int t = 0; t < 4; ++t)
            ASSERT_EQ(std::memcmp(part + sb * tail + 4 * tail * t + 4 * j, plain + bb * j + sb + 4 * t, 4), 0) << j << " " << t;
        }
      }
  }
}

TEST(Repack, Block32FormatsRoundTripExactlyAndInPlace) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  for (DType base : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4}) {
    const DType packed_type = block32_x8(base);
    SCOPED_TRACE(dtype_name(packed_type));
    EXPECT_EQ(block32_base(packed_type), base);
    EXPECT_EQ(repacked_dtype(base), packed_type);
    const int64_t block_bytes = dtype_info(base).block_bytes;
    for (int64_t groups : {1, 3, 64}) {
      std::vector<uint8_t> src(static_cast<size_t>(8 * groups * block_bytes));
      for (auto& v : src) v = static_cast<uint8_t>(byte(rng));
      for (int64_t b = 0; b < 8 * groups; ++b) {  // d (and m) are the block's first f16 values
        const int halves = base == DType::Q4_1 || base == DType::Q5_1 ? 2 : 1;
        for (int k = 0; k < halves; ++k) {
          const auto v = static_cast<uint16_t>(h(rng));
          std::memcpy(src.data() + b * block_bytes + 2 * k, &v, 2);
        }
      }
      std::vector<uint8_t> packed(src.size()), back(src.size());
      pack_block32_x8(base, src.data(), packed.data(), groups);
      unpack_block32_x8(packed_type, packed.data(), back.data(), groups);
      ASSERT_EQ(back, src) << groups << " groups";
      std::vector<uint8_t> inplace = src;
      pack_block32_x8(base, inplace.data(), inplace.data(), groups);
      ASSERT_EQ(inplace, packed);
      unpack_block32_x8(packed_type, inplace.data(), inplace.data(), groups);
      ASSERT_EQ(inplace, src);
      const int64_t n = groups * 256;
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      dequantize_row(base, src.data(), a.data(), n);
      dequantize_row(packed_type, packed.data(), b.data(), n);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
    EXPECT_EQ(row_bytes(packed_type, 2048), row_bytes(base, 2048));
  }
  // The layout, on Q5_1: block j's byte 4t + k at qs[32t + 4j + k]; its fifth bit of value 4c + k
  // at bit c of qh[4j + k].
  std::vector<BlockQ5_1> blocks(8);
  for (auto& b : blocks) {
    b.d = static_cast<uint16_t>(h(rng));
    b.m = static_cast<uint16_t>(h(rng));
    for (auto& v : b.qh) v = static_cast<uint8_t>(byte(rng));
    for (auto& v : b.qs) v = static_cast<uint8_t>(byte(rng));
  }
  BlockQ5_1x8 p;
  pack_block32_x8(DType::Q5_1, blocks.data(), &p, 1);
  EXPECT_EQ(p.qs[32 * 2 + 4 * 5 + 3], blocks[5].qs[4 * 2 + 3]);
  EXPECT_EQ(p.d[6], blocks[6].d);
  EXPECT_EQ(p.m[7], blocks[7].m);
  uint32_t qh5;
  std::memcpy(&qh5, blocks[5].qh, 4);
  for (int c = 0; c < 8; ++c) EXPECT_EQ(p.qh[4 * 5 + 1] >> c & 1, qh5 >> (4 * c + 1) & 1) << "chunk " << c;
}

// Random IQ4_XS super-blocks (every bit random, finite d): repacked and back exactly, in place too;
// the layout: block j's byte 4t + k (qs[16j + 4t + k]) at qs[32t + 4j + k], d and scales unmoved.
TEST(Repack, IQ4_XSRoundTripsExactlyAndInPlace) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255), h(0, 0x7bff);
  for (int64_t blocks : {1, 5, 64}) {
    std::vector<BlockIQ4_XS> src(static_cast<size_t>(blocks));
    for (auto& b : src) {
      for (size_t i = 0; i < sizeof b; ++i) reinterpret_cast<uint8_t*>(&b)[i] = static_cast<uint8_t>(byte(rng));
      b.d = static_cast<uint16_t>(h(rng));
    }
    std::vector<BlockIQ4_XSx8> packed(static_cast<size_t>(blocks));
    pack_iq4_xs_x8(src.data(), packed.data(), blocks);
    EXPECT_EQ(packed[0].qs[32 * 3 + 4 * 6 + 2], src[0].qs[16 * 6 + 4 * 3 + 2]);
    EXPECT_EQ(packed[0].d, src[0].d);
    EXPECT_EQ(packed[0].scales_h, src[0].scales_h);
    EXPECT_EQ(std::memcmp(packed[0].scales_l, src[0].scales_l, 4), 0);
    std::vector<BlockIQ4_XS> back(src.size());
    unpack_iq4_xs_x8(packed.data(), back.data(), blocks);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), src.size() * sizeof(BlockIQ4_XS)), 0) << blocks << " blocks";
    std::vector<BlockIQ4_XS> inplace = src;
    pack_iq4_xs_x8(inplace.data(), reinterpret_cast<BlockIQ4_XSx8*>(inplace.data()), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), packed.data(), packed.size() * sizeof(BlockIQ4_XSx8)), 0);
    unpack_iq4_xs_x8(reinterpret_cast<const BlockIQ4_XSx8*>(inplace.data()), inplace.data(), blocks);
    ASSERT_EQ(std::memcmp(inplace.data(), src.data(), src.size() * sizeof(BlockIQ4_XS)), 0);
    const int64_t n = blocks * QK_K;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::IQ4_XS, src.data(), a.data(), n);
    dequantize_row(DType::IQ4_XS_X8, packed.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(row_bytes(DType::IQ4_XS_X8, 2048), row_bytes(DType::IQ4_XS, 2048));
  EXPECT_EQ(repacked_dtype(DType::IQ4_XS), DType::IQ4_XS_X8);
}

TEST(Repack, OnlyRepackableFormatsAndMatricesOfWholeGroups) {
  std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes(DType::Q8_0, 512) * 4));
  EXPECT_TRUE(repackable(Tensor::view(bytes.data(), DType::Q8_0, {4, 512})));
  EXPECT_FALSE(repackable(Tensor::view(bytes.data(), DType::Q8_0, {8, 224})));  // 7 blocks a row
  EXPECT_TRUE(repackable(Tensor::view(bytes.data(), DType::Q4_0, {4, 512})));
  // Q4_0 / IQ4_NL / MXFP4 rows of any multiple of 32: their _X8 rows may end in plain blocks (here
  // all of a row is); the other 32-value formats keep rows that end inside a group as they are.
  EXPECT_TRUE(repackable(Tensor::view(bytes.data(), DType::Q4_0, {8, 224})));
  EXPECT_TRUE(repackable(Tensor::view(bytes.data(), DType::IQ4_NL, {4, 288})));
  EXPECT_FALSE(repackable(Tensor::view(bytes.data(), DType::Q4_1, {8, 224})));
  EXPECT_FALSE(repackable(Tensor::view(bytes.data(), DType::Q5_1, {2, 2, 512})));  // an expert stack of a 32-value format
  EXPECT_FALSE(repackable(Tensor::view(bytes.data(), DType::Q5_K, {2, 512})));  // no _X8 form
  EXPECT_TRUE(repackable(Tensor::view(bytes.data(), DType::Q8_0, {2, 2, 512})));    // a Q8_0 expert stack: rows
  EXPECT_FALSE(repackable(Tensor::view(bytes.data(), DType::Q8_0, {2, 2, 224})));   // ... of 7 blocks: stays
  Tensor t = Tensor::view(bytes.data(), DType::Q8_0, {4, 512});
  EXPECT_TRUE(repack_in_place(t));
  EXPECT_EQ(t.dtype, DType::Q8_0_X8);
  EXPECT_FALSE(repack_in_place(t));  // already repacked
  std::vector<uint8_t> k_bytes(static_cast<size_t>(row_bytes(DType::Q4_K, 512) * 4));
  Tensor k = Tensor::view(k_bytes.data(), DType::Q4_K, {4, 512});
  EXPECT_TRUE(repackable(Tensor::view(k_bytes.data(), DType::Q6_K, {2, 512})));
  EXPECT_EQ(repacked_dtype(DType::Q6_K), DType::Q6_K_X8);
  EXPECT_TRUE(repackable(Tensor::view(k_bytes.data(), DType::Q4_K, {2, 2, 512})));  // a K-quant expert stack: rows
  EXPECT_TRUE(repack_in_place(k));
  EXPECT_EQ(k.dtype, DType::Q4_K_X8);
  EXPECT_EQ(repacked_dtype(DType::Q5_K), DType::Q5_K);
}

std::string synth_q8(const std::string& dir, const std::string& name, nlohmann::json cfg, DType type = DType::Q8_0) {
  SynthOptions o;
  o.arch = "llama";
  o.config = std::move(cfg);
  o.type = type;
  o.seed = 5;
  o.out = dir + "/" + name;
  synth_model(o);
  return o.out;
}

// Every position of a prompt as one batch (the GEMM path), then two tokens decoded (GEMV).
std::vector<float> logits(const std::string& path, bool repack, bool mmap, DType* output_type = nullptr) {
  LoadOptions lo;
  lo.prefault = false;
  lo.repack = repack;
  lo.weights = mmap ? WeightMemory::Mapped : WeightMemory::Copied;
  auto m = load_model(path, lo);
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42, 260, 7, 511, 3, 128};
  const int64_t n = static_cast<int64_t>(ids.size()), V = m->config().n_vocab;
  auto cache = m->new_cache(n + 2);
  std::vector<float> out(static_cast<size_t>((n + 2) * V));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  m->forward(ids.data(), pos.data(), n, *cache, out.data(), true);
  for (int32_t p = static_cast<int32_t>(n), id = 9; p < n + 2; ++p, id += 30) m->forward(&id, &p, 1, *cache, out.data() + p * V, false);
  if (output_type) *output_type = m->file().get("token_embd.weight").dtype;
  return out;
}

// Logits of 512-token rows: every position within 1e-5 (normalised) but at most one, and all
// within `bound`.
void expect_same_but_one_position(const std::vector<float>& got, const std::vector<float>& want, double bound) {
  EXPECT_LE(test::normalised_error(got, want), bound);
  const int64_t V = 512, positions = static_cast<int64_t>(want.size()) / V;
  int off = 0;
  for (int64_t p = 0; p < positions; ++p) {
    const std::vector<float> a(got.begin() + p * V, got.begin() + (p + 1) * V), b(want.begin() + p * V, want.begin() + (p + 1) * V);
    off += test::normalised_error(a, b) > 1e-5;
  }
  EXPECT_LE(off, 1) << "positions beyond 1e-5";
}

// gpt-oss's MXFP4 expert stacks repack into MXFP4_X8 at load: the same logits as the file's
// layout (every position but one within 1e-5, all within 2e-3, as above), and the reference
// kernels read both to the same floats exactly. Rows of 288 values (as gpt-oss's 2880) end inside
// a group: their last block stays plain.
TEST(Repack, GptOssMxfp4ExpertsGiveTheSameLogits) {
  for (int64_t width : {256, 288}) {
    SCOPED_TRACE("hidden and expert width " + std::to_string(width));
    const std::string dir = test::temp_dir("repack_gpt_oss");
    SynthOptions o;
    o.arch = "gpt_oss";
    o.config = {{"hidden_size", width}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
                {"intermediate_size", width == 256 ? 512 : width}, {"num_hidden_layers", 2}, {"vocab_size", 512},
                {"num_local_experts", 4}, {"sliding_window", 4}};
    o.type = DType::MXFP4;
    o.seed = 9;
    o.out = dir + "/m" + std::to_string(width) + ".gguf";
    synth_model(o);
    {
      LoadOptions lo;
      lo.prefault = false;
      auto m = load_model(o.out, lo);
      EXPECT_EQ(m->file().get("blk.0.ffn_up_exps.weight").dtype, DType::MXFP4_X8) << "the expert stacks were not repacked";
    }
    const auto plain = logits(o.out, false, true), packed = logits(o.out, true, true);
    expect_same_but_one_position(packed, plain, 2e-3);
    KernelOverrides::global().force("matmul", "ref");
    invalidate_all_dispatch();
    const auto ref_plain = logits(o.out, false, true), ref_packed = logits(o.out, true, true);
    KernelOverrides::global().clear();
    invalidate_all_dispatch();
    EXPECT_EQ(ref_plain, ref_packed);
  }
}

TEST(Repack, ModelGivesTheSameLogits) {
  const std::string dir = test::temp_dir("repack_model");
  for (DType type : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q3_K, DType::Q2_K, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                     DType::IQ4_NL, DType::IQ4_XS})
  for (bool tied : {true, false}) {
    // Rows of 256 and 512 values repack; the 96-wide FFN of the second Q8_0 model leaves
    // ffn_down (rows of 96) and nothing else changes. (K-quant rows are whole super-blocks.)
    for (int64_t ffn : {512, 96}) {
      if (dtype_info(type).block_elems == QK_K && ffn % QK_K != 0) continue;
      const std::string path = synth_q8(dir, std::string(dtype_name(type)) + std::to_string(tied) + std::to_string(ffn) + ".gguf",
                                        {{"hidden_size", 256}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                         {"intermediate_size", ffn}, {"vocab_size", 512}, {"num_hidden_layers", 2},
                                         {"tie_word_embeddings", tied}}, type);
      SCOPED_TRACE(path);
      const DType packed_type = repacked_dtype(type);
      DType plain_t, packed_t, copied_t;
      const auto plain = logits(path, false, true, &plain_t);
      const auto packed = logits(path, true, true, &packed_t);
      const auto copied = logits(path, true, false, &copied_t);
      EXPECT_EQ(plain_t, type);
      EXPECT_EQ(packed_t, tied ? packed_type : type);  // the table is repacked when it is the output too
      EXPECT_EQ(copied_t, packed_t);
      // Same integer products; the float sums may run in another order, and a last-bit difference
      // can flip the rounding of one 8-bit activation downstream (seen once, at one position, on
      // IQ4_NL with a 96-wide FFN: 1e-3 there). So: every position but at most one within 1e-5, all
      // within 2e-3 (a wrong kernel moves every position, by far more).
      expect_same_but_one_position(packed, plain, 2e-3);
      EXPECT_EQ(packed, copied);
      // The reference kernel reads the repacked weights too (dequantized, exactly).
      KernelOverrides::global().force("matmul", "ref");
      invalidate_all_dispatch();
      const auto ref_plain = logits(path, false, true), ref_packed = logits(path, true, true);
      KernelOverrides::global().clear();
      invalidate_all_dispatch();
      EXPECT_EQ(ref_packed, ref_plain);
      EXPECT_LE(test::normalised_error(plain, ref_plain), 0.02);  // 8-bit activations vs f32
    }
  }
}

// MoE models: their K-quant expert stacks (3-D), shared experts, dense FFNs and output (and
// qwen3moe's attention) are repacked as they load, and the logits stay those of the file layout's
// kernels; the reference kernels read the repacked bytes exactly.
TEST(Repack, MoeModelsRepackTheirExpertsAndGiveTheSameLogits) {
  const std::string dir = test::temp_dir("repack_moe");
  struct Case {
    const char* arch;
    DType type;
    nlohmann::json config;
  };
  const Case cases[] = {
      {"qwen3_moe", DType::Q4_K,
       {{"hidden_size", 256}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
        {"intermediate_size", 256}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_experts", 4},
        {"num_experts_per_tok", 2}, {"moe_intermediate_size", 256}}},
      {"deepseek_v3", DType::Q6_K,
       {{"hidden_size", 256}, {"num_attention_heads", 2}, {"intermediate_size", 256}, {"num_hidden_layers", 2},
        {"vocab_size", 512}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 256},
        {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"q_lora_rank", 256}, {"kv_lora_rank", 256},
        {"qk_rope_head_dim", 64}, {"qk_nope_head_dim", 256}, {"v_head_dim", 256}}},
      {"qwen3_moe", DType::IQ4_XS,
       {{"hidden_size", 256}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
        {"intermediate_size", 256}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_experts", 4},
        {"num_experts_per_tok", 2}, {"moe_intermediate_size", 256}}},
      {"glm4_moe", DType::Q8_0,  // Q8_0 stacks (and the shared expert) repacked too
       {{"hidden_size", 256}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
        {"intermediate_size", 256}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"n_routed_experts", 4},
        {"num_experts_per_tok", 2}, {"moe_intermediate_size", 256}, {"n_shared_experts", 1}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.arch) + " " + dtype_name(c.type));
    SynthOptions o;
    o.arch = c.arch;
    o.config = c.config;
    o.type = c.type;
    o.seed = 11;
    o.out = dir + "/" + c.arch + dtype_name(c.type) + ".gguf";
    synth_model(o);
    const auto plain = logits(o.out, false, true), packed = logits(o.out, true, false);
    // As above; IQ4_XS's one position off (1.4e-2 at most, at one position whose later neighbours
    // agree) is the last layer's 8-bit rounding or top-k choice flipped by a last-bit difference.
    // Plain Q8_0 experts on a CPU without VNNI take the MoE GEMV's f32 activations where the
    // repacked ones take 8-bit activations: the same logits only to that rounding.
    const bool vnni = cpu_features().missing({"avx512f", "avx512vl", "avx512bw", "avx512_vnni"}).empty() ||
                      cpu_features().missing({"avx_vnni"}).empty();
    if (c.type == DType::Q8_0 && !vnni) EXPECT_LE(test::normalised_error(packed, plain), 1e-2);
    else expect_same_but_one_position(packed, plain, 1e-2);
    LoadOptions lo;
    lo.prefault = false;
    auto m = load_model(o.out, lo);
    EXPECT_EQ(m->file().get("blk.1.ffn_gate_exps.weight").dtype, repacked_dtype(c.type));
    EXPECT_EQ(m->file().get("blk.1.ffn_down_exps.weight").dtype, repacked_dtype(c.type));
    if (m->file().find("blk.1.ffn_gate_shexp.weight")) {
      EXPECT_EQ(m->file().get("blk.1.ffn_gate_shexp.weight").dtype, repacked_dtype(c.type));
    }
    // The reference matmul under both layouts (the plain Q8_0 experts' own MoE GEMV bypasses the
    // matmul op: the grouped kernel runs them through it).
    KernelOverrides::global().force("matmul", "ref");
    KernelOverrides::global().force("moe_ffn", "grouped");
    invalidate_all_dispatch();
    const auto ref_plain = logits(o.out, false, true), ref_packed = logits(o.out, true, true);
    KernelOverrides::global().clear();
    invalidate_all_dispatch();
    EXPECT_EQ(ref_packed, ref_plain);
  }
}

TEST(WeightMemory, AutoCopiesWhenTheWeightsFitAndSaysWhy) {
  const uint64_t gib = uint64_t{1} << 30;
  std::string why;
  // Copied: one CPU rank, weights at most half of what is available.
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Auto, 2 * gib, 4 * gib, Device::CPU, false, &why), WeightMemory::Copied);
  EXPECT_NE(why.find("2.00 GiB copied"), std::string::npos) << why;
  EXPECT_NE(why.find("4.00 GiB available"), std::string::npos) << why;
  // Mapped, each with its reason: over half the memory, unknown memory, another device, several ranks.
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Auto, 2 * gib + 1, 4 * gib, Device::CPU, false, &why), WeightMemory::Mapped);
  EXPECT_NE(why.find("more than half of the available memory, 4.00 GiB"), std::string::npos) << why;
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Auto, 3 << 19, 0, Device::CPU, false, &why), WeightMemory::Mapped);
  EXPECT_NE(why.find("1.50 MiB mapped"), std::string::npos) << why;
  EXPECT_NE(why.find("unknown"), std::string::npos) << why;
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Auto, 1, 4 * gib, Device::CUDA, false, &why), WeightMemory::Mapped);
  EXPECT_NE(why.find("runs on cuda"), std::string::npos) << why;
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Auto, 1, 4 * gib, Device::CPU, true, &why), WeightMemory::Mapped);
  EXPECT_NE(why.find("several ranks"), std::string::npos) << why;
  // Forced either way, whatever the sizes.
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Copied, 8 * gib, 4 * gib, Device::CPU, true, &why), WeightMemory::Copied);
  EXPECT_NE(why.find("--no-mmap"), std::string::npos) << why;
  EXPECT_EQ(resolve_weight_memory(WeightMemory::Mapped, 1, 4 * gib, Device::CPU, false, &why), WeightMemory::Mapped);
  EXPECT_NE(why.find("--mmap"), std::string::npos) << why;
}

TEST(WeightMemory, DefaultLoadCopiesASmallModelAndNotesIt) {
  const std::string path = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto def = load_model_file(path);
  EXPECT_TRUE(def->weights_writable);
  bool noted = false;
  for (const auto& n : def->notes) noted = noted || n.find("copied into huge-page memory") != std::string::npos;
  EXPECT_TRUE(noted);
  LoadOptions lo;
  lo.weights = WeightMemory::Mapped;
  EXPECT_FALSE(load_model_file(path, lo)->weights_writable);
}

}  // namespace
}  // namespace fp
