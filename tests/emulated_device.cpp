// tests/emulated_device.cpp — the host-memory stand-in for the CUDA device (emulated_device.h).
#include "emulated_device.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp::test {
namespace {

// The stand-in's graphs: while recording, the emulated kernels append their call (arguments by
// value, as a CUDA kernel's parameters are) to a tape instead of running; a launch replays it.
using Tape = std::vector<std::function<void()>>;
Tape* g_recording = nullptr;
EmulatedStream* g_stream = nullptr;  // the deferring stream while one is active

void flush_stream() {
  if (g_stream) g_stream->flush();
}

// Registers a "cuda"-backend kernel "emulated" running the op's CPU kernel `cpu_kernel` (recorded
// on a tape while a graph records, queued on a deferring stream); false when there is none.
// `in_order`: the call runs at once after the work queued before it (a collective: NCCL's host
// side runs when called — a started one returns its handle then — ordered on the stream).
template <class Args>
bool register_emulated(const char* cpu_kernel = "ref", bool in_order = false) {
  for (const auto& k : OpRegistry<Args>::instance().kernels())
    if (k.backend == Backend::CPU && k.name == cpu_kernel) {
      Kernel<Args> e = k;  // its refusals too (the "mpi" collectives refuse another communicator)
      e.run = [inner = k.run, in_order](const Args& a) {
        if (g_recording) {
          g_recording->push_back([inner, a] { inner(a); });
        } else if (g_stream && in_order) {
          g_stream->flush();
          inner(a);
        } else if (g_stream) {
          g_stream->push([inner, a] { inner(a); });
        } else {
          inner(a);
        }
      };
      e.name = "emulated";
      e.backend = Backend::CUDA;
      e.priority = -100;  // below the real CUDA kernels, which refuse without a GPU
      e.reference = false;
      register_kernel(std::move(e));
      return true;
    }
  return false;
}

template <class Args>
void require_emulated() {
  if (!register_emulated<Args>()) ADD_FAILURE() << "no CPU reference kernel for " << Args::kName;
}

// A started collective as NCCL's behaves on the stream: its handle given at the call (kDone
// here), its transfer run in stream order like a kernel — taped while a graph records, so a
// replay moves the data again without any handle (the MPI kernel's own non-blocking call would
// write its request through a pointer into a forward's stack frame long gone at replay).
template <class StartArgs, class BlockingArgs>
void emulate_started(BlockingArgs (*blocking)(const StartArgs&)) {
  for (const auto& k : OpRegistry<BlockingArgs>::instance().kernels())
    if (k.backend == Backend::CPU && k.name == "mpi") {
      Kernel<StartArgs> e;
      e.name = "emulated";
      e.backend = Backend::CUDA;
      e.priority = -100;
      e.refuse = [refuse = k.refuse, blocking](const StartArgs& a) { return refuse ? refuse(blocking(a)) : std::string(); };
      e.run = [run = k.run, blocking](const StartArgs& a) {
        *a.handle = Communicator::kDone;
        const BlockingArgs b = blocking(a);
        if (g_recording) {
          g_recording->push_back([run, b] { run(b); });
        } else {
          if (g_stream) g_stream->flush();
          run(b);
        }
      };
      register_kernel(std::move(e));
      return;
    }
}

// The collectives on device buffers through MPI (host memory here), where the build has MPI.
void emulate_collectives() {
  register_emulated<AllReduceArgs>("mpi", true);
  register_emulated<AllGatherArgs>("mpi", true);
  register_emulated<ReduceScatterArgs>("mpi", true);
  register_emulated<AllToAllArgs>("mpi", true);
  register_emulated<BroadcastArgs>("mpi", true);
  emulate_started<AllReduceStartArgs, AllReduceArgs>(
      [](const AllReduceStartArgs& a) { return AllReduceArgs{a.comm, a.data, a.n}; });
  emulate_started<AllGatherStartArgs, AllGatherArgs>(
      [](const AllGatherStartArgs& a) { return AllGatherArgs{a.comm, a.send, a.recv, a.bytes}; });
  register_emulated<CollectiveWaitArgs>("ref", true);  // nothing to wait for: the starts completed in order
}

}  // namespace

void EmulatedStream::push(std::function<void()> f) {
  queue.push_back(std::move(f));
  ++queued;
}

void EmulatedStream::run_until(uint64_t n) {
  if (n < queued) ++waits_with_work_behind;
  while (ran < n && !queue.empty()) {
    auto f = std::move(queue.front());
    queue.pop_front();
    ++ran;
    f();
  }
}

EmulatedDevice::EmulatedDevice(bool deferred) {
  static const bool kernels = [] {
    require_emulated<EmbeddingArgs>();
    require_emulated<MatMulArgs>();
    require_emulated<RmsNormArgs>();
    require_emulated<RopeArgs>();
    require_emulated<AttentionArgs>();
    require_emulated<KvWriteArgs>();
    require_emulated<SiluMulArgs>();
    require_emulated<AddArgs>();
    require_emulated<SoftmaxArgs>();
    require_emulated<ArgmaxArgs>();
    require_emulated<TokenFeedArgs>();
    require_emulated<SampleArgs>();
    require_emulated<MoeRouteArgs>();
    require_emulated<MoeFfnArgs>();
    require_emulated<MlaAttentionArgs>();
    emulate_collectives();
    return true;
  }();
  (void)kernels;
  DeviceMemoryOps ops;
  ops.unavailable = [] { return std::string(); };
  ops.alloc = [](size_t bytes) { return std::malloc(bytes); };
  ops.release = [](void* p) {
    flush_stream();  // as cudaFree, which waits for the device
    std::free(p);
  };
  ops.copy = [](void* dst, const void* src, size_t bytes) {
    flush_stream();
    std::memcpy(dst, src, bytes);
  };
  ops.fill_zero = [](void* p, size_t bytes) {
    flush_stream();
    std::memset(p, 0, bytes);
  };
  ops.synchronize = [] { flush_stream(); };
  ops.copy_async = [](void* dst, const void* src, size_t bytes) {  // taped while recording, as CUDA captures it
    auto copy = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
    if (g_recording) g_recording->push_back(copy);
    else if (g_stream) g_stream->push(copy);
    else copy();
  };
  ops.copy_2d_async = [](void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
    auto copy = [=] {  // recorded into a graph as a CUDA graph records cudaMemcpy2DAsync
      for (size_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    };
    if (g_recording) g_recording->push_back(copy);
    else if (g_stream) g_stream->push(copy);
    else copy();
  };
  ops.alloc_host = [](size_t bytes) { return std::malloc(bytes); };
  ops.release_host = [](void* p) { std::free(p); };
  ops.fence = [] { return g_stream ? g_stream->queued : uint64_t{0}; };
  ops.wait_fence = [](uint64_t f) {
    if (g_stream) g_stream->run_until(f);
  };
  if (deferred) g_stream = &stream_;
  ops.free_bytes = [] { return static_cast<size_t>(1) << 30; };
  saved_ = register_device_memory(Device::CUDA, ops);
  DeviceGraphOps graphs;
  graphs.begin_capture = [] { g_recording = new Tape; };
  graphs.end_capture = [] { return static_cast<void*>(std::exchange(g_recording, nullptr)); };
  graphs.abort_capture = [] { delete std::exchange(g_recording, nullptr); };
  graphs.launch = [](void* t) {
    auto* tape = static_cast<Tape*>(t);
    if (g_stream) g_stream->push([tape] {
      for (auto& call : *tape) call();
    });
    else
      for (auto& call : *tape) call();
  };
  graphs.destroy = [](void* t) {
    flush_stream();  // a queued launch may still read the tape
    delete static_cast<Tape*>(t);
  };
  saved_graphs_ = register_device_graphs(Device::CUDA, graphs);
  invalidate_all_dispatch();
}

EmulatedDevice::~EmulatedDevice() {
  flush_stream();
  g_stream = nullptr;
  register_device_memory(Device::CUDA, saved_);
  register_device_graphs(Device::CUDA, saved_graphs_);
  invalidate_all_dispatch();
}

}  // namespace fp::test
