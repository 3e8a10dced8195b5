// parallel/communicator.h — the ranks of a parallel run and the collectives between them.
//
// A Communicator is one rank's handle on a group of `size()` ranks. Implementations: "single"
// (one rank, every collective a copy or nothing) and "mpi" (ranks are MPI processes, built only
// when CMake finds MPI). Models do not call these methods directly: they dispatch the collective
// ops of parallel/collectives.h, so the ledger records which implementation ran. The methods here
// are what those ops' kernels call. Every rank must make the same calls in the same order.
//
// Buffers: reductions are F32 sums; data-movement collectives move raw bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace fp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;  // "single", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[n] = sum over ranks of data[n], on every rank.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // recv[size * bytes] = every rank's send[bytes], in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t bytes) = 0;
  // send[size * n] summed over ranks; this rank keeps block rank(): recv[n].
  virtual void reduce_scatter_sum(const float* send, float* recv, int64_t n) = 0;
  // send[size * bytes]: block j goes to rank j; recv[size * bytes]: block j came from rank j.
  virtual void all_to_all(const void* send, void* recv, int64_t bytes) = 0;
  // Variable sizes: send holds send_bytes[j] bytes for rank j back to back, recv receives
  // recv_bytes[j] bytes from rank j back to back (both arrays have size() entries).
  virtual void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) = 0;
  // Non-blocking all-reduce, for overlapping communication with compute: starts data[n] = sum
  // over ranks and returns a handle; data must not be touched until wait(handle). Backends
  // without non-blocking collectives complete it here and return kDone (overlaps() is false):
  // wait is then free and nothing overlaps. Every rank starts the same collectives in the same
  // order, interleaved with the blocking ones in the same order too.
  static constexpr int64_t kDone = -1;
  virtual int64_t start_all_reduce_sum(float* data, int64_t n) {
    all_reduce_sum(data, n);
    return kDone;
  }
  // Non-blocking all-gather (recv[size * bytes] = every rank's send[bytes]), as the all-reduce
  // above: neither buffer may be touched until wait(handle).
  virtual int64_t start_all_gather(const void* send, void* recv, int64_t bytes) {
    all_gather(send, recv, bytes);
    return kDone;
  }
  // Non-blocking reduce-scatter (send[size * n] summed over ranks, this rank's block into
  // recv[n]), as the all-reduce above.
  virtual int64_t start_reduce_scatter_sum(const float* send, float* recv, int64_t n) {
    reduce_scatter_sum(send, recv, n);
    return kDone;
  }
  virtual void wait(int64_t handle) { (void)handle; }
  // Lets started collectives advance while this rank computes (MPI moves a non-blocking
  // collective's data only inside its calls); cheap when nothing is pending.
  virtual void progress() {}
  virtual bool overlaps() const { return false; }
  // data[bytes] of rank `root` copied to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // The same, for a broadcast the other ranks may wait on for a long time (a follower waiting for
  // the next request): waiting ranks sleep between checks instead of spinning on a core. It
  // matches only broadcast_idle on the other ranks.
  virtual void broadcast_idle(void* data, int64_t bytes, int root) { broadcast(data, bytes, root); }
  virtual void barrier() = 0;
  // Point to point (blocking); the reference collectives are built from these.
  virtual void send(const void* data, int64_t bytes, int to) = 0;
  virtual void recv(void* data, int64_t bytes, int from) = 0;
  // Ends every rank of the run (a rank that failed must not leave the others waiting).
  [[noreturn]] virtual void abort(int code) = 0;
};

// One rank alone.
class SingleCommunicator : public Communicator {
 public:
  const char* backend() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_gather(const void* send, void* recv, int64_t bytes) override;
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override;
  void all_to_all(const void* send, void* recv, int64_t bytes) override;
  void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override;
  void broadcast(void*, int64_t, int root) override;
  void barrier() override {}
  void send(const void*, int64_t, int to) override;
  void recv(void*, int64_t, int from) override;
  [[noreturn]] void abort(int code) override;
};

// Backends other than "single" register a factory for the world of this process (the MPI one
// does, from its own library, when the build has MPI).
using WorldFactory = std::function<std::shared_ptr<Communicator>()>;
bool register_world_backend(const std::string& name, WorldFactory factory);
bool has_world_backend(const std::string& name);

// A communicator over the same ranks for data in a device's memory (NCCL for CUDA GPUs),
// bootstrapped over the host world; registered by that device's library. It also carries
// host-memory collectives (through the host world), so a model on the device uses it for both.
using DeviceCommFactory = std::function<std::shared_ptr<Communicator>(std::shared_ptr<Communicator> host)>;
bool register_device_communicator(const std::string& device, DeviceCommFactory factory);
// Throws naming why when this build has none for `device` ("cuda").
std::shared_ptr<Communicator> open_device_communicator(const std::string& device, std::shared_ptr<Communicator> host);

// Ranks this process was launched with, from the launcher's environment (OpenMPI's
// OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...) without initialising anything; 1 when not launched by one.
int launched_world_size();
int launched_local_size();  // ranks on this machine (for the default thread count)
int launched_rank();

// The communicator for a tensor-parallel size: "single" for 1 (checking that the process was
// not launched as one of several ranks), MPI otherwise. Checks that tp_size equals the world
// size, with both numbers in the error. The world stays open until close_world().
std::shared_ptr<Communicator> open_world(int tp_size, const char* flag = "--tensor-parallel-size");
// The world opened by open_world, or null.
Communicator* current_world();
// End of the program: ok closes the world normally (MPI_Finalize); !ok with several ranks
// aborts them all, so that no rank waits forever on one that failed.
void close_world(bool ok);

}  // namespace fp
