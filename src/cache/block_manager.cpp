// cache/block_manager.cpp — block tables, copy-on-write and the prefix-cache hooks.
#include "cache/block_manager.h"

#include "core/error.h"

namespace fp {

BlockManager::BlockManager(KvPool& pool, bool prefix_caching) : pool_(pool) {
  if (prefix_caching) cache_ = std::make_unique<PrefixCache>(pool.blocks(), pool.page_size());
}

int64_t BlockManager::n_available() const { return n_free() + (cache_ ? cache_->n_evictable() : 0); }

int32_t BlockManager::allocate() {
  int32_t b = pool_.blocks().allocate();
  while (b < 0 && cache_ && cache_->evict_one()) b = pool_.blocks().allocate();
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
  if (need > n_free() && need > n_available()) return false;  // (the tree walk only when the free list is short)
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  for (int64_t b = write_from / page_size(); b < have && b * page_size() < n_tokens; ++b) {
    int32_t& blk = t.blocks[static_cast<size_t>(b)];
    if (pool_.blocks().refcount(blk) <= 1) continue;
    int32_t copy = allocate();
    FP_CHECK(copy >= 0, "KV block accounting error: copy-on-write found no block");
    pool_.copy_block(blk, copy);
    pool_.blocks().unref(blk);
    blk = copy;
    if (b < t.n_registered) t.n_registered = b;  // the copy is not in the prefix cache
  }
  while (static_cast<int64_t>(t.blocks.size()) < blocks_for(n_tokens)) {
    int32_t b = allocate();
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
