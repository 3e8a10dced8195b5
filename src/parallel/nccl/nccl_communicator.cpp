// parallel/nccl/nccl_communicator.cpp — the NCCL communicator for ranks whose data lives on
// CUDA GPUs, and the "nccl" kernels of the collective ops. Built into the CUDA backend's library
// (only where nvcc and nccl.h are found). libnccl is opened at run time (dlopen), so the binary
// starts on machines without it and `--device cuda` with several ranks says what is missing.
//
// Bootstrap: rank 0 makes the NCCL unique id and the host world (MPI) broadcasts it; each rank
// uses GPU (launched local rank) mod (GPUs on the machine). Device buffers go through NCCL on the
// communicator's stream, in the order of the CUDA backend's stream and without a host wait: an
// event on the backend's stream, which the communicator's stream waits for; the collective; an
// event there, which the backend's stream waits for. Kernels after it see its result, the host
// never blocks, and a CUDA graph being recorded on the backend's stream takes the collective in
// as a branch (NCCL >= 2.9 supports capture), so models on several GPU ranks replay decode steps
// too. Host buffers go to the host world.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <memory>
#include <vector>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/cuda_context.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"

namespace fp {
namespace {

// The NCCL entry points fastpath calls, resolved from libnccl.so.2.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  const char* (*error_string)(ncclResult_t);
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    FP_CHECK(h, "several ranks on --device cuda need NCCL: libnccl.so.2 cannot be opened (", dlerror(), ")");
    auto sym = [h](const char* name) {
      void* p = dlsym(h, name);
      FP_CHECK(p, "libnccl.so.2 has no symbol ", name);
      return p;
    };
    NcclApi a{};
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.all_gather = reinterpret_cast<decltype(a.all_gather)>(sym("ncclAllGather"));
    a.reduce_scatter = reinterpret_cast<decltype(a.reduce_scatter)>(sym("ncclReduceScatter"));
    a.broadcast = reinterpret_cast<decltype(a.broadcast)>(sym("ncclBroadcast"));
    a.send = reinterpret_cast<decltype(a.send)>(sym("ncclSend"));
    a.recv = reinterpret_cast<decltype(a.recv)>(sym("ncclRecv"));
    a.group_start = reinterpret_cast<decltype(a.group_start)>(sym("ncclGroupStart"));
    a.group_end = reinterpret_cast<decltype(a.group_end)>(sym("ncclGroupEnd"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    return a;
  }();
  return api;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail(what, " failed: ", nccl().error_string(r));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, " failed: ", cudaGetErrorString(e));
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on older runtimes: clear the error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<Communicator> host) : host_(std::move(host)) {
    int gpus = 0;
    check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
    FP_CHECK(gpus > 0, "NCCL ranks need a CUDA GPU, and none is visible");
    const int local = launched_local_size() > 1 ? env_local_rank() : 0;
    check(cudaSetDevice(local % gpus), "cudaSetDevice");
    ncclUniqueId id{};
    if (host_->rank() == 0) check(nccl().get_unique_id(&id), "ncclGetUniqueId");
    host_->broadcast(&id, sizeof id, 0);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming), "cudaEventCreate");
    check(nccl().comm_init_rank(&comm_, host_->size(), id, host_->rank()), "ncclCommInitRank");
    log_info("NCCL: rank ", host_->rank(), " of ", host_->size(), " on GPU ", local % gpus);
  }
  ~NcclCommunicator() override {
    for (cudaEvent_t e : started_)
      if (e) cudaEventDestroy(e);
    if (comm_) nccl().comm_destroy(comm_);
    if (before_) cudaEventDestroy(before_);
    if (after_) cudaEventDestroy(after_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  const char* backend() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_reduce_sum(float* data, int64_t n) override {
    if (!on_device(data)) return host_->all_reduce_sum(data, n);
    run([&] { check(nccl().all_reduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce"); });
  }
  void all_gather(const void* send, void* recv, int64_t bytes) override {
    if (!on_device(recv)) return host_->all_gather(send, recv, bytes);
    run([&] { check(nccl().all_gather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_), "ncclAllGather"); });
  }
  // Started collectives on device buffers run on NCCL's stream beside the backend's: the backend
  // stream goes on with the kernels queued next (the overlap) and joins only at wait(handle).
  // Host buffers go to the host world's non-blocking collectives, whose handles stay below kBase.
  int64_t start_all_reduce_sum(float* data, int64_t n) override {
    if (!on_device(data)) return host_->start_all_reduce_sum(data, n);
    return start([&] {
      check(nccl().all_reduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    });
  }
  int64_t start_all_gather(const void* send, void* recv, int64_t bytes) override {
    if (!on_device(recv)) return host_->start_all_gather(send, recv, bytes);
    return start([&] {
      check(nccl().all_gather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_), "ncclAllGather");
    });
  }
  int64_t start_reduce_scatter_sum(const float* send, float* recv, int64_t n) override {
    if (!on_device(recv)) return host_->start_reduce_scatter_sum(send, recv, n);
    return start([&] {
      check(nccl().reduce_scatter(send, recv, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_), "ncclReduceScatter");
    });
  }
  void wait(int64_t handle) override {
    if (handle == kDone) return;
    if (handle < kBase) return host_->wait(handle);
    const auto slot = static_cast<size_t>(handle - kBase);
    FP_CHECK(slot < kSlots && pending_[slot], "NCCL: wait on handle ", handle, ", which is not in flight");
    check(cudaStreamWaitEvent(cuda::stream(), started_[slot], 0), "cudaStreamWaitEvent");
    pending_[slot] = false;
  }
  void progress() override { host_->progress(); }
  bool overlaps() const override { return true; }
  void reduce_scatter_sum(const float* send, float* recv, int64_t n) override {
    if (!on_device(recv)) return host_->reduce_scatter_sum(send, recv, n);
    run([&] {
      check(nccl().reduce_scatter(send, recv, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_), "ncclReduceScatter");
    });
  }
  void all_to_all(const void* send, void* recv, int64_t bytes) override {
    if (!on_device(recv)) return host_->all_to_all(send, recv, bytes);
    std::vector<int64_t> sizes(static_cast<size_t>(size()), bytes);
    all_to_all_v(send, sizes.data(), recv, sizes.data());
  }
  // NCCL has no all-to-all: grouped point-to-point sends and receives (NCCL's own recipe).
  void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override {
    if (!on_device(recv)) return host_->all_to_all_v(send, send_bytes, recv, recv_bytes);
    run([&] {
      check(nccl().group_start(), "ncclGroupStart");
      int64_t so = 0, ro = 0;
      for (int r = 0; r < size(); ++r) {
        check(nccl().send(static_cast<const uint8_t*>(send) + so, static_cast<size_t>(send_bytes[r]), ncclUint8, r, comm_, stream_), "ncclSend");
        check(nccl().recv(static_cast<uint8_t*>(recv) + ro, static_cast<size_t>(recv_bytes[r]), ncclUint8, r, comm_, stream_), "ncclRecv");
        so += send_bytes[r];
        ro += recv_bytes[r];
      }
      check(nccl().group_end(), "ncclGroupEnd");
    });
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    if (!on_device(data)) return host_->broadcast(data, bytes, root);
    run([&] { check(nccl().broadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_), "ncclBroadcast"); });
  }
  void broadcast_idle(void* data, int64_t bytes, int root) override {
    if (!on_device(data)) return host_->broadcast_idle(data, bytes, root);
    broadcast(data, bytes, root);
  }
  void barrier() override { host_->barrier(); }
  void send(const void* data, int64_t bytes, int to) override {
    if (!on_device(data)) return host_->send(data, bytes, to);
    run([&] { check(nccl().send(data, static_cast<size_t>(bytes), ncclUint8, to, comm_, stream_), "ncclSend"); });
  }
  void recv(void* data, int64_t bytes, int from) override {
    if (!on_device(data)) return host_->recv(data, bytes, from);
    run([&] { check(nccl().recv(data, static_cast<size_t>(bytes), ncclUint8, from, comm_, stream_), "ncclRecv"); });
  }
  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::abort();  // (host_->abort does not return)
  }

 private:
  static int env_local_rank() {
    for (const char* k : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (const char* v = std::getenv(k)) return std::atoi(v);
    return 0;
  }
  // The collective in the backend stream's order: after the kernels queued there (which wrote
  // its buffers), before the ones queued next; no host wait.
  template <class F>
  void run(F&& issue) {
    cudaStream_t compute = cuda::stream();
    check(cudaEventRecord(before_, compute), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, before_, 0), "cudaStreamWaitEvent");
    issue();
    check(cudaEventRecord(after_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute, after_, 0), "cudaStreamWaitEvent");
  }

  // A started collective: ordered after the backend stream's queued kernels, its completion an
  // event of its own slot; the backend stream waits for it in wait(), not here.
  template <class F>
  int64_t start(F&& issue) {
    size_t slot = 0;
    while (slot < kSlots && pending_[slot]) ++slot;
    FP_CHECK(slot < kSlots, "NCCL: more than ", kSlots, " started collectives in flight");
    if (!started_[slot]) check(cudaEventCreateWithFlags(&started_[slot], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(before_, cuda::stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, before_, 0), "cudaStreamWaitEvent");
    issue();
    check(cudaEventRecord(started_[slot], stream_), "cudaEventRecord");
    pending_[slot] = true;
    return kBase + static_cast<int64_t>(slot);
  }

  static constexpr int64_t kBase = int64_t{1} << 40;  // NCCL handles; the host world's are below
  static constexpr size_t kSlots = 64;
  std::shared_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  cudaEvent_t started_[kSlots] = {};
  bool pending_[kSlots] = {};
};

const bool registered = [] {
  register_device_communicator("cuda", [](std::shared_ptr<Communicator> host) -> std::shared_ptr<Communicator> {
    return std::make_shared<NcclCommunicator>(std::move(host));
  });
  // The same kernels for device buffers (ops dispatched on the GPU) and host ones (sampling's
  // token broadcast, the engine's step broadcast), which the communicator hands to the host world.
  register_backend_collectives("nccl", 120, Backend::CUDA);
  register_backend_collectives("nccl", 120, Backend::CPU);
  return true;
}();

}  // namespace
}  // namespace fp
