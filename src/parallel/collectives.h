// parallel/collectives.h — the collective ops. Each is an argument struct dispatched through the
// op registry like any kernel op, so the ledger shows which implementation ran each collective
// (and why the others were refused). Kernels: one per communicator backend ("single", "mpi",
// which call the backend's own collective) and "ref", the reference: every collective built
// from blocking point-to-point messages in a fixed rank order (sums added in rank order 0..n-1),
// plain and obviously right, used as the oracle in tests.
//
// The shape class names the backend and the rank count, the things the kernels' answers depend on.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/registry.h"
#include "parallel/communicator.h"

namespace fp {

// data[n] (F32) = the sum of every rank's data[n], on every rank.
struct AllReduceArgs {
  static constexpr const char* kName = "all_reduce";
  Communicator* comm = nullptr;
  float* data = nullptr;
  int64_t n = 0;
  std::string shape_class() const;
};

// The same sum, started (Communicator::start_all_reduce_sum): *handle receives what to wait on
// with CollectiveWaitArgs; data must not be touched until then. Kernels that cannot overlap
// complete the sum at once and set *handle = Communicator::kDone.
struct AllReduceStartArgs {
  static constexpr const char* kName = "all_reduce_start";
  Communicator* comm = nullptr;
  float* data = nullptr;
  int64_t n = 0;
  int64_t* handle = nullptr;
  std::string shape_class() const;
};

// Waits for a started collective (its time in the ledger is the communication compute did not hide).
struct CollectiveWaitArgs {
  static constexpr const char* kName = "collective_wait";
  Communicator* comm = nullptr;
  int64_t handle = Communicator::kDone;
  std::string shape_class() const;
};

// recv[size * bytes] = each rank's send[bytes], in rank order.
struct AllGatherArgs {
  static constexpr const char* kName = "all_gather";
  Communicator* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  std::string shape_class() const;
};

// The same gather, started (Communicator::start_all_gather): neither buffer may be touched until
// CollectiveWaitArgs waits for *handle (kDone when the kernel completed it at once).
struct AllGatherStartArgs {
  static constexpr const char* kName = "all_gather_start";
  Communicator* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  int64_t* handle = nullptr;
  std::string shape_class() const;
};

// send[size * n] (F32) summed over ranks; rank r receives block r: recv[n].
struct ReduceScatterArgs {
  static constexpr const char* kName = "reduce_scatter";
  Communicator* comm = nullptr;
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t n = 0;
  std::string shape_class() const;
};

// The same reduce-scatter, started (Communicator::start_reduce_scatter_sum): neither buffer may be
// touched until CollectiveWaitArgs waits for *handle (kDone when the kernel completed it at once).
struct ReduceScatterStartArgs {
  static constexpr const char* kName = "reduce_scatter_start";
  Communicator* comm = nullptr;
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t n = 0;
  int64_t* handle = nullptr;
  std::string shape_class() const;
};

// Block j of send goes to rank j. Equal blocks of `bytes` when send_bytes is null; otherwise
// send_bytes[j] / recv_bytes[j] bytes to / from rank j, blocks back to back.
struct AllToAllArgs {
  static constexpr const char* kName = "all_to_all";
  Communicator* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  const int64_t* send_bytes = nullptr;
  const int64_t* recv_bytes = nullptr;
  std::string shape_class() const;
};

// data[bytes] of rank root, copied to every rank.
struct BroadcastArgs {
  static constexpr const char* kName = "broadcast";
  Communicator* comm = nullptr;
  void* data = nullptr;
  int64_t bytes = 0;
  int root = 0;
  std::string shape_class() const;
};

// Waits out a started collective that a failed step (or an abandoned graph recording) left in
// flight, so that its buffers and its handle are free; sets handle to kDone. A communicator that
// fails here failed for every rank: nothing is left to wait for, and nothing is thrown.
void wait_out(Communicator* comm, int64_t& handle) noexcept;

// The refusal of a backend kernel for a communicator of another backend ("" when it matches).
std::string refuse_unless_backend(const Communicator* comm, const char* backend);

// Registers one kernel per collective op named `backend` ("single", "mpi", ...): each calls the
// communicator's own method and refuses communicators of other backends. `backend` must outlive
// the registry (a string literal).
// `device`: where the kernels' data lives (Backend::CUDA for a GPU communicator's device buffers).
void register_backend_collectives(const char* backend, int priority, Backend device = Backend::CPU);

}  // namespace fp
