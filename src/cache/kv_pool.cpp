// cache/kv_pool.cpp — the block allocator and the paged K/V storage.
#include "cache/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace fp {

BlockAllocator::BlockAllocator(int64_t n_blocks) : refs_(static_cast<size_t>(n_blocks), 0) {
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::ref(int32_t block) {
  FP_CHECK(block >= 0 && block < n_blocks() && refs_[static_cast<size_t>(block)] > 0, "ref of free or invalid block ",
           block);
  ++refs_[static_cast<size_t>(block)];
}

bool BlockAllocator::unref(int32_t block) {
  FP_CHECK(block >= 0 && block < n_blocks() && refs_[static_cast<size_t>(block)] > 0, "unref of free or invalid block ",
           block);
  if (--refs_[static_cast<size_t>(block)] > 0) return false;
  // Keep the free stack ordered so the lowest id comes out next.
  auto it = std::lower_bound(free_.begin(), free_.end(), block, std::greater<int32_t>());
  free_.insert(it, block);
  return true;
}

int32_t BlockAllocator::refcount(int32_t block) const {
  FP_CHECK(block >= 0 && block < n_blocks(), "invalid block ", block);
  return refs_[static_cast<size_t>(block)];
}

KvPool::KvPool(const KvLayout& layout, int64_t page_size, int64_t n_blocks)
    : layout_(layout), page_size_(page_size), n_blocks_(n_blocks), blocks_(n_blocks) {
  FP_CHECK(page_size > 0, "KV page size must be positive, got ", page_size);
  FP_CHECK(n_blocks >= 0, "KV block count must be >= 0, got ", n_blocks);
  const size_t slots = static_cast<size_t>(n_blocks * page_size);
  k_.resize(static_cast<size_t>(layout.n_layers));
  v_.resize(static_cast<size_t>(layout.n_layers));
  for (auto& k : k_) k.reset(new float[slots * static_cast<size_t>(layout.k_width)]);
  for (auto& v : v_) v.reset(new float[std::max<size_t>(1, slots * static_cast<size_t>(layout.v_width))]);
}

void KvPool::copy_block(int32_t src, int32_t dst) {
  FP_CHECK(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_, "copy_block: invalid block ", src, " -> ", dst);
  for (int64_t l = 0; l < layout_.n_layers; ++l) {
    const size_t kw = static_cast<size_t>(page_size_ * layout_.k_width), vw = static_cast<size_t>(page_size_ * layout_.v_width);
    std::memcpy(k(l) + dst * kw, k(l) + src * kw, kw * 4);
    if (vw) std::memcpy(v(l) + dst * vw, v(l) + src * vw, vw * 4);
  }
}

bool valid_page_size(int64_t page_size) {
  for (int64_t p : {1, 8, 16, 32, 64, 128, 256})
    if (p == page_size) return true;
  return false;
}

std::string page_sizes_text() { return "1, 8, 16, 32, 64, 128, 256"; }

}  // namespace fp
