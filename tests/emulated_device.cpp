// tests/emulated_device.cpp — the host-memory stand-in for the CUDA device (emulated_device.h).
#include "emulated_device.h"

#include <algorithm>
#include <limits>
#include <map>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
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

// Started collectives as NCCL's behave beside the stream: the handle is given at the call; the
// transfer runs in stream order (taped while a graph records, so a replay moves the data again)
// into a buffer of its own, and the destination holds NaN until the wait — on a GPU the rows are
// in flight until then — so a step that reads them before waiting, or never waits, gets NaN, and
// one that writes them meanwhile has its write overwritten at the wait.
struct InFlight {
  void* dest = nullptr;
  std::vector<uint8_t> result;
};
std::map<int64_t, InFlight> g_in_flight;
int64_t g_next_handle = int64_t{1} << 50;

void in_stream_order(std::function<void()> f) {
  if (g_recording) {
    g_recording->push_back(std::move(f));
  } else {
    if (g_stream) g_stream->flush();
    f();
  }
}

template <class Args>
const Kernel<Args>* cpu_kernel(const char* name) {
  for (const auto& k : OpRegistry<Args>::instance().kernels())
    if (k.backend == Backend::CPU && k.name == name) return &k;
  return nullptr;
}

template <class Args>
void register_device_kernel(std::function<std::string(const Args&)> refuse, std::function<void(const Args&)> run) {
  register_kernel(Kernel<Args>{"emulated", Backend::CUDA, -100, false, std::move(refuse), std::move(run)});
}

// A started collective on the stand-in: `blocking` is the same collective writing into `result`
// (the in-flight buffer, which starts as a copy of the destination: an all-reduce sums in place),
// `dest` the destination and its size.
template <class Started, class Blocking>
void emulate_started(const Kernel<Blocking>& k, Blocking (*blocking)(const Started&, uint8_t* result),
                     std::pair<void*, size_t> (*dest)(const Started&)) {
  register_device_kernel<Started>([refuse = k.refuse, blocking](const Started& a) { return refuse(blocking(a, nullptr)); },
                                  [run = k.run, blocking, dest](const Started& a) {
                                    const int64_t id = *a.handle = g_next_handle++;
                                    in_stream_order([run, blocking, dest, a, id] {
                                      InFlight& f = g_in_flight[id];
                                      const auto [d, bytes] = dest(a);
                                      f.dest = d;
                                      f.result.assign(static_cast<uint8_t*>(d), static_cast<uint8_t*>(d) + bytes);
                                      run(blocking(a, f.result.data()));
                                      if (bytes > 0) std::memset(d, 0xff, bytes);  // NaN floats, out-of-range ids
                                    });
                                  });
}

void emulate_started_collectives() {
  const Kernel<AllReduceArgs>* reduce = cpu_kernel<AllReduceArgs>("mpi");
  const Kernel<AllGatherArgs>* gather = cpu_kernel<AllGatherArgs>("mpi");
  const Kernel<ReduceScatterArgs>* scatter = cpu_kernel<ReduceScatterArgs>("mpi");
  if (!reduce || !gather || !scatter) return;  // a build without MPI
  emulate_started<AllReduceStartArgs, AllReduceArgs>(
      *reduce,
      [](const AllReduceStartArgs& a, uint8_t* r) { return AllReduceArgs{a.comm, r ? reinterpret_cast<float*>(r) : a.data, a.n}; },
      [](const AllReduceStartArgs& a) { return std::pair<void*, size_t>{a.data, static_cast<size_t>(a.n) * sizeof(float)}; });
  emulate_started<AllGatherStartArgs, AllGatherArgs>(
      *gather, [](const AllGatherStartArgs& a, uint8_t* r) { return AllGatherArgs{a.comm, a.send, r ? r : a.recv, a.bytes}; },
      [](const AllGatherStartArgs& a) {
        return std::pair<void*, size_t>{a.recv, static_cast<size_t>(a.comm->size() * a.bytes)};
      });
  emulate_started<ReduceScatterStartArgs, ReduceScatterArgs>(
      *scatter,
      [](const ReduceScatterStartArgs& a, uint8_t* r) {
        return ReduceScatterArgs{a.comm, a.send, r ? reinterpret_cast<float*>(r) : a.recv, a.n};
      },
      [](const ReduceScatterStartArgs& a) { return std::pair<void*, size_t>{a.recv, static_cast<size_t>(a.n) * sizeof(float)}; });
  register_device_kernel<CollectiveWaitArgs>(nullptr, [](const CollectiveWaitArgs& a) {
    if (a.handle == Communicator::kDone) return;
    const int64_t id = a.handle;
    in_stream_order([id] {
      auto it = g_in_flight.find(id);
      if (it == g_in_flight.end()) fail("stand-in device: wait on handle ", id, ", which was never started or already waited");
      if (!it->second.result.empty()) std::memcpy(it->second.dest, it->second.result.data(), it->second.result.size());
      g_in_flight.erase(it);
    });
  });
}

// The collectives on device buffers through MPI (host memory here), where the build has MPI.
void emulate_collectives() {
  register_emulated<AllReduceArgs>("mpi", true);
  register_emulated<AllGatherArgs>("mpi", true);
  register_emulated<ReduceScatterArgs>("mpi", true);
  register_emulated<AllToAllArgs>("mpi", true);
  register_emulated<BroadcastArgs>("mpi", true);
  emulate_started_collectives();
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
    require_emulated<KvMoveArgs>();
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
