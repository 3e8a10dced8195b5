// core/device.cpp — the device memory table, DeviceBuffer and the thread's execution device.
#include "core/device.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "core/error.h"

namespace fp {

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

namespace {
DeviceMemoryOps g_cuda;  // filled by the CUDA backend's registrar when it is compiled in
DeviceGraphOps g_cuda_graphs;
std::atomic<uint64_t> g_epoch{0};
thread_local Device t_device = Device::CPU;
}  // namespace

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

bool device_from_name(const std::string& name, Device* out) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "cpu") *out = Device::CPU;
  else if (n == "cuda" || n == "gpu") *out = Device::CUDA;
  else return false;
  return true;
}

DeviceMemoryOps register_device_memory(Device d, const DeviceMemoryOps& ops) {
  FP_CHECK(d == Device::CUDA, "only the CUDA device registers memory functions");
  return std::exchange(g_cuda, ops);
}

DeviceGraphOps register_device_graphs(Device d, const DeviceGraphOps& ops) {
  FP_CHECK(d == Device::CUDA, "only the CUDA device registers graph functions");
  return std::exchange(g_cuda_graphs, ops);
}

const DeviceGraphOps* device_graphs(Device d) {
  if (d == Device::CPU || !g_cuda_graphs.begin_capture || !device_unavailable(d).empty()) return nullptr;
  return &g_cuda_graphs;
}

uint64_t device_memory_epoch() { return g_epoch.load(); }
void note_device_allocation() { ++g_epoch; }

std::string device_unavailable(Device d) {
  if (d == Device::CPU) return "";
  if (!g_cuda.unavailable) return "fastpath was built without CUDA (nvcc was not found when it was configured)";
  return g_cuda.unavailable();
}

const DeviceMemoryOps& device_memory(Device d) {
  FP_CHECK(d == Device::CUDA, "device_memory(cpu): host memory needs no device functions");
  std::string why = device_unavailable(d);
  FP_CHECK(why.empty(), "device ", device_name(d), " cannot be used: ", why);
  return g_cuda;
}

void copy_bytes(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  device_memory(Device::CUDA).copy(dst, src, bytes);
}

void copy_bytes_async(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const DeviceMemoryOps& ops = device_memory(Device::CUDA);
  if (ops.copy_async) ops.copy_async(dst, src, bytes);
  else ops.copy(dst, src, bytes);
}

void copy_rows(Device d, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return;
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  if (d == Device::CPU) {
    for (size_t r = 0; r < rows; ++r) std::memcpy(out + r * dst_pitch, in + r * src_pitch, width);
    return;
  }
  const DeviceMemoryOps& ops = device_memory(d);
  if (ops.copy_2d_async) return ops.copy_2d_async(dst, dst_pitch, src, src_pitch, width, rows);
  for (size_t r = 0; r < rows; ++r) copy_bytes_async(d, out + r * dst_pitch, d, in + r * src_pitch, width);
}

uint64_t device_fence(Device d) {
  if (d == Device::CPU) return 0;
  const DeviceMemoryOps& ops = device_memory(d);
  return ops.fence ? ops.fence() : 0;
}

void wait_device_fence(Device d, uint64_t fence) {
  if (d == Device::CPU) return;
  const DeviceMemoryOps& ops = device_memory(d);
  if (ops.wait_fence) ops.wait_fence(fence);
  else ops.synchronize();
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = std::exchange(o.pinned_, false);
  }
  return *this;
}

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  reset();
  if (device_ != Device::CPU && device_memory(device_).alloc_host) {
    data_ = device_memory(device_).alloc_host(bytes);
    pinned_ = true;
  } else {
    // Cache-line aligned (malloc gives 16 bytes): the AMX kernel's tiles store their sums here,
    // and a 64-byte tile row across two lines costs two (kernels/cpu/aligned_vector.h).
    data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    FP_CHECK(data_, "out of host memory allocating ", bytes, " bytes");
  }
  bytes_ = bytes;
}

void PinnedBuffer::reset() {
  if (!data_) return;
  if (pinned_) device_memory(device_).release_host(data_);
  else std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  reset();
  if (device_ == Device::CPU) {
    // Cache-line aligned (malloc gives 16 bytes): the AMX kernel's tiles store their sums here,
    // and a 64-byte tile row across two lines costs two (kernels/cpu/aligned_vector.h).
    data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    FP_CHECK(data_, "out of host memory allocating ", bytes, " bytes");
  } else {
    data_ = device_memory(device_).alloc(bytes);
    note_device_allocation();
  }
  bytes_ = bytes;
}

void DeviceBuffer::reset() {
  if (!data_) return;
  if (device_ == Device::CPU) std::free(data_);
  else device_memory(device_).release(data_);
  data_ = nullptr;
  bytes_ = 0;
}

Device current_device() { return t_device; }
DeviceScope::DeviceScope(Device d) : saved_(t_device) { t_device = d; }
DeviceScope::~DeviceScope() { t_device = saved_; }

}  // namespace fp
