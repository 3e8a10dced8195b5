// cache/kv_pool.h — paged KV storage: a pool of fixed-size blocks (pages) of token slots per
// layer, and the reference-counted allocator that hands blocks to sequences.
//
// A token's K/V for one layer lives in a *slot*: slot = block * page_size + offset. Layer l keeps
// K rows of k_width floats and V rows of v_width floats, one per slot. For a standard GQA
// cache k_width = n_kv_heads * head_dim and v_width = n_kv_heads * v_head_dim; for the MLA
// latent cache k_width = kv_lora_rank + rope_dim and v_width = 0 (one vector per token per layer).
// Sequences own ordered lists of blocks (block tables); attention reads K/V through them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fp {

// What one token stores per layer.
struct KvLayout {
  int64_t n_layers = 0;
  int64_t k_width = 0;  // floats per token per layer on the K side
  int64_t v_width = 0;  // on the V side (0: the K row holds everything, as MLA's latent)
  int64_t bytes_per_token() const { return n_layers * (k_width + v_width) * 4; }  // F32 storage
};

// Reference-counted block ids 0..n_blocks-1. A free block has count 0. Blocks are handed out
// lowest id first (deterministic, which the tests rely on for reproducible layouts).
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks = 0);
  int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  // A fresh block with count 1, or -1 when none is free.
  int32_t allocate();
  void ref(int32_t block);
  // Drops one reference; returns true when the block became free.
  bool unref(int32_t block);
  int32_t refcount(int32_t block) const;

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack, lowest id on top
};

class KvPool {
 public:
  KvPool(const KvLayout& layout, int64_t page_size, int64_t n_blocks);
  const KvLayout& layout() const { return layout_; }
  int64_t page_size() const { return page_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t capacity_tokens() const { return n_blocks_ * page_size_; }
  int64_t bytes() const { return capacity_tokens() * layout_.bytes_per_token(); }
  // Layer l's K rows ([n_blocks * page_size, k_width]) and V rows ([.., v_width]).
  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].get(); }
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].get(); }
  // Copies every layer's rows of block `src` into block `dst` (copy-on-write).
  void copy_block(int32_t src, int32_t dst);
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }

 private:
  KvLayout layout_;
  int64_t page_size_, n_blocks_;
  // Uninitialized: large pools are committed page by page as slots are first written (a slot
  // is always written before attention reads it).
  std::vector<std::unique_ptr<float[]>> k_, v_;
  BlockAllocator blocks_;
};

// Page sizes the engine accepts (the kernels declare which of these they support).
bool valid_page_size(int64_t page_size);
std::string page_sizes_text();  // "1, 8, 16, 32, 64, 128, 256"

}  // namespace fp
