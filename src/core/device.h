// core/device.h — where data lives and ops run: memory on a compute device behind a small table
// of functions that a backend registers (so core/ never includes a GPU runtime), an owning
// buffer, and the thread's execution device that the op dispatcher reads.
//
// A backend that is not compiled in, or compiled in but without a usable device, says why
// through device_unavailable(): "built without CUDA (nvcc was not found at configure time)",
// "no CUDA device: CUDA driver version is insufficient for CUDA runtime version".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <utility>

#include "core/tensor.h"

namespace fp {

// Bytes of MemAvailable in /proc/meminfo: host memory free or reclaimable now (0 if unknown).
int64_t available_memory_bytes();

const char* device_name(Device d);                       // "cpu", "cuda"
bool device_from_name(const std::string& name, Device* out);  // "cpu" / "cuda" (any case)

// What a device's silicon allows, measured on it (bench prints figures as fractions of these).
struct DeviceCeilings {
  std::string name;          // e.g. "NVIDIA H200 (132 SMs, 139.8 GiB)"
  double copy_gbps = 0;      // device-to-device copy, bytes read + bytes written per second / 1e9
  double bf16_gflops = 0;    // dense BF16 matrix product through the vendor library (cuBLAS), GFLOP/s
  // The engine's own matmul op (F32 activations in, F32 out) at 8192 tokens x 8192 x 8192, GFLOP/s:
  double gemm_bf16_gflops = 0;          // BF16 weights (gemm_cublas)
  double gemm_fp8_gflops = 0;           // FP8 E4M3 128x128 block-scaled weights (cublaslt_fp8; 0: not taken here)
  double gemm_fp8_dequant_gflops = 0;   // the same FP8 weights dequantized to BF16 first (gemm_cublas)
  // cuBLASLt's FP8 matmul alone (no quantization of x) at that shape: the heuristic's first
  // algorithm and the fastest of its candidates, as timed by cublaslt_fp8 (0: not timed).
  double lt_fp8_first_gflops = 0;
  double lt_fp8_chosen_gflops = 0;
  int lt_fp8_candidates = 0;
  // The decode GEMV alone (one token, BF16 weights [out, in]), weight bytes read per second / 1e9,
  // for each GEMV kernel at the shapes a Llama-3-8B decode step runs: launches one after another
  // on distinct weights (none from L2), plain and chained (programmatic dependent launch; 0
  // where the GPU has none).
  struct GemvRate {
    int64_t out = 0, in = 0;
    double gemv_gbps = 0, gemv_warp_gbps = 0;
    double gemv_chained_gbps = 0, gemv_warp_chained_gbps = 0;
  };
  std::vector<GemvRate> gemv_rates;
  bool chained_launches = false;  // whether this run's kernels are chained (FASTPATH_CUDA_PDL=1 on a GPU that can)
};

// Memory functions of a device backend. copy() moves bytes between any two addresses of the
// host or the device (the direction follows from the pointers, as with unified addressing);
// every function throws fp::Error on failure, naming the call.
struct DeviceMemoryOps {
  std::string (*unavailable)() = nullptr;  // "" when the device can be used, else why not
  void* (*alloc)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;
  void (*fill_zero)(void* p, size_t bytes) = nullptr;
  void (*synchronize)() = nullptr;  // waits for all work queued on the device
  // Queued work that the host need not wait for (null: the device has none, and the callers
  // below fall back to copy() and to waiting for nothing). copy_async queues a copy behind the
  // work already queued and returns; host memory it reads or writes must be alloc_host's and
  // stay untouched until a fence after it was waited for. fence marks the work queued so far;
  // wait_fence(f) returns once that work has run.
  void (*copy_async)(void* dst, const void* src, size_t bytes) = nullptr;
  void* (*alloc_host)(size_t bytes) = nullptr;  // page-locked host memory (the device copies it directly)
  void (*release_host)(void* p) = nullptr;
  uint64_t (*fence)() = nullptr;
  void (*wait_fence)(uint64_t fence) = nullptr;
  // A queued 2-D copy within device memory: `rows` rows of `width` bytes, source rows
  // `src_pitch` bytes apart, destination rows `dst_pitch` apart; recorded into a graph being
  // captured as a kernel is. Null: copy_rows copies row by row with copy_async.
  void (*copy_2d_async)(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                        size_t rows) = nullptr;
  size_t (*free_bytes)() = nullptr;  // free device memory
  DeviceCeilings (*measure_ceilings)() = nullptr;  // a second or two of copies and matrix products
  // The decode GEMVs alone into c.gemv_rates (DeviceCeilings::GemvRate; ~10 s of streaming, so
  // only on request: bench --gemv-rates). Null: the device has none to time.
  void (*measure_gemv_rates)(DeviceCeilings& c) = nullptr;
};
// Installs a device's functions; returns the ones it replaces (tests swap in a host-memory
// stand-in and put the real ones back).
DeviceMemoryOps register_device_memory(Device d, const DeviceMemoryOps& ops);
// "" when d can be used (always for the CPU), else the reason.
std::string device_unavailable(Device d);
// The device's functions; throws with device_unavailable(d) when it cannot be used.
const DeviceMemoryOps& device_memory(Device d);

// Bytes between host and device memory (either side may be the host; CPU-to-CPU is memcpy).
void copy_bytes(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes);
// The same, queued behind the device's work (DeviceMemoryOps::copy_async): host memory on
// either side must be a PinnedBuffer's, untouched until a later fence was waited for. A device
// without queued copies copies now.
void copy_bytes_async(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes);
// `rows` rows of `width` bytes within d's memory (pitches in bytes), queued behind its work
// (DeviceMemoryOps::copy_2d_async; memcpy per row on the CPU).
void copy_rows(Device d, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);
// Marks the work queued on d so far (0 on the CPU or a device without fences) and waits for it.
uint64_t device_fence(Device d);
void wait_device_fence(Device d, uint64_t fence);

// Recording a device's queued work as a graph and replaying it (CUDA graphs): a decode step's
// hundreds of kernel launches become one. Registered by the CUDA backend; null elsewhere.
struct DeviceGraphOps {
  void (*begin_capture)() = nullptr;  // work queued from now on is recorded, not run
  void* (*end_capture)() = nullptr;   // the recording as an executable graph; throws if capture failed
  void (*abort_capture)() = nullptr;  // ends a capture after an error, discarding it (never throws)
  void (*launch)(void* graph) = nullptr;
  void (*destroy)(void* graph) = nullptr;
};
DeviceGraphOps register_device_graphs(Device d, const DeviceGraphOps& ops);
const DeviceGraphOps* device_graphs(Device d);  // null when the device has none
// Bumped whenever device memory is (re)allocated: a recorded graph holds raw addresses, so one
// recorded under another epoch may point at freed memory and must be recorded again.
uint64_t device_memory_epoch();
void note_device_allocation();

// An owning, uninitialised byte buffer on one device, grown (never shrunk) by reserve().
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(Device d, size_t bytes = 0) : device_(d) { reserve(bytes); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  Device device() const { return device_; }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Makes room for `bytes` (old contents are not kept when the buffer grows).
  void reserve(size_t bytes);
  void reset();
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Device device_ = Device::CPU;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory that device d copies to and from without staging (page-locked on a GPU; plain
// memory on the CPU or a device without such memory), grown (never shrunk) by reserve().
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(Device d) : device_(d) {}
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void reserve(size_t bytes);  // old contents are not kept when it grows
  void reset();
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Device device_ = Device::CPU;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

// The device the calling thread's ops run on (what dispatch() picks kernels for). CPU unless a
// DeviceScope is active: a model placed on CUDA runs its forward inside DeviceScope(CUDA).
Device current_device();
class DeviceScope {
 public:
  explicit DeviceScope(Device d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device saved_;
};

}  // namespace fp
