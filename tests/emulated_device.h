// tests/emulated_device.h — a host-memory stand-in for the CUDA device, for tests on machines
// without a GPU.
//
// Its memory functions are malloc/memcpy and every op gets a "cuda"-backend kernel named
// "emulated" that runs the CPU reference (the real CUDA kernels refuse, naming the missing GPU);
// the collectives get one that runs the CPU "mpi" kernel on the (host-memory) device buffers, so
// a model placed on the device can be split across MPI ranks as GPU ranks split it over NCCL.
// A started collective gets its handle at the call and leaves NaN in its destination until the
// wait, as rows in flight on NCCL's own stream (a step that reads them early fails).
// That exercises everything a model does to run on a device except the GPU kernels themselves:
// weights uploaded once, the batch staged, the KV pool and activations on the device, logits
// copied back, dispatch scoped to the device, steps recorded and replayed as graphs (tapes of
// calls here). With `deferred`, its work waits in a stream until the host waits for it, as on a
// GPU, so host code that reads results it did not wait for sees stale memory.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <functional>

#include "core/device.h"

namespace fp::test {

// The stand-in's stream (EmulatedDevice(true)): kernels, graph launches and queued copies wait
// in order until the host waits for them — a synchronous copy, a synchronize, a fence, a free.
struct EmulatedStream {
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0, ran = 0;         // calls queued and run so far
  uint64_t waits_with_work_behind = 0;  // fence waits that left later work queued: the host was ahead
  void push(std::function<void()> f);
  void run_until(uint64_t n);
  void flush() { run_until(queued); }
};

// Swaps the stand-in in for the CUDA device for the life of the object.
class EmulatedDevice {
 public:
  explicit EmulatedDevice(bool deferred = false);
  ~EmulatedDevice();
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;
  const EmulatedStream& stream() const { return stream_; }

 private:
  DeviceMemoryOps saved_;
  DeviceGraphOps saved_graphs_;
  EmulatedStream stream_;
};

// The stand-in tests run where no GPU is (with one, the real device's tests run instead).
#define FP_REQUIRE_NO_GPU()                                                                              \
  do {                                                                                                   \
    if (::fp::device_unavailable(::fp::Device::CUDA).empty())                                            \
      GTEST_SKIP() << "a GPU is present: the CudaModel tests run the real device instead of a stand-in"; \
  } while (0)

}  // namespace fp::test
