// cache/prefix_cache.h — prefix-cache reuse: a radix tree whose edges are full blocks of tokens.
// A node holds the KV block computed for its block of tokens after the tokens on its path, so a
// new prompt that starts with a cached path reuses those blocks and computes only the rest.
// The tree keeps one reference on every block it holds; a leaf whose block nobody else
// references is evictable, least recently used first. Paths live under a key (a root each): KV
// computed under one LoRA adapter serves only the prompts of that adapter (key 0: none).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/kv_pool.h"

namespace fp {

class PrefixCache {
 public:
  PrefixCache(BlockAllocator& blocks, int64_t page_size);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The cached blocks for the longest run of whole blocks of tokens[0..max_blocks*page): each
  // returned block gets one reference for the caller. Counts looked-up and hit tokens.
  std::vector<int32_t> match(const int32_t* tokens, int64_t max_blocks, int32_t key = 0);
  // How many blocks match() would return, touching nothing (no references, statistics or LRU);
  // with `blocks`, which ones.
  int64_t matched_blocks(const int32_t* tokens, int64_t max_blocks, std::vector<int32_t>* blocks = nullptr,
                         int32_t key = 0) const;
  // Records blocks[0..n_blocks) as holding the whole blocks of tokens[0..n_blocks*page). Levels
  // already cached (by this or another sequence) are kept as they are.
  void insert(const int32_t* tokens, int64_t n_blocks, const int32_t* blocks, int32_t key = 0);
  // Frees the least recently used leaf block that only the tree references; false if none.
  bool evict_one();
  // Called with each block the tree lets go of (evicted), before it is freed.
  std::function<void(int32_t)> on_evict;
  // Drops every unreferenced cached block.
  void clear();

  int64_t n_cached() const { return n_nodes_; }
  bool holds(int32_t block) const { return held_.count(block) > 0; }  // a node of the tree holds it
  std::vector<int32_t> cached_blocks() const;  // every block the tree holds (for invariant checks)
  int64_t n_evictable() const;  // blocks that eviction could free now
  int64_t lookup_tokens() const { return lookup_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }

 private:
  struct Node;
  Node* child(const Node* parent, const int32_t* block_tokens) const;
  BlockAllocator& blocks_;
  int64_t page_;
  std::unordered_map<int32_t, std::unique_ptr<Node>> roots_;  // by key
  int64_t n_nodes_ = 0;
  std::unordered_set<int32_t> held_;  // every node's block
  uint64_t tick_ = 0;
  int64_t lookup_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace fp
