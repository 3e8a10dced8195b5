// fuzz/fuzz_safetensors.cpp — libFuzzer target for the safetensors header parser: every tensor it
// accepts must lie inside the input. fp::Error is the expected outcome of bad input.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = fp::SafetensorsFile::parse(data, size, "fuzz.safetensors");
    for (auto& [name, t] : f->tensors()) {
      if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
      uint64_t numel = 1;
      for (auto d : t.shape) numel *= static_cast<uint64_t>(d);
      if (numel * static_cast<uint64_t>(fp::dtype_info(t.type).block_bytes) != t.nbytes) __builtin_trap();
    }
    for (auto& [k, v] : f->metadata()) (void)v.size();
  } catch (const fp::Error&) {
  }
  return 0;
}
