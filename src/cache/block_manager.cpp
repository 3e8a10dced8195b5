// cache/block_manager.cpp — block tables, copy-on-write and the prefix-cache hooks.
#include "cache/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace fp {

BlockManager::BlockManager(KvPool& pool, bool prefix_caching) : pool_(pool) {
  if (prefix_caching)
    for (int p = 0; p < pool.blocks().parts(); ++p) caches_.push_back(std::make_unique<PrefixCache>(pool.blocks(), pool.page_size()));
}

int BlockManager::partition_of(const BlockTable& t) const {
  const BlockAllocator& a = pool_.blocks();
  if (a.parts() == 1) return 0;
  return t.blocks.empty() ? -1 : a.partition_of(t.blocks.front());
}

int64_t BlockManager::n_available() const {
  int64_t n = n_free();
  for (const auto& c : caches_) n += c->n_evictable();
  return n;
}

int64_t BlockManager::n_available(int part) const {
  return pool_.blocks().n_free(part) + (caches_.empty() ? 0 : caches_[static_cast<size_t>(part)]->n_evictable());
}

int64_t BlockManager::prefix_lookup_tokens() const {
  int64_t n = 0;
  for (const auto& c : caches_) n += c->lookup_tokens();
  return n;
}

int64_t BlockManager::prefix_hit_tokens() const {
  int64_t n = 0;
  for (const auto& c : caches_) n += c->hit_tokens();
  return n;
}

int32_t BlockManager::allocate(int part) {
  // A partition's tree holds only that partition's blocks, so evicting from it frees one there.
  PrefixCache* cache = prefix_cache(part);
  int32_t b = pool_.blocks().allocate(part);
  while (b < 0 && cache && cache->evict_one()) b = pool_.blocks().allocate(part);
  return b;
}

int64_t BlockManager::attach_prefix(BlockTable& t, const int32_t* tokens, int64_t n) {
  FP_CHECK(t.blocks.empty(), "attach_prefix on a sequence that already has blocks");
  if (caches_.empty() || n <= 1) return 0;
  const int64_t max_blocks = (n - 1) / page_size();
  // Partitioned: the partition that would keep the most blocks for others once this sequence is
  // placed, a cached block counting as one it need not take (obtainable blocks + prefix length);
  // ties go to the longer prefix. So a prefix draws its sequences to its rank until that rank is
  // fuller than the others by more than the prefix saves. The lookup is counted in the chosen tree.
  int best = 0;
  int64_t best_len = -1, best_score = -1;
  for (int p = 0; p < static_cast<int>(caches_.size()); ++p) {
    const int64_t len = caches_[static_cast<size_t>(p)]->matched_blocks(tokens, max_blocks);
    const int64_t score = (caches_.size() > 1 ? n_available(p) : 0) + len;
    if (score > best_score || (score == best_score && len > best_len)) best = p, best_len = len, best_score = score;
  }
  t.blocks = caches_[static_cast<size_t>(best)]->match(tokens, max_blocks);
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
  if (part < 0) {  // a new table of a partitioned pool: the partition with the most blocks obtainable
    int64_t most = -1;
    for (int p = 0; p < a.parts(); ++p)
      if (const int64_t avail = n_available(p); avail > most) part = p, most = avail;
  }
  // (The prefix tree's evictable blocks count too, walked only when the free list is short.)
  if (need > a.n_free(part) && need > n_available(part)) return false;
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
  if (caches_.empty() || t.blocks.empty()) return;
  const int64_t full = std::min<int64_t>(n_computed / page_size(), static_cast<int64_t>(t.blocks.size()));
  if (full <= t.n_registered) return;
  caches_[static_cast<size_t>(partition_of(t))]->insert(tokens, full, t.blocks.data());
  t.n_registered = full;
}

void BlockManager::truncate(BlockTable& t, int64_t n_tokens) {
  const auto keep = static_cast<size_t>(blocks_for(n_tokens));
  while (t.blocks.size() > keep) {
    pool_.blocks().unref(t.blocks.back());
    t.blocks.pop_back();
  }
  t.n_registered = std::min<int64_t>(t.n_registered, static_cast<int64_t>(t.blocks.size()));
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
