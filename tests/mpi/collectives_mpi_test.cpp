// tests/mpi/collectives_mpi_test.cpp — every collective op on the MPI communicator, with its
// "mpi" kernel (MPI's own collectives) and with the "ref" kernel (point-to-point, rank order),
// against sums and layouts computed locally from each rank's seeded random data, for sizes from
// one element to 64K+; and what the ledger records.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ledger.h"
#include "kernels/registry.h"
#include "mpi_test_util.h"
#include "parallel/collectives.h"

namespace fp {
namespace {

// What rank `r` contributes (every rank can compute every other rank's data).
std::vector<float> data_of(int r, int64_t n, int salt) {
  std::mt19937 rng(static_cast<uint32_t>(r * 7919 + salt));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

const int64_t kSizes[] = {1, 3, 1000, 65537};
const char* const kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                            "all_reduce_start", "all_gather_start", "reduce_scatter_start", "collective_wait"};

// Runs each test once with MPI's collectives and once with the reference kernels.
class Collectives : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    FP_REQUIRE_RANKS(2);
    comm_ = test::world_comm();
    for (const char* op : kOps) KernelOverrides::global().force(op, GetParam());
  }
  void TearDown() override { KernelOverrides::global().clear(); }
  std::shared_ptr<Communicator> comm_;
};

TEST_P(Collectives, AllReduceSumsEveryRank) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> got = data_of(me, n, 1), expect(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < ranks; ++r) {  // in rank order, as the reference adds
      std::vector<float> d = data_of(r, n, 1);
      for (size_t i = 0; i < d.size(); ++i) expect[i] += d[i];
    }
    dispatch(AllReduceArgs{comm_.get(), got.data(), n});
    for (size_t i = 0; i < got.size(); ++i) {
      if (GetParam() == "ref") ASSERT_EQ(got[i], expect[i]) << "n=" << n << " i=" << i;
      else ASSERT_NEAR(got[i], expect[i], 1e-5f) << "n=" << n << " i=" << i;
    }
    // Every rank must hold the same bits (tensor-parallel ranks must stay in step).
    std::vector<float> all(got.size() * static_cast<size_t>(ranks));
    dispatch(AllGatherArgs{comm_.get(), got.data(), all.data(), n * 4});
    for (int r = 0; r < ranks; ++r)
      ASSERT_EQ(std::memcmp(all.data() + r * n, got.data(), static_cast<size_t>(n) * 4), 0) << "rank " << r << " differs, n=" << n;
  }
}

// Started all-reduces (the micro-batch overlap's): two in flight at once, a blocking collective
// and progress calls between start and wait, waited in the other order than started.
TEST_P(Collectives, StartedAllReducesSumLikeTheBlockingOne) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> a = data_of(me, n, 2), b = data_of(me, n + 5, 3), expect_a(static_cast<size_t>(n), 0.0f),
                       expect_b(static_cast<size_t>(n + 5), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> da = data_of(r, n, 2), db = data_of(r, n + 5, 3);
      for (size_t i = 0; i < da.size(); ++i) expect_a[i] += da[i];
      for (size_t i = 0; i < db.size(); ++i) expect_b[i] += db[i];
    }
    int64_t ha = -7, hb = -7;
    dispatch(AllReduceStartArgs{comm_.get(), a.data(), n, &ha});
    dispatch(AllReduceStartArgs{comm_.get(), b.data(), n + 5, &hb});
    if (GetParam() == "ref") EXPECT_EQ(ha, Communicator::kDone) << "the reference completes when started";
    else EXPECT_TRUE(comm_->overlaps() && ha != hb && ha >= 0 && hb >= 0) << ha << " " << hb;
    float one = 1.0f;
    dispatch(AllReduceArgs{comm_.get(), &one, 1});  // a blocking collective while both are in flight
    comm_->progress();
    EXPECT_EQ(one, static_cast<float>(ranks));
    dispatch(CollectiveWaitArgs{comm_.get(), hb});
    dispatch(CollectiveWaitArgs{comm_.get(), ha});
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], expect_a[i], 1e-5f) << "n=" << n << " i=" << i;
    for (size_t i = 0; i < b.size(); ++i) ASSERT_NEAR(b[i], expect_b[i], 1e-5f) << "n=" << n + 5 << " i=" << i;
  }
}

TEST_P(Collectives, AllGatherConcatenatesInRankOrder) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> mine = data_of(me, n, 2), got(static_cast<size_t>(n * ranks), NAN);
    dispatch(AllGatherArgs{comm_.get(), mine.data(), got.data(), n * 4});
    for (int r = 0; r < ranks; ++r)
      ASSERT_EQ(std::memcmp(got.data() + r * n, data_of(r, n, 2).data(), static_cast<size_t>(n) * 4), 0) << "block " << r;
  }
}

// Started all-gathers (context parallel's K/V exchange): two in flight of different sizes (odd
// byte counts too), a blocking all-gather and progress between start and wait, waited out of order.
TEST_P(Collectives, StartedAllGathersGatherLikeTheBlockingOne) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    const int64_t odd = n * 4 + 3;  // bytes, not a whole number of floats
    std::vector<float> a = data_of(me, n, 2), got_a(static_cast<size_t>(n * ranks), NAN);
    std::vector<uint8_t> b(static_cast<size_t>(odd)), got_b(static_cast<size_t>(odd * ranks), 0xAB);
    for (int64_t i = 0; i < odd; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(me * 31 + i * 7);
    int64_t ha = -7, hb = -7;
    dispatch(AllGatherStartArgs{comm_.get(), a.data(), got_a.data(), n * 4, &ha});
    dispatch(AllGatherStartArgs{comm_.get(), b.data(), got_b.data(), odd, &hb});
    if (GetParam() == "ref") EXPECT_EQ(ha, Communicator::kDone) << "the reference completes when started";
    else EXPECT_TRUE(ha != hb && ha >= 0 && hb >= 0) << ha << " " << hb;
    int32_t one = me, all[8] = {};
    ASSERT_LE(ranks, 8);
    dispatch(AllGatherArgs{comm_.get(), &one, all, 4});  // a blocking collective while both are in flight
    comm_->progress();
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(all[r], r);
    dispatch(CollectiveWaitArgs{comm_.get(), hb});
    dispatch(CollectiveWaitArgs{comm_.get(), ha});
    for (int r = 0; r < ranks; ++r) {
      ASSERT_EQ(std::memcmp(got_a.data() + r * n, data_of(r, n, 2).data(), static_cast<size_t>(n) * 4), 0)
          << "n=" << n << " block " << r;
      for (int64_t i = 0; i < odd; ++i)
        ASSERT_EQ(got_b[static_cast<size_t>(r * odd + i)], static_cast<uint8_t>(r * 31 + i * 7))
            << "bytes=" << odd << " block " << r << " i=" << i;
    }
  }
}

TEST_P(Collectives, ReduceScatterKeepsThisRanksBlockOfTheSum) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> send = data_of(me, n * ranks, 3), got(static_cast<size_t>(n), NAN);
    std::vector<float> expect(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> d = data_of(r, n * ranks, 3);
      for (int64_t i = 0; i < n; ++i) expect[static_cast<size_t>(i)] += d[static_cast<size_t>(me * n + i)];
    }
    dispatch(ReduceScatterArgs{comm_.get(), send.data(), got.data(), n});
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expect[i], 1e-5f) << "n=" << n << " i=" << i;
  }
}

// Started reduce-scatters (data-parallel attention's overlapped FFN sums): two in flight, a
// blocking all-reduce and progress between start and wait, waited out of order.
TEST_P(Collectives, StartedReduceScattersSumLikeTheBlockingOne) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> a = data_of(me, n * ranks, 3), b = data_of(me + 7, (n + 1) * ranks, 5);
    std::vector<float> got_a(static_cast<size_t>(n), NAN), got_b(static_cast<size_t>(n + 1), NAN);
    std::vector<float> want_a(got_a.size(), 0.0f), want_b(got_b.size(), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const auto da = data_of(r, n * ranks, 3), db = data_of(r + 7, (n + 1) * ranks, 5);
      for (int64_t i = 0; i < n; ++i) want_a[static_cast<size_t>(i)] += da[static_cast<size_t>(me * n + i)];
      for (int64_t i = 0; i <= n; ++i) want_b[static_cast<size_t>(i)] += db[static_cast<size_t>(me * (n + 1) + i)];
    }
    int64_t ha = -7, hb = -7;
    dispatch(ReduceScatterStartArgs{comm_.get(), a.data(), got_a.data(), n, &ha});
    dispatch(ReduceScatterStartArgs{comm_.get(), b.data(), got_b.data(), n + 1, &hb});
    if (GetParam() == "ref") EXPECT_EQ(ha, Communicator::kDone) << "the reference completes when started";
    else EXPECT_TRUE(ha != hb && ha >= 0 && hb >= 0) << ha << " " << hb;
    float one = 1.0f;
    dispatch(AllReduceArgs{comm_.get(), &one, 1});  // a blocking collective while both are in flight
    comm_->progress();
    EXPECT_EQ(one, static_cast<float>(ranks));
    dispatch(CollectiveWaitArgs{comm_.get(), hb});
    dispatch(CollectiveWaitArgs{comm_.get(), ha});
    for (size_t i = 0; i < got_a.size(); ++i) ASSERT_NEAR(got_a[i], want_a[i], 1e-5f) << "n=" << n << " i=" << i;
    for (size_t i = 0; i < got_b.size(); ++i) ASSERT_NEAR(got_b[i], want_b[i], 1e-5f) << "n=" << n + 1 << " i=" << i;
  }
}

TEST_P(Collectives, AllToAllDeliversBlockJToRankJ) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int64_t n : kSizes) {
    std::vector<float> send, got(static_cast<size_t>(n * ranks), NAN);
    for (int j = 0; j < ranks; ++j) {
      auto b = data_of(me * 100 + j, n, 4);  // from me to j
      send.insert(send.end(), b.begin(), b.end());
    }
    dispatch(AllToAllArgs{comm_.get(), send.data(), got.data(), n * 4});
    for (int j = 0; j < ranks; ++j)
      ASSERT_EQ(std::memcmp(got.data() + j * n, data_of(j * 100 + me, n, 4).data(), static_cast<size_t>(n) * 4), 0)
          << "block from rank " << j << ", n=" << n;
  }
}

TEST_P(Collectives, AllToAllVMovesBlocksOfEveryLength) {
  const int me = comm_->rank(), ranks = comm_->size();
  // Rank i sends (i + j + 1) * 5 floats to rank j; the block from j holds data_of(j * 100 + me).
  auto len = [](int from, int to) { return static_cast<int64_t>(from + to + 1) * 5; };
  std::vector<float> send;
  std::vector<int64_t> sb, rb;
  int64_t total = 0;
  for (int j = 0; j < ranks; ++j) {
    auto b = data_of(me * 100 + j, len(me, j), 5);
    send.insert(send.end(), b.begin(), b.end());
    sb.push_back(len(me, j) * 4);
    rb.push_back(len(j, me) * 4);
    total += len(j, me);
  }
  std::vector<float> got(static_cast<size_t>(total), NAN);
  dispatch(AllToAllArgs{comm_.get(), send.data(), got.data(), 0, sb.data(), rb.data()});
  int64_t off = 0;
  for (int j = 0; j < ranks; ++j) {
    ASSERT_EQ(std::memcmp(got.data() + off, data_of(j * 100 + me, len(j, me), 5).data(), static_cast<size_t>(len(j, me)) * 4), 0)
        << "block from rank " << j;
    off += len(j, me);
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int me = comm_->rank(), ranks = comm_->size();
  for (int root = 0; root < ranks; ++root)
    for (int64_t n : kSizes) {
      std::vector<float> v = me == root ? data_of(root, n, 6) : std::vector<float>(static_cast<size_t>(n), NAN);
      dispatch(BroadcastArgs{comm_.get(), v.data(), n * 4, root});
      ASSERT_EQ(std::memcmp(v.data(), data_of(root, n, 6).data(), static_cast<size_t>(n) * 4), 0) << "root " << root;
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Collectives, ::testing::Values("mpi", "ref"));

TEST(CollectivesLedger, RecordsTheMpiKernelAndWhySingleWasRefused) {
  FP_REQUIRE_RANKS(2);
  auto comm = test::world_comm();
  KernelOverrides::global().clear();
  float x = 1.0f;
  dispatch(AllReduceArgs{comm.get(), &x, 1});
  EXPECT_EQ(x, static_cast<float>(comm->size()));
  const std::string cls = "f32 sum comm=mpi ranks=" + std::to_string(comm->size());
  bool found = false;
  for (const LedgerEntry& e : Ledger::global().snapshot()) {
    if (e.op != "all_reduce" || e.shape_class != cls) continue;
    found = true;
    EXPECT_EQ(e.kernel, "mpi");
    EXPECT_FALSE(e.fallback());
    bool single_refused = false;
    for (auto& [k, why] : e.refused) single_refused |= k == "single" && why == "the communicator is mpi, not single";
    EXPECT_TRUE(single_refused) << Ledger::global().table();
  }
  EXPECT_TRUE(found) << Ledger::global().table();
  comm->barrier();
}

}  // namespace
}  // namespace fp
