// fuzz/fuzz_llama2c.cpp — libFuzzer target for the llama2.c checkpoint loader (legacy and "ak42"
// v1 headers): every tensor it accepts must lie inside the input. fp::Error is expected on bad input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Weights are read as floats: give the parser a 4-byte aligned copy, as mmap would.
  std::vector<float> aligned((size + 3) / 4);
  if (size) std::memcpy(aligned.data(), data, size);
  const auto* d = reinterpret_cast<const uint8_t*>(aligned.data());
  try {
    auto f = fp::Llama2cFile::parse(d, size, "fuzz.bin");
    float sum = 0;
    for (auto& [name, t] : f->tensors()) {
      uint64_t numel = 1;
      for (auto s : t.shape) numel *= static_cast<uint64_t>(s);
      const auto* p = reinterpret_cast<const uint8_t*>(t.data);
      if (p < d || p + numel * 4 > d + size) __builtin_trap();
      if (numel) sum += t.data[0] + t.data[numel - 1];
    }
    (void)sum;
  } catch (const fp::Error&) {
  }
  return 0;
}
