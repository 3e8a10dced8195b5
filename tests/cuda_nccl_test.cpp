// tests/cuda_nccl_test.cpp — the NCCL communicator (parallel/nccl/) on a GPU machine: opened
// over a one-rank host world, every collective op dispatched on the GPU goes to the "nccl"
// kernel of backend cuda and leaves one rank's data as it was (device buffers through NCCL), and
// host buffers go to the host world. One rank because the lent machines have one GPU; the
// multi-rank sums are the MPI tests' (same op kernels, same communicator interface). Skips,
// printing why, without a GPU or without libnccl.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "core/device.h"
#include "core/error.h"
#include "cuda_ops.h"
#include "kernels/ledger.h"
#include "parallel/collectives.h"

namespace fp {
namespace {

TEST(CudaNccl, OneRankCollectivesOnDeviceAndHostBuffers) {
  FP_SKIP_WITHOUT_GPU();
  if (test::cuda_tests_on_cpu()) GTEST_SKIP() << "skipped: NCCL needs a real GPU";
  std::shared_ptr<Communicator> comm;
  try {
    comm = open_device_communicator("cuda", std::make_shared<SingleCommunicator>());
  } catch (const Error& e) {
    if (std::string(e.what()).find("cannot be opened") != std::string::npos) GTEST_SKIP() << "skipped: " << e.what();
    throw;
  }
  ASSERT_STREQ(comm->backend(), "nccl");
  Ledger::global().reset();
  for (int64_t n : {1, 1000, 65537}) {
    std::vector<float> x(static_cast<size_t>(n));
    std::iota(x.begin(), x.end(), 0.5f);
    DeviceBuffer d = test::upload(x), r(Device::CUDA, x.size() * sizeof(float)), r2 = test::upload(x),
                 s(Device::CUDA, x.size() * sizeof(float));
    {
      DeviceScope scope(Device::CUDA);
      dispatch(AllReduceArgs{comm.get(), d.as<float>(), n});
      dispatch(BroadcastArgs{comm.get(), d.data(), n * 4, 0});
      dispatch(AllGatherArgs{comm.get(), d.data(), r.data(), n * 4});
      EXPECT_EQ(test::download<float>(r, x.size()), x) << "all_gather n=" << n;
      dispatch(ReduceScatterArgs{comm.get(), d.as<float>(), r.as<float>(), n});
      EXPECT_EQ(test::download<float>(r, x.size()), x) << "reduce_scatter n=" << n;
      dispatch(AllToAllArgs{comm.get(), d.data(), r.data(), n * 4});
      EXPECT_EQ(test::download<float>(r, x.size()), x) << "all_to_all n=" << n;
    }
    EXPECT_EQ(test::download<float>(d, x.size()), x) << "all_reduce / broadcast n=" << n;
    {  // started on NCCL's stream, two in flight, the backend stream joining at each wait
      DeviceScope scope(Device::CUDA);
      int64_t a = Communicator::kDone, g = Communicator::kDone, rs = Communicator::kDone;
      dispatch(AllReduceStartArgs{comm.get(), d.as<float>(), n, &a});
      dispatch(AllGatherStartArgs{comm.get(), d.data(), r.data(), n * 4, &g});
      dispatch(ReduceScatterStartArgs{comm.get(), r2.as<float>(), s.as<float>(), n, &rs});
      EXPECT_NE(g, Communicator::kDone) << "a started NCCL collective is in flight until waited for";
      dispatch(CollectiveWaitArgs{comm.get(), g});
      dispatch(CollectiveWaitArgs{comm.get(), rs});
      dispatch(CollectiveWaitArgs{comm.get(), a});
    }
    EXPECT_EQ(test::download<float>(r, x.size()), x) << "started all_gather n=" << n;
    EXPECT_EQ(test::download<float>(s, x.size()), x) << "started reduce_scatter n=" << n;
    EXPECT_EQ(test::download<float>(d, x.size()), x) << "started all_reduce n=" << n;
    std::vector<float> h = x;  // host memory: through the host world
    dispatch(AllReduceArgs{comm.get(), h.data(), n});
    EXPECT_EQ(h, x);
  }
  const std::string table = Ledger::global().table();
  EXPECT_NE(table.find("nccl"), std::string::npos) << table;
}

}  // namespace
}  // namespace fp
