// core/hash.h — FNV-1a over bytes: a small, stable 64-bit hash for keys that must not change
// between runs or machines (prefix-cache block keys, synth's per-tensor seeds, tool-call ids).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fp {

inline uint64_t fnv1a64(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
inline uint64_t fnv1a64(std::string_view s) { return fnv1a64(s.data(), s.size()); }

}  // namespace fp
