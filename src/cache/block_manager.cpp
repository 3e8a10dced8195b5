// cache/block_manager.cpp — block tables, copy-on-write and the prefix-cache hooks.
#include "cache/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace fp {

BlockManager::BlockManager(KvPool& pool, bool prefix_caching) : pool_(pool) {
  if (prefix_caching)
    for (int p = 0; p < pool.blocks().parts(); ++p) caches_.push_back(std::make_unique<PrefixCache>(pool.blocks(), pool.page_size()));
  if (pool.trims_windows() && !caches_.empty()) caches_[0]->on_evict = [this](int32_t b) { forget_kept_window(b); };
}

int BlockManager::partition_of(const BlockTable& t) const {
  const BlockAllocator& a = pool_.blocks();
  if (a.parts() == 1) return 0;
  return t.blocks.empty() ? -1 : a.partition_of(t.blocks.front());
}

int64_t BlockManager::n_available() const {
  int64_t n = n_free();
  for (const auto& c : caches_) n += c->n_evictable();
  return trims_windows() ? std::min(n, n_window_available()) : n;
}

int64_t BlockManager::n_available(int part) const {
  const int64_t n = pool_.blocks().n_free(part) + (caches_.empty() ? 0 : caches_[static_cast<size_t>(part)]->n_evictable());
  return trims_windows() ? std::min(n, n_window_available()) : n;
}

int64_t BlockManager::n_window_available() const {
  int64_t n = pool_.window_blocks().n_free();
  for (const auto& [main, kept] : kept_window_) n += pool_.window_blocks().refcount(kept.block) == 1;
  return n;
}

std::vector<int32_t> BlockManager::kept_window_blocks() const {
  std::vector<int32_t> out;
  for (const auto& [main, kept] : kept_window_) out.push_back(kept.block);
  return out;
}

int64_t BlockManager::first_visible_block(int64_t write_from) const {
  return std::max<int64_t>(0, write_from - pool_.layout().window + 1) / page_size();
}

int32_t BlockManager::allocate_window() {
  int32_t b = pool_.window_blocks().allocate();
  while (b < 0 && evict_kept_window()) b = pool_.window_blocks().allocate();
  return b;
}

bool BlockManager::evict_kept_window() {
  auto best = kept_window_.end();
  for (auto it = kept_window_.begin(); it != kept_window_.end(); ++it)
    if (pool_.window_blocks().refcount(it->second.block) == 1 && (best == kept_window_.end() || it->second.tick < best->second.tick))
      best = it;
  if (best == kept_window_.end()) return false;
  pool_.window_blocks().unref(best->second.block);
  kept_window_.erase(best);
  return true;
}

void BlockManager::forget_kept_window(int32_t main_block) {
  auto it = kept_window_.find(main_block);
  if (it == kept_window_.end()) return;
  pool_.window_blocks().unref(it->second.block);
  kept_window_.erase(it);
}

void BlockManager::let_go_window(BlockTable& t, int64_t i) {
  int32_t& w = t.window[static_cast<size_t>(i)];
  if (w < 0) return;
  // Kept while the tree holds the main block of the same positions (its key stays valid until
  // the tree evicts it); the table's reference passes to the kept entry.
  const int32_t main = t.blocks[static_cast<size_t>(i)];
  if (!caches_.empty() && i < t.n_registered && caches_[0]->holds(main) && !kept_window_.count(main))
    kept_window_[main] = KeptWindow{w, ++kept_tick_};
  else
    pool_.window_blocks().unref(w);
  w = -1;
}

int64_t BlockManager::window_blocks_needed(const BlockTable& t, int64_t write_from, int64_t n_tokens) const {
  if (!trims_windows()) return 0;
  const int64_t want = blocks_for(n_tokens), have = static_cast<int64_t>(t.window.size());
  int64_t need = std::max<int64_t>(0, want - have);
  for (int64_t b = std::max(first_visible_block(write_from), write_from / page_size()); b < std::min(have, want); ++b) {
    const int32_t w = t.window[static_cast<size_t>(b)];
    if (w < 0 || pool_.window_blocks().refcount(w) > 1) ++need;  // missing, or shared (copy-on-write)
  }
  return need;
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
    const int64_t len = caches_[static_cast<size_t>(p)]->matched_blocks(tokens, max_blocks, nullptr, t.prefix_key);
    const int64_t score = (caches_.size() > 1 ? n_available(p) : 0) + len;
    if (score > best_score || (score == best_score && len > best_len)) best = p, best_len = len, best_score = score;
  }
  int64_t take = max_blocks;
  if (trims_windows()) {
    // Computing resumes at h * P: the window blocks of the positions its queries see must be
    // kept, else the hit shrinks to a shorter prefix whose are (down to none).
    std::vector<int32_t> main;
    caches_[0]->matched_blocks(tokens, max_blocks, &main, t.prefix_key);
    int64_t h = static_cast<int64_t>(main.size());
    auto window_there = [&](int64_t hit) {
      for (int64_t b = first_visible_block(hit * page_size()); b < hit; ++b)
        if (!kept_window_.count(main[static_cast<size_t>(b)])) return false;
      return true;
    };
    while (h > 0 && !window_there(h)) --h;
    take = h;
    t.window.assign(static_cast<size_t>(h), -1);
    for (int64_t b = first_visible_block(h * page_size()); b < h; ++b) {
      KeptWindow& k = kept_window_.at(main[static_cast<size_t>(b)]);
      pool_.window_blocks().ref(k.block);
      k.tick = ++kept_tick_;
      t.window[static_cast<size_t>(b)] = k.block;
    }
  }
  t.blocks = caches_[static_cast<size_t>(best)]->match(tokens, take, t.prefix_key);
  t.n_registered = static_cast<int64_t>(t.blocks.size());
  return t.n_registered * page_size();
}

int64_t BlockManager::blocks_needed(const BlockTable& t, int64_t write_from, int64_t n_tokens) const {
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  int64_t need = std::max<int64_t>(0, blocks_for(n_tokens) - have);
  const int64_t first = write_from / page_size();
  for (int64_t b = first; b < have && b * page_size() < n_tokens; ++b)
    if (pool_.blocks().refcount(t.blocks[static_cast<size_t>(b)]) > 1) ++need;  // copy-on-write
  return std::max(need, window_blocks_needed(t, write_from, n_tokens));
}

bool BlockManager::ensure(BlockTable& t, int64_t write_from, int64_t n_tokens) {
  if (trims_windows()) {
    // Out of the window of every query to come: given back before anything is taken. (Given-back
    // entries are always a prefix of the table: walk back from the newest until one is met.)
    const int64_t gone = std::min(first_visible_block(write_from), static_cast<int64_t>(t.window.size()));
    for (int64_t b = gone - 1; b >= 0 && t.window[static_cast<size_t>(b)] >= 0; --b) let_go_window(t, b);
  }
  // The main blocks' need: new ones, and copies of shared ones about to be written.
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  int64_t need = std::max<int64_t>(0, blocks_for(n_tokens) - have);
  for (int64_t b = write_from / page_size(); b < have && b * page_size() < n_tokens; ++b)
    need += pool_.blocks().refcount(t.blocks[static_cast<size_t>(b)]) > 1;
  const int64_t window_need = window_blocks_needed(t, write_from, n_tokens);
  if (need == 0 && window_need == 0) return true;
  const BlockAllocator& a = pool_.blocks();
  int part = partition_of(t);
  if (part < 0) {  // a new table of a partitioned pool: the partition with the most blocks obtainable
    int64_t most = -1;
    for (int p = 0; p < a.parts(); ++p)
      if (const int64_t avail = n_available(p); avail > most) part = p, most = avail;
  }
  // (The prefix tree's evictable blocks count too, walked only when the free list is short.)
  auto main_available = [&] {
    return a.n_free(part) + (caches_.empty() ? 0 : caches_[static_cast<size_t>(part)]->n_evictable());
  };
  if (need > a.n_free(part) && need > main_available()) return false;
  if (window_need > pool_.window_blocks().n_free() && window_need > n_window_available()) return false;
  if (window_need > 0) ensure_window(t, write_from, n_tokens);
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
  caches_[static_cast<size_t>(partition_of(t))]->insert(tokens, full, t.blocks.data(), t.prefix_key);
  t.n_registered = full;
}

void BlockManager::truncate(BlockTable& t, int64_t n_tokens) {
  const auto keep = static_cast<size_t>(blocks_for(n_tokens));
  while (t.window.size() > keep) {
    if (t.window.back() >= 0) pool_.window_blocks().unref(t.window.back());
    t.window.pop_back();
  }
  while (t.blocks.size() > keep) {
    pool_.blocks().unref(t.blocks.back());
    t.blocks.pop_back();
  }
  t.n_registered = std::min<int64_t>(t.n_registered, static_cast<int64_t>(t.blocks.size()));
}

void BlockManager::release(BlockTable& t) {
  for (int64_t b = 0; b < static_cast<int64_t>(t.window.size()); ++b) let_go_window(t, b);
  t.window.clear();
  for (int32_t b : t.blocks) pool_.blocks().unref(b);
  t.blocks.clear();
  t.n_registered = 0;
}

void BlockManager::fork(const BlockTable& parent, BlockTable& child) {
  FP_CHECK(child.blocks.empty(), "fork into a sequence that already has blocks");
  child = parent;
  for (int32_t b : child.blocks) pool_.blocks().ref(b);
  for (int32_t w : child.window)
    if (w >= 0) pool_.window_blocks().ref(w);
}

void BlockManager::ensure_window(BlockTable& t, int64_t write_from, int64_t n_tokens) {
  const int64_t want = blocks_for(n_tokens);
  for (int64_t b = std::max(first_visible_block(write_from), write_from / page_size());
       b < std::min<int64_t>(want, static_cast<int64_t>(t.window.size())); ++b) {
    int32_t& w = t.window[static_cast<size_t>(b)];
    if (w >= 0 && pool_.window_blocks().refcount(w) <= 1) continue;
    const int32_t fresh = allocate_window();
    FP_CHECK(fresh >= 0, "KV block accounting error: no window block although enough were available");
    if (w >= 0) {  // shared (a forked table): copy before writing
      pool_.copy_window_block(w, fresh);
      pool_.window_blocks().unref(w);
    }
    w = fresh;
  }
  while (static_cast<int64_t>(t.window.size()) < want) {
    const int32_t fresh = allocate_window();
    FP_CHECK(fresh >= 0, "KV block accounting error: no window block although enough were available");
    t.window.push_back(fresh);
  }
}

}  // namespace fp
