// cache/block_manager.h — gives sequences the KV blocks they need: block tables that grow as
// tokens are computed, prefix-cache reuse at admission, copy-on-write for shared partial
// blocks (forked sequences), registration of full blocks into the prefix cache, and freeing.
// In a partitioned pool (data-parallel attention, KvPartition) a sequence takes every block
// from one partition, and each partition has a prefix tree of its own (a cached block serves
// only sequences on the rank that stores it). A new sequence goes to the partition that would
// keep the most blocks obtainable (free, plus what its tree could evict) once it is placed, its
// cached prefix there counting as blocks it need not take (attach_prefix).
//
// Window trimming (KvPool::trims_windows): the sliding-window layers keep their rows in blocks of
// their own (BlockTable::window, one per block of positions, like `blocks`), and a table gives
// such a block back once every position in it has slid out of the window of the tokens still to
// come. A prefix hit then needs, beside the cached blocks, the window blocks of the last window
// of positions before the point where computing resumes: a window block whose main block is in
// the prefix tree is kept (keyed by that main block, dropped when the tree evicts it) when its
// table lets it go, and attach_prefix shortens a hit to the longest prefix whose window is there.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/kv_pool.h"
#include "cache/prefix_cache.h"

namespace fp {

// One sequence's view of the pool.
struct BlockTable {
  std::vector<int32_t> blocks;  // in position order: block i holds positions [i*P, (i+1)*P)
  int64_t n_registered = 0;     // leading full blocks already offered to the prefix cache
  // Window trimming: the windowed layers' block for positions [i*P, (i+1)*P), -1 once given back
  // (out of the window); as long as `blocks`.
  std::vector<int32_t> window;
  // The prefix trees' key its blocks are found and registered under: its LoRA adapter (KV
  // computed under one adapter is not the base model's, nor another adapter's).
  int32_t prefix_key = 0;
};

class BlockManager {
 public:
  BlockManager(KvPool& pool, bool prefix_caching);
  KvPool& pool() { return pool_; }
  int64_t page_size() const { return pool_.page_size(); }
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + page_size() - 1) / page_size(); }
  // Blocks obtainable now: free ones plus cached ones that eviction can free (in partition
  // `part` only, when given). With window trimming, the smaller of the main and the window
  // blocks' counts (so a need from blocks_needed, the larger of the two, fits both).
  int64_t n_available() const;
  int64_t n_available(int part) const;
  bool trims_windows() const { return pool_.trims_windows(); }
  // Window blocks obtainable now (free, plus kept ones no table holds), and those kept for prefix hits.
  int64_t n_window_available() const;
  int64_t n_window_kept() const { return static_cast<int64_t>(kept_window_.size()); }
  std::vector<int32_t> kept_window_blocks() const;  // (for invariant checks)
  int64_t n_free() const { return pool_.blocks().n_free(); }
  // The partition a table's blocks come from (0 in an unpartitioned pool, -1 for an empty table
  // of a partitioned one: its first block decides).
  int partition_of(const BlockTable& t) const;
  bool prefix_caching() const { return !caches_.empty(); }
  // Partition `part`'s prefix tree (null without prefix caching).
  PrefixCache* prefix_cache(int part = 0) { return caches_.empty() ? nullptr : caches_[static_cast<size_t>(part)].get(); }
  // Prompt tokens looked up in and served from the prefix trees, all partitions together.
  int64_t prefix_lookup_tokens() const;
  int64_t prefix_hit_tokens() const;

  // For an empty table: reuses the cached whole blocks of tokens[0..n), keeping at least one
  // token to compute (partitioned: from the partition chosen as above, which the table then
  // belongs to). Returns the number of tokens whose KV is now in place.
  int64_t attach_prefix(BlockTable& t, const int32_t* tokens, int64_t n);
  // Extra blocks that ensure(t, write_from, n_tokens) would take (window trimming: the larger
  // of the main and the window blocks it would take).
  int64_t blocks_needed(const BlockTable& t, int64_t write_from, int64_t n_tokens) const;
  // Makes the table cover positions [0, n_tokens) with positions write_from.. writable (a
  // shared block there is copied first). All or nothing: false when blocks run short. With
  // window trimming it first gives back the window blocks no query from write_from on can see.
  bool ensure(BlockTable& t, int64_t write_from, int64_t n_tokens);
  // Offers the table's full blocks of computed tokens to the prefix cache.
  void register_computed(BlockTable& t, const int32_t* tokens, int64_t n_computed);
  // Returns the table's blocks past those covering positions [0, n_tokens) (a refused
  // speculative draft's), which hold nothing registered.
  void truncate(BlockTable& t, int64_t n_tokens);
  // Returns every block of the table (cached ones stay cached) and empties it.
  void release(BlockTable& t);
  // Makes `child` share all of `parent`'s blocks.
  void fork(const BlockTable& parent, BlockTable& child);

 private:
  int32_t allocate(int part);
  int32_t allocate_window();
  // Window trimming: the first block a query at write_from or later can see.
  int64_t first_visible_block(int64_t write_from) const;
  int64_t window_blocks_needed(const BlockTable& t, int64_t write_from, int64_t n_tokens) const;
  void ensure_window(BlockTable& t, int64_t write_from, int64_t n_tokens);  // takes what window_blocks_needed counts
  // Gives back window block i of t: kept for prefix hits when its main block is in the tree.
  void let_go_window(BlockTable& t, int64_t i);
  void forget_kept_window(int32_t main_block);  // the tree evicted main_block
  bool evict_kept_window();                      // frees the least recently kept one no table holds
  KvPool& pool_;
  std::vector<std::unique_ptr<PrefixCache>> caches_;  // one per partition; empty without prefix caching
  struct KeptWindow {
    int32_t block;
    uint64_t tick;
  };
  std::unordered_map<int32_t, KeptWindow> kept_window_;  // main block (a prefix-tree node) -> its window block
  uint64_t kept_tick_ = 0;
};

}  // namespace fp
