// tests/mpi/mpi_test_main.cpp — main() of fastpath_mpi_tests, the suites that run as several
// MPI ranks (mpirun -np 2 / -np 3, registered in tests/CMakeLists.txt). Every rank runs every
// test; the binary fails when any rank fails. Run without mpirun it is one rank and the
// multi-rank tests skip.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/log.h"
#include "core/thread_pool.h"
#include "parallel/communicator.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fp::open_world(fp::launched_world_size());
  fp::Communicator& world = *fp::current_world();
  fp::set_log_level(fp::LogLevel::Error);
  fp::set_num_threads(1);  // the ranks share the machine's cores (CI has two)
  if (world.rank() != 0) {  // one copy of the progress lines; failures are printed by every rank
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0f : 0.0f;
  world.all_reduce_sum(&failed, 1);
  if (failed > 0 && rc == 0) std::fprintf(stderr, "rank %d passed, but another rank failed\n", world.rank());
  fp::close_world(true);
  return failed > 0 ? 1 : 0;
}
