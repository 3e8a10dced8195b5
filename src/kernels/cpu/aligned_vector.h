// kernels/cpu/aligned_vector.h — std::vector on 64-byte (cache-line) aligned storage, for the
// kernels' scratch buffers. malloc aligns to 16 bytes only, and a 64-byte row that straddles two
// cache lines costs an AMX tile load two lines: on Sapphire Rapids a tile load from L1 took 17 ns
// from a 16-byte-aligned buffer against 2.5 ns from a 64-byte-aligned one (bench/RESULTS.md).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace fp::cpu {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace fp::cpu
