// cache/block_manager.cpp — block tables, copy-on-write and the prefix-cache hooks.
#include "cache/block_manager.h"

#include "core/error.h"

namespace fp {

BlockManager::BlockManager(KvPool& pool, bool prefix_caching) : pool_(pool) {
  // A cached prefix would have to be shared across partitions: the two do not combine.
  FP_CHECK(!prefix_caching || pool.blocks().parts() == 1, "prefix caching needs an unpartitioned KV pool");
  if (prefix_caching) cache_ = std::make_unique<PrefixCache>(pool.blocks(), pool.page_size());
}

int BlockManager::partition_of(const BlockTable& t) const {
  const BlockAllocator& a = pool_.blocks();
  if (a.parts() == 1) return 0;
  return t.blocks.empty() ? -1 : a.partition_of(t.blocks.front());
}

int64_t BlockManager::n_available() const { return n_free() + (cache_ ? cache_->n_evictable() : 0); }

int32_t BlockManager::allocate(int part) {
  int32_t b = pool_.blocks().allocate(part);
  while (b < 0 && cache_ && cache_->evict_one()) b = pool_.blocks().allocate(part);
  return b;
}

int64_t BlockManager::attach_prefix(BlockTable& t, const int32_t* tokens, int64_t n) {
  FP_CHECK(t.blocks.empty(), "attach_prefix on a sequence that already has blocks");
  if (!cache_ || n <= 1) return 0;
  t.blocks = cache_->match(tokens, (n - 1) / page_size());
  t.n_registered = static_cast<int64_t>(t.blocks.size());
  return t.n_registered * page_size();
}

int64_t BlockManager::blocks_needed(const BlockTable& t, int64_t write_from, int64_t n_tokens) const {
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  int64_t need = std::max<int64_t>(0, blocks_for(n_tokens) - have);
  const int64_t first = write_from / page_size();
  for (int64_t b = first; b < have && b * page_size() < n_tokens; ++b)
    if (pool_.blocks().refcount(t.blocks[static_cast<size_t>(b)]) > 1) ++need;  // copy-on-write
  return need;
}

bool BlockManager::ensure(BlockTable& t, int64_t write_from, int64_t n_tokens) {
  const int64_t need = blocks_needed(t, write_from, n_tokens);
  if (need == 0) return true;
  const BlockAllocator& a = pool_.blocks();
  int part = partition_of(t);
  if (part < 0) {  // a new table of a partitioned pool: the partition with the most free blocks
    part = 0;
    for (int p = 1; p < a.parts(); ++p)
      if (a.n_free(p) > a.n_free(part)) part = p;
  }
  // (Unpartitioned: the prefix tree's evictable blocks count too, walked only when the free list is short.)
  if (need > a.n_free(part) && (a.parts() > 1 || need > n_available())) return false;
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  for (int64_t b = write_from / page_size(); b < have && b * page_size() < n_tokens; ++b) {
    int32_t& blk = t.blocks[static_cast<size_t>(b)];
    if (pool_.blocks().refcount(blk) <= 1) continue;
    int32_t copy = allocate(part);
    FP_CHECK(copy >= 0, "KV block accounting error: copy-on-write found no block");
    pool_.copy_block(blk, copy);
    pool_.blocks().unref(blk);
    blk = copy;
    if (b < t.n_registered) t.n_registered = b;  // the copy is not in the prefix cache
  }
  while (static_cast<int64_t>(t.blocks.size()) < blocks_for(n_tokens)) {
    int32_t b = allocate(part);
    FP_CHECK(b >= 0, "KV block accounting error: no block although ", need, " were available");
    t.blocks.push_back(b);
  }
  return true;
}

void BlockManager::register_computed(BlockTable& t, const int32_t* tokens, int64_t n_computed) {
  if (!cache_) return;
  const int64_t full = std::min<int64_t>(n_computed / page_size(), static_cast<int64_t>(t.blocks.size()));
  if (full <= t.n_registered) return;
  cache_->insert(tokens, full, t.blocks.data());
  t.n_registered = full;
}

void BlockManager::release(BlockTable& t) {
  for (int32_t b : t.blocks) pool_.blocks().unref(b);
  t.blocks.clear();
  t.n_registered = 0;
}

void BlockManager::fork(const BlockTable& parent, BlockTable& child) {
  FP_CHECK(child.blocks.empty(), "fork into a sequence that already has blocks");
  child = parent;
  for (int32_t b : child.blocks) pool_.blocks().ref(b);
}

}  // namespace fp
