// parallel/mpi/mpi_communicator.cpp — the MPI communicator (ranks are MPI processes on one
// machine or many) and the "mpi" kernels of the collective ops. Built as its own library, only
// when CMake finds MPI, so nothing else in fastpath includes mpi.h; it registers itself as the
// "mpi" world backend.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(what, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

// MPI counts are ints.
int count(int64_t n, const char* what) {
  FP_CHECK(n >= 0 && n <= INT_MAX, what, ": ", n, " elements is more than one MPI call can carry (", INT_MAX, ")");
  return static_cast<int>(n);
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      // One thread at a time makes MPI calls, not always the main one: `serve` steps its engine
      // (and its collectives) on the engine thread. Kernels' worker threads never call MPI.
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      if (provided < MPI_THREAD_SERIALIZED)
        std::fprintf(stderr, "[fastpath warn] MPI provides thread level %d, below MPI_THREAD_SERIALIZED\n", provided);
      owns_init_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_init_ && !finalized) MPI_Finalize();
  }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t n) override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, count(n, "all_reduce"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
  // MPI_Iallreduce (MPI_Iallgather, MPI_Ireduce_scatter_block below); the request waits in pending_ under its handle.
  int64_t start_all_reduce_sum(float* data, int64_t n) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, count(n, "all_reduce"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req),
          "MPI_Iallreduce");
    pending_.emplace_back(next_handle_, req);
    return next_handle_++;
  }
  int64_t start_all_gather(const void* send, void* recv, int64_t bytes) override {
    const int b = count(bytes, "all_gather");
    MPI_Request req;
    check(MPI_Iallgather(send, b, MPI_BYTE, recv, b, MPI_BYTE, MPI_COMM_WORLD, &req), "MPI_Iallgather");
    pending_.emplace_back(next_handle_, req);
    return next_handle_++;
  }
  int64_t start_reduce_scatter_sum(const float* send, float* recv, int64_t n) override {
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(send, recv, count(n, "reduce_scatter"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req),
          "MPI_Ireduce_scatter_block");
    pending_.emplace_back(next_handle_, req);
    return next_handle_++;
  }
  void wait(int64_t handle) override {
    if (handle == kDone) return;
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.first == handle; });
    FP_CHECK(it != pending_.end(), "waiting for collective ", handle, ", which is not pending");
    check(MPI_Wait(&it->second, MPI_STATUS_IGNORE), "MPI_Wait");
    pending_.erase(it);
  }
  void progress() override {
    int done = 0;
    for (auto& p : pending_)
      if (p.second != MPI_REQUEST_NULL) check(MPI_Test(&p.second, &done, MPI_STATUS_IGNORE), "MPI_Test");
  }
  bool overlaps() const override { return true; }
  void all_gather(const void* send, void* recv, int64_t bytes) override {
    const int b = count(bytes, "all_gather");
    check(MPI_Allgather(send, b, MPI_BYTE, recv, b, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override {
    check(MPI_Reduce_scatter_block(send, recv, count(n, "reduce_scatter"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Reduce_scatter_block");
  }
  void all_to_all(const void* send, void* recv, int64_t bytes) override {
    const int b = count(bytes, "all_to_all");
    check(MPI_Alltoall(send, b, MPI_BYTE, recv, b, MPI_BYTE, MPI_COMM_WORLD), "MPI_Alltoall");
  }
  void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override {
    const size_t n = static_cast<size_t>(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int64_t so = 0, ro = 0;
    for (size_t j = 0; j < n; ++j) {
      sc[j] = count(send_bytes[j], "all_to_all_v");
      rc[j] = count(recv_bytes[j], "all_to_all_v");
      sd[j] = count(so, "all_to_all_v offset");
      rd[j] = count(ro, "all_to_all_v offset");
      so += send_bytes[j];
      ro += recv_bytes[j];
    }
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv");
  }
  void broadcast_idle(void* data, int64_t bytes, int root) override {
    FP_CHECK(root >= 0 && root < size_, "broadcast from rank ", root, " of ", size_);
    MPI_Request req;
    check(MPI_Ibcast(data, count(bytes, "broadcast"), MPI_BYTE, root, MPI_COMM_WORLD, &req), "MPI_Ibcast");
    // MPI's blocking calls poll: an idle follower would hold a core at 100%. Test, then sleep
    // 20 us, doubling up to 2 ms (the added latency of a step after an idle spell).
    for (int done = 0, us = 20;;) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      us = std::min(2 * us, 2000);
    }
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    FP_CHECK(root >= 0 && root < size_, "broadcast from rank ", root, " of ", size_);
    check(MPI_Bcast(data, count(bytes, "broadcast"), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  void send(const void* data, int64_t bytes, int to) override {
    check(MPI_Send(data, count(bytes, "send"), MPI_BYTE, to, kTag, MPI_COMM_WORLD), "MPI_Send");
  }
  void recv(void* data, int64_t bytes, int from) override {
    check(MPI_Recv(data, count(bytes, "recv"), MPI_BYTE, from, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  static constexpr int kTag = 7;
  int rank_ = 0, size_ = 1;
  bool owns_init_ = false;
  std::vector<std::pair<int64_t, MPI_Request>> pending_;  // started collectives (a completed one: MPI_REQUEST_NULL)
  int64_t next_handle_ = 0;
};

// "mpi" kernels: MPI's own collectives (whatever algorithm the MPI library picks for the size).
const bool registered = [] {
  register_world_backend("mpi", [] { return std::make_shared<MpiCommunicator>(); });
  register_backend_collectives("mpi", 100);
  return true;
}();

}  // namespace
}  // namespace fp
