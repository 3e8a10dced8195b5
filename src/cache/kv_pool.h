// cache/kv_pool.h — paged KV storage: a pool of fixed-size blocks (pages) of token slots per
// layer, and the reference-counted allocator that hands blocks to sequences.
//
// A token's K/V for one layer lives in a *slot*: slot = block * page_size + offset. Layer l keeps
// K rows of k_width values and V rows of v_width values, one per slot, stored as the layout's
// dtype (F32, F16 or BF16; writes convert from f32 with round-to-nearest-even). For a standard
// GQA cache k_width = n_kv_heads * head_dim and v_width = n_kv_heads * v_head_dim; for the MLA
// latent cache k_width = kv_lora_rank + rope_dim and v_width = 0 (one vector per token per layer).
// Sequences own ordered lists of blocks (block tables); attention reads K/V through them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace fp {

// What one token stores per layer, and in which element type.
struct KvLayout {
  int64_t n_layers = 0;
  int64_t k_width = 0;  // values per token per layer on the K side
  int64_t v_width = 0;  // on the V side (0: the K row holds everything, as MLA's latent)
  DType dtype = DType::F32;  // storage type of every K/V value
  // Sliding-window layers (empty: none): layer l attends only the last `window` positions when
  // windowed[l]. A pool built with window blocks (KvPool's n_window_blocks) keeps those layers'
  // rows in blocks of their own, which sequences give back once they fall out of the window.
  std::vector<bool> windowed = {};
  int64_t window = 0;  // the widest window of those layers
  bool is_windowed(int64_t layer) const { return layer < static_cast<int64_t>(windowed.size()) && windowed[static_cast<size_t>(layer)]; }
  int64_t n_windowed() const {
    int64_t n = 0;
    for (bool w : windowed) n += w;
    return n;
  }
  int64_t layer_bytes_per_token() const { return (k_width + v_width) * dtype_info(dtype).block_bytes; }
  int64_t bytes_per_token() const { return n_layers * layer_bytes_per_token(); }
};

// Reference-counted block ids 0..n_blocks-1. A free block has count 0. Blocks are handed out
// lowest id first (deterministic, which the tests rely on for reproducible layouts).
//
// The ids may be split into `parts` partitions, block b in partition b % parts: under
// data-parallel attention partition r is the blocks whose rows rank r stores (KvPartition), and
// a sequence takes all its blocks from one partition.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks = 0, int parts = 1);
  int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int parts() const { return static_cast<int>(free_.size()); }
  int partition_of(int32_t block) const { return static_cast<int>(block % parts()); }
  int64_t n_free() const { return n_free_; }
  int64_t n_free(int part) const { return static_cast<int64_t>(free_[static_cast<size_t>(part)].size()); }
  // A fresh block of partition `part` with count 1, or -1 when none is free there.
  int32_t allocate(int part = 0);
  void ref(int32_t block);
  // Drops one reference; returns true when the block became free.
  bool unref(int32_t block);
  int32_t refcount(int32_t block) const;

 private:
  std::vector<int32_t> refs_;
  std::vector<std::vector<int32_t>> free_;  // per partition a stack, lowest id on top
  int64_t n_free_ = 0;
};

// Which blocks of a pool this rank stores: all of them (parts = 1), or under data-parallel
// attention (model/data_parallel.h) only the blocks b with b % parts == mine, at storage index
// b / parts — each rank holds the rows of its own sequences, so the ranks together hold `parts`
// times the tokens one rank's memory would.
struct KvPartition {
  int parts = 1;
  int mine = 0;
};

class KvPool {
 public:
  // The storage lives on `device` (host memory, or the GPU's for a model placed on CUDA). A
  // partitioned pool (KvPartition) hands out n_blocks ids but stores n_blocks / parts blocks.
  // n_window_blocks > 0 (and some layer windowed): the windowed layers store n_window_blocks
  // blocks of their own, handed out by window_blocks() (window trimming, BlockTable::window);
  // otherwise every layer stores n_blocks. Not with a partitioned pool.
  KvPool(const KvLayout& layout, int64_t page_size, int64_t n_blocks, Device device = Device::CPU,
         KvPartition partition = {}, int64_t n_window_blocks = 0);
  const KvLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  DType dtype() const { return layout_.dtype; }
  int64_t page_size() const { return page_size_; }
  int64_t n_blocks() const { return n_blocks_; }  // block ids handed out (every partition's)
  int64_t capacity_tokens() const { return n_blocks_ * page_size_; }
  const KvPartition& partition() const { return partition_; }
  // What this rank stores: blocks, slots and bytes (all of the pool when not partitioned).
  int64_t storage_blocks() const { return n_blocks_ / partition_.parts; }
  int64_t storage_tokens() const { return storage_blocks() * page_size_; }
  int64_t bytes() const;
  // Window trimming: the windowed layers keep their own, smaller set of blocks; block
  // kZeroWindowBlock of them is taken at construction and holds zeros (what tables point at for
  // blocks they gave back).
  static constexpr int32_t kZeroWindowBlock = 0;
  bool trims_windows() const { return n_window_blocks_ > 0; }
  int64_t n_window_blocks() const { return n_window_blocks_; }
  // Whether layer l's rows live in the window blocks (its slots come from BlockTable::window).
  bool in_window_blocks(int64_t layer) const { return trims_windows() && layout_.is_windowed(layer); }
  // Slots layer l stores.
  int64_t layer_slots(int64_t layer) const { return (in_window_blocks(layer) ? n_window_blocks_ : storage_blocks()) * page_size_; }
  // Where block id `block` is stored here (its id when not partitioned); fails for another
  // rank's block.
  int32_t storage_block(int32_t block) const;
  // Layer l's K rows ([storage_tokens(), k_width] values of dtype()) and V rows ([.., v_width]).
  // Attention and writes address them by storage slot = storage_block(b) * page_size + offset.
  const void* k(int64_t layer) const { return k_[static_cast<size_t>(layer)].data(); }
  const void* v(int64_t layer) const { return v_[static_cast<size_t>(layer)].data(); }
  // Stores n tokens' rows into layer l at storage slots[0..n): k_rows [n, k_width], v_rows [n, v_width]
  // (null when v_width is 0), converted from f32 to dtype() (round to nearest even) by the
  // kv_write op. slots and rows are in the pool's device memory; host slots are bounds-checked.
  void write(int64_t layer, const int64_t* slots, int64_t n, const float* k_rows, const float* v_rows);
  // Bytes of one slot's rows as stored, K then V (slot_bytes() = K row + V row).
  int64_t slot_bytes() const { return k_row_bytes_ + v_row_bytes_; }
  // Moves stored rows as they are, without converting, through the kv_move op (slots and rows in
  // the pool's device memory): pack_rows copies layer l's rows at slots[0..n) into out
  // [n, slot_bytes()] (each row K then V); unpack_rows writes such rows back at slots, row
  // row_of[i] (row i when null) into slot slots[i]. What ranks exchange when each computes some
  // of a batch's rows (context parallel): the bytes the cache holds, half of f32 for an F16 /
  // BF16 cache.
  void pack_rows(int64_t layer, const int64_t* slots, int64_t n, void* out) const {
    move_rows(layer, slots, n, out, nullptr, false);
  }
  void unpack_rows(int64_t layer, const int64_t* slots, int64_t n, const void* rows, const int32_t* row_of = nullptr) {
    move_rows(layer, slots, n, const_cast<void*>(rows), row_of, true);
  }
  // Reads one storage slot's rows back into host f32 (v may be null): for tests and tools.
  void read(int64_t layer, int64_t slot, float* k, float* v) const;
  // Copies every layer's rows of block id `src` into block id `dst` (copy-on-write; both of one
  // partition, a no-op on the ranks that do not store it). With window trimming: the layers of
  // the main blocks only; copy_window_block copies the windowed layers' block.
  void copy_block(int32_t src, int32_t dst);
  void copy_window_block(int32_t src, int32_t dst);
  // With recording on, copy_block also notes (src, dst), copy_window_block (-1 - src, dst); take_copies returns and clears the
  // notes (the engine sends them to the other ranks of a split model, engine/followers.h).
  void record_copies(bool on) { record_copies_ = on; }
  std::vector<int32_t> take_copies() { return std::exchange(copies_, {}); }
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }
  BlockAllocator& window_blocks() { return window_blocks_; }
  const BlockAllocator& window_blocks() const { return window_blocks_; }

 private:
  void move_rows(int64_t layer, const int64_t* slots, int64_t n, void* rows, const int32_t* row_of, bool into_pool) const;
  KvLayout layout_;
  int64_t page_size_, n_blocks_, n_window_blocks_ = 0;
  Device device_;
  KvPartition partition_;
  int64_t k_row_bytes_, v_row_bytes_;  // bytes of one slot's K / V row
  bool record_copies_ = false;
  std::vector<int32_t> copies_;  // (src, dst) pairs while recording
  // Uninitialized: large host pools are committed page by page as slots are first written (a
  // slot is always written before attention reads it).
  std::vector<DeviceBuffer> k_, v_;
  BlockAllocator blocks_, window_blocks_;
};

// Page sizes the engine accepts (the kernels declare which of these they support).
bool valid_page_size(int64_t page_size);
std::string page_sizes_text();  // "1, 8, 16, 32, 64, 128, 256"

// KV dtypes the pool stores (the attention kernels declare which of these they read).
bool valid_kv_dtype(DType t);
std::string kv_dtypes_text();  // "f32, f16, bf16"
// The pool's dtype when nobody chose one (EngineConfig, in-process callers): F32, exact. The
// command line's --kv-cache-dtype auto follows the model's weights instead (tools::auto_kv_dtype).
constexpr DType kDefaultKvDtype = DType::F32;
// "auto", "f32", "f16", "bf16" (any case) -> the dtype ("auto": auto_means); false otherwise.
bool kv_dtype_from_name(const std::string& name, DType* out, DType auto_means = kDefaultKvDtype);

}  // namespace fp
