// tests/cuda_ops.h — the CUDA op-test harness (ggml's test-backend-ops, for the GPU): each case
// builds random host inputs (never zeros), runs the CPU reference kernel on them, uploads them
// with DeviceBuffer / copy_bytes, and runs every CUDA kernel of the op that accepts the case on
// an output poisoned with NaN, then compares the downloaded result with the reference by the
// normalised error ||out - ref||_2 / ||ref||_2 (a NaN or inf where the reference is finite fails).
// A CUDA error (thrown by FP_CUDA / FP_CUBLAS, or found by the synchronize after the run) fails
// the case with its message.
//
// Without a usable GPU every test skips, printing why. Setting FASTPATH_CUDA_TESTS_ON_CPU=1
// instead runs the same tables with "device" buffers in host memory and the CPU reference
// kernels in place of the CUDA ones (error 0 expected): a check of the harness and the case
// tables on a machine without a GPU; the CUDA kernels' refuse() answers are still asked.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "core/device.h"
#include "kernels/registry.h"

namespace fp::test {

inline bool cuda_tests_on_cpu() {
  const char* v = std::getenv("FASTPATH_CUDA_TESTS_ON_CPU");
  return v && std::string(v) == "1";
}
// Where the tests' buffers live and which backend's kernels they check.
inline Device test_device() { return cuda_tests_on_cpu() ? Device::CPU : Device::CUDA; }

#define FP_SKIP_WITHOUT_GPU()                                                             \
  do {                                                                                    \
    const std::string fp_why_ = ::fp::device_unavailable(::fp::Device::CUDA);             \
    if (!fp_why_.empty() && !::fp::test::cuda_tests_on_cpu())                             \
      GTEST_SKIP() << "skipped: no GPU (" << fp_why_ << ")";                              \
  } while (0)

// A device copy of a host vector (at least one byte, so every pointer is real).
template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(test_device(), std::max<size_t>(v.size() * sizeof(T), 1));
  if (!v.empty()) copy_bytes(test_device(), b.data(), Device::CPU, v.data(), v.size() * sizeof(T));
  return b;
}
template <class T>
void upload_into(DeviceBuffer& b, const std::vector<T>& v) {
  if (!v.empty()) copy_bytes(test_device(), b.data(), Device::CPU, v.data(), v.size() * sizeof(T));
}
template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  if (count) copy_bytes(Device::CPU, v.data(), test_device(), b.data(), count * sizeof(T));
  return v;
}

// ||got - ref|| / ||ref||; infinity when got has a NaN or inf that ref does not (an unwritten
// poisoned element, an overflow). An all-zero reference must be matched exactly.
inline double l2_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i]) != std::isfinite(got[i])) return INFINITY;
    if (!std::isfinite(ref[i])) continue;
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

// Index of the first element that is NaN in got but not in ref (-1: none): "unwritten".
inline int64_t first_unwritten(const std::vector<float>& got, const std::vector<float>& ref) {
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i)
    if (std::isnan(got[i]) && !std::isnan(ref[i])) return static_cast<int64_t>(i);
  return -1;
}

template <class Args>
const Kernel<Args>* find_kernel(Backend b, const std::string& name) {
  for (auto& k : OpRegistry<Args>::instance().kernels())
    if (k.backend == b && k.name == name) return &k;
  return nullptr;
}

// The kernels under test: the CUDA ones, or (FASTPATH_CUDA_TESTS_ON_CPU) the CPU reference.
template <class Args>
std::vector<const Kernel<Args>*> kernels_under_test() {
  std::vector<const Kernel<Args>*> ks;
  for (auto& k : OpRegistry<Args>::instance().kernels()) {
    if (cuda_tests_on_cpu() ? (k.backend == Backend::CPU && k.reference && k.name == "ref") : k.backend == Backend::CUDA)
      ks.push_back(&k);
  }
  return ks;
}

// Every CUDA kernel's refuse(): host logic only, safe without a GPU. "" when it accepts.
template <class Args>
std::string refusal(const Kernel<Args>& k, const Args& a) {
  return k.refuse ? k.refuse(a) : std::string();
}

// Runs k on device arguments and waits for it; "" or the error.
template <class Args>
std::string run_kernel(const Kernel<Args>& k, const Args& a) {
  try {
    DeviceScope scope(test_device());
    k.run(a);
    if (test_device() == Device::CUDA) device_memory(Device::CUDA).synchronize();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// How many cases each kernel ran, for "every kernel was exercised" checks at the end of a test.
struct Coverage {
  std::map<std::string, int> ran;
  // Fails unless every named kernel ran at least once (skipped in the CPU self-check mode).
  void expect_ran(std::initializer_list<const char*> names) const {
    if (cuda_tests_on_cpu()) return;
    for (const char* n : names) {
      auto it = ran.find(n);
      EXPECT_TRUE(it != ran.end() && it->second > 0) << "CUDA kernel " << n << " accepted no case of this table";
    }
  }
};

}  // namespace fp::test
