// cache/prefix_cache.cpp — the block radix tree, its lookups, inserts and LRU eviction.
#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "core/hash.h"

namespace fp {

struct PrefixCache::Node {
  std::vector<int32_t> tokens;  // this edge's block of tokens
  int32_t block = -1;
  Node* parent = nullptr;
  uint64_t last_used = 0;
  std::unordered_multimap<uint64_t, std::unique_ptr<Node>> children;  // by hash of the block's tokens
};

namespace {
uint64_t hash_tokens(const int32_t* t, int64_t n) { return fnv1a64(t, static_cast<size_t>(n) * sizeof(int32_t)); }
}  // namespace

PrefixCache::PrefixCache(BlockAllocator& blocks, int64_t page_size)
    : blocks_(blocks), page_(page_size) {}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::child(const Node* parent, const int32_t* block_tokens) const {
  auto range = parent->children.equal_range(hash_tokens(block_tokens, page_));
  for (auto it = range.first; it != range.second; ++it)
    if (std::equal(block_tokens, block_tokens + page_, it->second->tokens.begin())) return it->second.get();
  return nullptr;
}

int64_t PrefixCache::matched_blocks(const int32_t* tokens, int64_t max_blocks, std::vector<int32_t>* blocks,
                                    int32_t key) const {
  auto root = roots_.find(key);
  if (root == roots_.end()) return 0;
  const Node* node = root->second.get();
  int64_t b = 0;
  for (; b < max_blocks; ++b) {
    node = child(node, tokens + b * page_);
    if (!node) break;
    if (blocks) blocks->push_back(node->block);
  }
  return b;
}

std::vector<int32_t> PrefixCache::match(const int32_t* tokens, int64_t max_blocks, int32_t key) {
  std::vector<int32_t> out;
  auto root = roots_.find(key);
  Node* node = root == roots_.end() ? nullptr : root->second.get();
  ++tick_;
  for (int64_t b = 0; node && b < max_blocks; ++b) {
    Node* c = child(node, tokens + b * page_);
    if (!c) break;
    c->last_used = tick_;
    blocks_.ref(c->block);
    out.push_back(c->block);
    node = c;
  }
  lookup_tokens_ += max_blocks * page_;
  hit_tokens_ += static_cast<int64_t>(out.size()) * page_;
  return out;
}

void PrefixCache::insert(const int32_t* tokens, int64_t n_blocks, const int32_t* blocks, int32_t key) {
  std::unique_ptr<Node>& root = roots_[key];
  if (!root) root = std::make_unique<Node>();
  Node* node = root.get();
  ++tick_;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int32_t* bt = tokens + b * page_;
    Node* c = child(node, bt);
    if (!c) {
      auto fresh = std::make_unique<Node>();
      fresh->tokens.assign(bt, bt + page_);
      fresh->block = blocks[b];
      fresh->parent = node;
      blocks_.ref(blocks[b]);
      held_.insert(blocks[b]);
      c = fresh.get();
      node->children.emplace(hash_tokens(bt, page_), std::move(fresh));
      ++n_nodes_;
    }
    c->last_used = tick_;
    node = c;
  }
}

bool PrefixCache::evict_one() {
  // Linear scan for the least recently used evictable leaf (evictions happen only when the
  // free list is empty; the tree holds at most the pool's blocks).
  Node* best = nullptr;
  std::vector<Node*> stack;
  for (auto& [key, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [h, c] : n->children) stack.push_back(c.get());
    if (n->parent && n->children.empty() && blocks_.refcount(n->block) == 1 &&
        (!best || n->last_used < best->last_used))
      best = n;
  }
  if (!best) return false;
  if (on_evict) on_evict(best->block);
  held_.erase(best->block);
  blocks_.unref(best->block);
  Node* parent = best->parent;
  for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
    if (it->second.get() == best) {
      parent->children.erase(it);
      break;
    }
  --n_nodes_;
  return true;
}

std::vector<int32_t> PrefixCache::cached_blocks() const {
  std::vector<int32_t> out;
  std::vector<const Node*> stack;
  for (auto& [key, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n->block >= 0) out.push_back(n->block);
    for (auto& [h, c] : n->children) stack.push_back(c.get());
  }
  return out;
}

void PrefixCache::clear() {
  while (evict_one()) {
  }
}

int64_t PrefixCache::n_evictable() const {
  // A block is evictable when the tree is its only owner and so is every block below it.
  int64_t count = 0;
  struct Walk {
    const BlockAllocator& blocks;
    int64_t& count;
    bool operator()(const Node* n) const {  // true when n's whole subtree is evictable
      bool all = true;
      for (auto& [h, c] : n->children) all = (*this)(c.get()) && all;
      if (n->block < 0) return false;
      if (all && blocks.refcount(n->block) == 1) {
        ++count;
        return true;
      }
      return false;
    }
  };
  for (auto& [key, root] : roots_) Walk{blocks_, count}(root.get());
  return count;
}

}  // namespace fp
