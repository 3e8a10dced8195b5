// kernels/cuda/cuda_context.cpp — device discovery, the stream, cuBLAS, scratch, and the CUDA
// device-memory functions registered with core/device.h.
#include "kernels/cuda/cuda_context.h"

#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace fp::cuda {
DeviceCeilings measure_ceilings();             // ceiling.cu
void measure_gemv_rates(DeviceCeilings& c);  // ceiling.cu
namespace {

struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<std::pair<void*, size_t>> scratch;
  int sm_count = 0;
  int device = 0;
  bool pdl_capable = false;  // compute capability 9.0 or later
  std::atomic<bool> pdl{false};
};

std::once_flag g_probe_once;
std::string g_unavailable;

void probe() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    g_unavailable = std::string("no CUDA device: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error of the failed probe
    return;
  }
  if (n == 0) g_unavailable = "no CUDA device: the driver reports 0 devices";
}

Context& ctx() {
  static Context* c = [] {
    std::string why = unavailable();
    FP_CHECK(why.empty(), "CUDA: ", why);
    auto* c2 = new Context();  // lives for the process: CUDA objects must not be destroyed after the driver unloads
    // The current device: 0, or the GPU a rank's NCCL communicator picked before (several GPU
    // ranks on one machine each take their own).
    FP_CUDA(cudaGetDevice(&c2->device));
    FP_CUDA(cudaSetDevice(c2->device));
    FP_CUDA(cudaStreamCreateWithFlags(&c2->stream, cudaStreamNonBlocking));
    FP_CUBLAS(cublasCreate(&c2->cublas));
    FP_CUBLAS(cublasSetStream(c2->cublas, c2->stream));
    // A workspace of our own, so cuBLAS never allocates while a graph is being recorded.
    void* ws = nullptr;
    const size_t ws_bytes = size_t{32} << 20;
    FP_CUDA(cudaMalloc(&ws, ws_bytes));
    FP_CUBLAS(cublasSetWorkspace(c2->cublas, ws, ws_bytes));
    FP_CUDA(cudaDeviceGetAttribute(&c2->sm_count, cudaDevAttrMultiProcessorCount, c2->device));
    int major = 0;
    FP_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c2->device));
    int driver = 0;  // programmatic edges under stream capture need a 12.3 driver
    FP_CUDA(cudaDriverGetVersion(&driver));
    c2->pdl_capable = major >= 9 && driver >= 12030;
    const char* env = std::getenv("FASTPATH_CUDA_PDL");
    c2->pdl = c2->pdl_capable && env && std::string(env) == "1";
    return c2;
  }();
  return *c;
}

// ---- core/device.h memory functions ----
std::string mem_unavailable() { return unavailable(); }
void* mem_alloc(size_t bytes) {
  ctx();
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    fail("CUDA: cannot allocate ", bytes, " bytes of device memory (", cudaGetErrorString(e), "; ", free_b, " of ",
         total, " bytes free)");
  }
  return p;
}
void mem_release(void* p) { cudaFree(p); }
void mem_copy(void* dst, const void* src, size_t bytes) {
  FP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx().stream));
  FP_CUDA(cudaStreamSynchronize(ctx().stream));
}
void mem_zero(void* p, size_t bytes) {
  FP_CUDA(cudaMemsetAsync(p, 0, bytes, ctx().stream));
  FP_CUDA(cudaStreamSynchronize(ctx().stream));
}
void mem_sync() { FP_CUDA(cudaStreamSynchronize(ctx().stream)); }
void mem_copy_async(void* dst, const void* src, size_t bytes) {
  FP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx().stream));
}
void mem_copy_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  FP_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, ctx().stream));
}
void* mem_alloc_host(size_t bytes) {
  ctx();
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA: cannot allocate ", bytes, " bytes of page-locked host memory (", cudaGetErrorString(e), ")");
  }
  return p;
}
void mem_release_host(void* p) { cudaFreeHost(p); }

// Fences: an event recorded on the stream per fence, kept until a wait passes it (events of
// earlier fences have completed too: the stream runs in order) and then reused.
struct Fences {
  std::mutex mu;
  uint64_t next = 1;
  std::deque<std::pair<uint64_t, cudaEvent_t>> live;
  std::vector<cudaEvent_t> spare;
};
Fences& fences() {
  static Fences* f = new Fences();  // lives for the process, as the context does
  return *f;
}
uint64_t mem_fence() {
  Fences& f = fences();
  std::lock_guard<std::mutex> lock(f.mu);
  cudaEvent_t ev = nullptr;
  if (!f.spare.empty()) {
    ev = f.spare.back();
    f.spare.pop_back();
  } else {
    FP_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  FP_CUDA(cudaEventRecord(ev, ctx().stream));
  f.live.emplace_back(f.next, ev);
  return f.next++;
}
void mem_wait_fence(uint64_t fence) {
  Fences& f = fences();
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    for (auto& [id, e] : f.live)
      if (id == fence) ev = e;
  }
  if (!ev) return;  // waited for before: it and everything before it has run
  FP_CUDA(cudaEventSynchronize(ev));
  std::lock_guard<std::mutex> lock(f.mu);
  while (!f.live.empty() && f.live.front().first <= fence) {
    f.spare.push_back(f.live.front().second);
    f.live.pop_front();
  }
}
size_t mem_free_bytes() {
  size_t free_b = 0, total = 0;
  FP_CUDA(cudaMemGetInfo(&free_b, &total));
  return free_b;
}

// ---- core/device.h graph functions ----
void graph_begin() { FP_CUDA(cudaStreamBeginCapture(ctx().stream, cudaStreamCaptureModeThreadLocal)); }
void* graph_end() {
  cudaGraph_t g = nullptr;
  FP_CUDA(cudaStreamEndCapture(ctx().stream, &g));
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  FP_CUDA(e);
  return exec;
}
void graph_abort() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(ctx().stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(ctx().stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  }
  cudaGetLastError();
}
void graph_launch(void* exec) { FP_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), ctx().stream)); }
void graph_destroy(void* exec) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)); }

const bool registered = [] {
  DeviceGraphOps graphs;
  graphs.begin_capture = graph_begin;
  graphs.end_capture = graph_end;
  graphs.abort_capture = graph_abort;
  graphs.launch = graph_launch;
  graphs.destroy = graph_destroy;
  register_device_graphs(Device::CUDA, graphs);
  DeviceMemoryOps ops;
  ops.unavailable = mem_unavailable;
  ops.alloc = mem_alloc;
  ops.release = mem_release;
  ops.copy = mem_copy;
  ops.fill_zero = mem_zero;
  ops.synchronize = mem_sync;
  ops.copy_async = mem_copy_async;
  ops.copy_2d_async = mem_copy_2d_async;
  ops.alloc_host = mem_alloc_host;
  ops.release_host = mem_release_host;
  ops.fence = mem_fence;
  ops.wait_fence = mem_wait_fence;
  ops.free_bytes = mem_free_bytes;
  ops.measure_ceilings = measure_ceilings;
  ops.measure_gemv_rates = measure_gemv_rates;
  register_device_memory(Device::CUDA, ops);
  return true;
}();

}  // namespace

std::string unavailable() {
  std::call_once(g_probe_once, probe);
  return g_unavailable;
}
cudaStream_t stream() { return ctx().stream; }
cublasHandle_t cublas() { return ctx().cublas; }
int sm_count() { return ctx().sm_count; }
int device_index() { return ctx().device; }
bool pdl_launches() { return ctx().pdl; }
void set_pdl_launches(bool on) { ctx().pdl = on && ctx().pdl_capable; }

void* scratch(size_t bytes, int slot) {
  auto& s = ctx().scratch;
  if (s.size() <= static_cast<size_t>(slot)) s.resize(static_cast<size_t>(slot) + 1, {nullptr, 0});
  auto& [p, have] = s[static_cast<size_t>(slot)];
  if (have < bytes) {
    if (p) {
      FP_CUDA(cudaStreamSynchronize(ctx().stream));  // the old region may still be in use by queued work
      cudaFree(p);
    }
    p = mem_alloc(bytes);
    have = bytes;
    note_device_allocation();  // graphs recorded with the old region must be recorded again
  }
  return p;
}

void fail_cuda(cudaError_t e, const char* what, const char* file, int line) {
  cudaGetLastError();
  fail("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

void fail_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  fail("cuBLAS error in ", what, " (", file, ":", line, "): ", cublasGetStatusName(s), ": ", cublasGetStatusString(s));
}

}  // namespace fp::cuda
