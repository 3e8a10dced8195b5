// tests/mpi/mpi_test_util.h — the world communicator of the MPI test binary, and a skip for
// tests that need several ranks.
#pragma once
#include <gtest/gtest.h>

#include <memory>

#include "parallel/communicator.h"

namespace fp::test {

// The communicator main() opened (MPI under mpirun, single otherwise).
inline std::shared_ptr<Communicator> world_comm() { return open_world(launched_world_size()); }

#define FP_REQUIRE_RANKS(n)                                                                   \
  do {                                                                                        \
    if (::fp::launched_world_size() < (n)) GTEST_SKIP() << "needs mpirun -np " << (n) << " or more"; \
  } while (0)

}  // namespace fp::test
