// tests/parallel_test.cpp — the single-rank side of parallel/: splitting ranges on block
// boundaries, row views and column copies of F32 and Q8_0 weights (same values as the whole),
// the collective ops on one rank (and their ledger entries), and the errors for ranks this
// process does not have. The multi-rank suites are in tests/mpi/ (run under mpirun).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/ledger.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "parallel/shard.h"

namespace fp {
namespace {

TEST(SplitRange, EqualPiecesThenTheRemainderOnTheFirstRanks) {
  Range a = split_range(172, 2, 0, 1, "w"), b = split_range(172, 2, 1, 1, "w");
  EXPECT_EQ(a.begin, 0);
  EXPECT_EQ(a.len, 86);
  EXPECT_EQ(b.begin, 86);
  EXPECT_EQ(b.len, 86);
  // 96 in blocks of 32 over 2 ranks: 64 + 32.
  EXPECT_EQ(split_range(96, 2, 0, 32, "w").len, 64);
  Range c = split_range(96, 2, 1, 32, "w");
  EXPECT_EQ(c.begin, 64);
  EXPECT_EQ(c.len, 32);
}

TEST(SplitRange, RefusesEmptyPiecesAndMisalignedTotals) {
  EXPECT_THROW(split_range(64, 3, 0, 32, "FFN width"), Error);  // 2 blocks over 3 ranks
  try {
    split_range(100, 2, 0, 32, "FFN width");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FFN width: 100 is not a multiple of 32"), std::string::npos) << e.what();
  }
}

// A [rows, cols] weight of type t from random values, and those values dequantized.
struct RandomWeight {
  std::vector<uint8_t> bytes;
  Tensor t;
  std::vector<float> values;  // what the stored weight holds, [rows, cols]
};
RandomWeight make_weight(DType type, int64_t rows, int64_t cols) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> src(static_cast<size_t>(rows * cols));
  for (float& v : src) v = u(rng);
  RandomWeight w;
  w.bytes.resize(static_cast<size_t>(rows * row_bytes(type, cols)));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, src.data() + r * cols, w.bytes.data() + r * row_bytes(type, cols), cols);
  w.t = Tensor::view(w.bytes.data(), type, {rows, cols});
  w.values.resize(src.size());
  for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w.t.row_ptr(r), w.values.data() + r * cols, cols);
  return w;
}

TEST(Shard, RowViewsAndColumnCopiesHoldTheWholeWeightsValues) {
  for (DType type : {DType::F32, DType::Q8_0}) {
    const int64_t rows = 6, cols = 128;
    RandomWeight w = make_weight(type, rows, cols);
    Tensor rv = slice_rows(w.t, Range{2, 3});
    EXPECT_EQ(rv.data, w.t.row_ptr(2)) << "a row slice is a view, not a copy";
    OwnedTensor cv = copy_columns(w.t, Range{32, 64});
    ASSERT_EQ(cv.view.dim(0), rows);
    ASSERT_EQ(cv.view.dim(1), 64);
    std::vector<float> row(64);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(type, cv.view.row_ptr(r), row.data(), 64);
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(row[static_cast<size_t>(c)], w.values[static_cast<size_t>(r * cols + 32 + c)]);
    }
  }
}

// FP8 block-scaled (DeepSeek-V3's weight + weight_scale_inv): a column copy keeps the values and
// the scale tiles of its columns, so every element dequantizes as in the whole weight; cuts fall
// on the 128-column scale blocks, the last one may end at a partial block.
TEST(Shard, BlockScaledColumnCopiesKeepTheirScaleTiles) {
  const int64_t rows = 200, cols = 320, b = 128, rb = 2, cb = 3;  // partial last blocks both ways
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-400.0f, 400.0f), su(0.001f, 0.1f);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols));
  for (auto& v : bytes) v = f32_to_fp8e4m3(u(rng));
  std::vector<float> scale(static_cast<size_t>(rb * cb));
  for (float& s : scale) s = su(rng);
  Tensor w = Tensor::view(bytes.data(), DType::F8_E4M3, {rows, cols});
  w.block_scale = scale.data();
  w.scale_block = b;
  auto value = [](const Tensor& t, int64_t r, int64_t c) {
    const int64_t sc = (t.dim(1) + t.scale_block - 1) / t.scale_block;
    return fp8e4m3_to_f32(t.row_ptr(r)[c]) * t.block_scale[(r / t.scale_block) * sc + c / t.scale_block];
  };
  EXPECT_EQ(column_alignment(w), 128);
  EXPECT_EQ(row_alignment(w), 128);
  for (Range c : {Range{0, 128}, Range{128, 128}, Range{128, 192}, Range{256, 64}, Range{0, 320}}) {
    OwnedTensor cv = copy_columns(w, c);
    ASSERT_EQ(cv.view.dim(0), rows);
    ASSERT_EQ(cv.view.dim(1), c.len);
    ASSERT_NE(cv.view.block_scale, nullptr);
    ASSERT_NE(cv.view.block_scale, w.block_scale) << "the scales are copied with the values";
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c.len; ++k)
        ASSERT_EQ(value(cv.view, r, k), value(w, r, c.begin + k)) << "columns [" << c.begin << ", " << c.begin + c.len
                                                                  << ") row " << r << " col " << k;
  }
  for (Range c : {Range{64, 128}, Range{0, 192}}) {
    try {
      copy_columns(w, c);
      ADD_FAILURE() << "[" << c.begin << ", " << c.begin + c.len << ") should be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("block-scaled weight [200, 320] holds blocks of 128"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Shard, RefusesAColumnCutInsideABlock) {
  RandomWeight w = make_weight(DType::Q8_0, 2, 64);
  try {
    copy_columns(w.t, Range{16, 48});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds blocks of 32 values per row"), std::string::npos) << e.what();
  }
}

// An interleaved row (MXFP4_X8: groups of 256 values, then a partial group) is cut only at a
// group boundary; a cut that keeps the row's end keeps its partial group whole.
TEST(Shard, RefusesAColumnCutInsideAnInterleavedGroup) {
  RandomWeight w = make_weight(DType::MXFP4, 2, 320);  // one group of 256, a partial group of 2 blocks
  std::vector<uint8_t> packed(w.bytes.size());
  for (int64_t r = 0; r < 2; ++r)
    pack_block32_x8_row(DType::MXFP4, w.t.row_ptr(r), packed.data() + r * row_bytes(DType::MXFP4, 320), 320);
  const Tensor x8 = Tensor::view(packed.data(), DType::MXFP4_X8, {2, 320});
  for (Range cut : {Range{0, 64}, Range{32, 288}, Range{64, 256}}) {
    try {
      copy_columns(x8, cut);
      ADD_FAILURE() << cut.begin << " + " << cut.len;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is interleaved in groups of 256 values per row"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(copy_columns(x8, Range{256, 64}).view.dim(1), 64);  // the partial group, whole
  EXPECT_EQ(copy_columns(x8, Range{0, 256}).view.dim(1), 256);
}

TEST(Collectives, OneRankRunsTheSingleKernelsAndTheLedgerSaysSo) {
  SingleCommunicator one;
  std::vector<float> x = {1, 2, 3}, g(3), rs(3);
  dispatch(AllReduceArgs{&one, x.data(), 3});
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  dispatch(AllGatherArgs{&one, x.data(), g.data(), 12});
  EXPECT_EQ(g, x);
  dispatch(ReduceScatterArgs{&one, x.data(), rs.data(), 3});
  EXPECT_EQ(rs, x);
  int32_t token = 42;
  dispatch(BroadcastArgs{&one, &token, 4, 0});
  EXPECT_EQ(token, 42);
  bool seen = false;
  for (const LedgerEntry& e : Ledger::global().snapshot())
    if (e.op == "all_reduce" && e.shape_class == "f32 sum comm=single ranks=1") {
      seen = true;
      EXPECT_EQ(e.kernel, "single");
    }
  EXPECT_TRUE(seen) << Ledger::global().table();
  EXPECT_THROW(dispatch(BroadcastArgs{&one, &token, 4, 1}), Error);  // there is no rank 1
}

TEST(Collectives, ReferenceKernelsOnOneRank) {
  SingleCommunicator one;
  for (const char* op : {"all_reduce", "all_gather", "all_to_all"}) KernelOverrides::global().force(op, "ref");
  std::vector<float> x = {1, 2, 3}, g(3), a(3);
  dispatch(AllReduceArgs{&one, x.data(), 3});
  dispatch(AllGatherArgs{&one, x.data(), g.data(), 12});
  dispatch(AllToAllArgs{&one, x.data(), a.data(), 12});
  KernelOverrides::global().clear();
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(g, x);
  EXPECT_EQ(a, x);
}

TEST(World, TensorParallelSizeMustMatchTheLaunch) {
  if (launched_world_size() != 1) GTEST_SKIP() << "run under a launcher";
  try {
    open_world(2);
    ADD_FAILURE() << "two ranks without mpirun should be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    // With MPI built: the world has 1 rank; without: this build has no MPI. Both name the size.
    EXPECT_NE(m.find("--tensor-parallel-size 2"), std::string::npos) << m;
    EXPECT_TRUE(m.find("MPI world has 1 rank") != std::string::npos || m.find("needs MPI") != std::string::npos) << m;
  }
  EXPECT_THROW(open_world(0), Error);
}

}  // namespace
}  // namespace fp
