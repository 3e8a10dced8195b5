// cache/kv_pool.cpp — the block allocator and the paged K/V storage (written through the kv_write op).
#include "cache/kv_pool.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {

BlockAllocator::BlockAllocator(int64_t n_blocks, int parts)
    : refs_(static_cast<size_t>(n_blocks), 0), free_(static_cast<size_t>(parts)), n_free_(n_blocks) {
  FP_CHECK(parts >= 1, "KV block partitions must be >= 1, got ", parts);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_[static_cast<size_t>(b % parts)].push_back(static_cast<int32_t>(b));
}

int32_t BlockAllocator::allocate(int part) {
  FP_CHECK(part >= 0 && part < parts(), "KV block partition ", part, " of ", parts());
  std::vector<int32_t>& f = free_[static_cast<size_t>(part)];
  if (f.empty()) return -1;
  int32_t b = f.back();
  f.pop_back();
  --n_free_;
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
  std::vector<int32_t>& f = free_[static_cast<size_t>(partition_of(block))];
  f.insert(std::lower_bound(f.begin(), f.end(), block, std::greater<int32_t>()), block);
  ++n_free_;
  return true;
}

int32_t BlockAllocator::refcount(int32_t block) const {
  FP_CHECK(block >= 0 && block < n_blocks(), "invalid block ", block);
  return refs_[static_cast<size_t>(block)];
}

KvPool::KvPool(const KvLayout& layout, int64_t page_size, int64_t n_blocks, Device device, KvPartition partition,
               int64_t n_window_blocks)
    : layout_(layout),
      page_size_(page_size),
      n_blocks_(n_blocks),
      n_window_blocks_(layout.n_windowed() > 0 ? std::max<int64_t>(0, n_window_blocks) : 0),
      device_(device),
      partition_(partition),
      blocks_(n_blocks, std::max(1, partition.parts)),
      window_blocks_(n_window_blocks_) {
  FP_CHECK(n_window_blocks_ == 0 || partition.parts == 1, "KV window trimming with a partitioned pool (data-parallel attention)");
  FP_CHECK(page_size > 0, "KV page size must be positive, got ", page_size);
  FP_CHECK(n_blocks >= 0, "KV block count must be >= 0, got ", n_blocks);
  FP_CHECK(partition.parts >= 1 && partition.mine >= 0 && partition.mine < partition.parts && n_blocks % partition.parts == 0,
           "KV pool partition ", partition.mine, " of ", partition.parts, " for ", n_blocks,
           " blocks (the count must divide evenly)");
  FP_CHECK(valid_kv_dtype(layout.dtype), "KV cache dtype ", dtype_name(layout.dtype), " is not one of ", kv_dtypes_text());
  k_row_bytes_ = row_bytes(layout.dtype, layout.k_width);
  v_row_bytes_ = row_bytes(layout.dtype, layout.v_width);
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const size_t slots = static_cast<size_t>(layer_slots(l));
    k_.emplace_back(device, std::max<size_t>(1, slots * static_cast<size_t>(k_row_bytes_)));
    v_.emplace_back(device, std::max<size_t>(1, slots * static_cast<size_t>(v_row_bytes_)));
  }
  if (n_window_blocks_ > 0) {
    // Window block 0 stays taken and zero: the block tables' entries for blocks given back point
    // at it, so a kernel that reads keys before a row's window (and weighs them 0) reads zeros,
    // never stale or uninitialized rows (0 x NaN would poison the sum).
    FP_CHECK(device == Device::CPU, "KV window trimming on ", device_name(device), " (it runs on the CPU only)");
    FP_CHECK(n_window_blocks_ >= 2, "KV window trimming needs at least 2 window blocks, got ", n_window_blocks_);
    FP_CHECK(window_blocks_.allocate() == kZeroWindowBlock, "KV pool: the zero window block is not block 0");
    const size_t kb = static_cast<size_t>(page_size_ * k_row_bytes_), vb = static_cast<size_t>(page_size_ * v_row_bytes_);
    for (size_t l = 0; l < k_.size(); ++l)
      if (in_window_blocks(static_cast<int64_t>(l))) {
        std::memset(k_[l].data(), 0, kb);
        if (vb) std::memset(v_[l].data(), 0, vb);
      }
  }
}

int64_t KvPool::bytes() const {
  int64_t b = 0;
  for (int64_t l = 0; l < layout_.n_layers; ++l) b += layer_slots(l) * layout_.layer_bytes_per_token();
  return b;
}

void KvPool::write(int64_t layer, const int64_t* slots, int64_t n, const float* k_rows, const float* v_rows) {
  FP_CHECK(layer >= 0 && layer < layout_.n_layers, "KV write: layer ", layer, " of ", layout_.n_layers);
  if (device_ == Device::CPU)
    for (int64_t i = 0; i < n; ++i)
      FP_CHECK(slots[i] >= 0 && slots[i] < layer_slots(layer), "KV write: slot ", slots[i], " is outside layer ", layer,
               "'s blocks (", layer_slots(layer), " slots)");
  const size_t l = static_cast<size_t>(layer);
  dispatch(KvWriteArgs{k_[l].data(), v_[l].data(), layout_.dtype, layout_.k_width, layout_.v_width, slots, n, k_rows,
                       layout_.v_width ? v_rows : nullptr});
}

void KvPool::move_rows(int64_t layer, const int64_t* slots, int64_t n, void* rows, const int32_t* row_of,
                       bool into_pool) const {
  const char* what = into_pool ? "KV unpack" : "KV pack";
  FP_CHECK(layer >= 0 && layer < layout_.n_layers, what, ": layer ", layer, " of ", layout_.n_layers);
  if (device_ == Device::CPU)
    for (int64_t i = 0; i < n; ++i)
      FP_CHECK(slots[i] >= 0 && slots[i] < layer_slots(layer), what, ": slot ", slots[i], " is outside the pool (",
               layer_slots(layer), " slots)");
  const size_t l = static_cast<size_t>(layer);
  // The storage is the pool's own; moving rows out of it changes nothing the const caller sees.
  dispatch(KvMoveArgs{const_cast<void*>(k_[l].data()), const_cast<void*>(v_[l].data()), k_row_bytes_, v_row_bytes_,
                      slots, row_of, n, rows, into_pool});
}

void KvPool::read(int64_t layer, int64_t slot, float* k, float* v) const {
  FP_CHECK(layer >= 0 && layer < layout_.n_layers && slot >= 0 && slot < layer_slots(layer), "KV read: layer ", layer,
           " slot ", slot, " is outside the pool");
  const size_t l = static_cast<size_t>(layer);
  std::vector<uint8_t> row(static_cast<size_t>(std::max(k_row_bytes_, v_row_bytes_)));
  copy_bytes(Device::CPU, row.data(), device_, k_[l].as<uint8_t>() + slot * k_row_bytes_, static_cast<size_t>(k_row_bytes_));
  dequantize_row(layout_.dtype, row.data(), k, layout_.k_width);
  if (v && layout_.v_width) {
    copy_bytes(Device::CPU, row.data(), device_, v_[l].as<uint8_t>() + slot * v_row_bytes_, static_cast<size_t>(v_row_bytes_));
    dequantize_row(layout_.dtype, row.data(), v, layout_.v_width);
  }
}

int32_t KvPool::storage_block(int32_t block) const {
  FP_CHECK(block >= 0 && block < n_blocks_, "KV block ", block, " is outside the pool (", n_blocks_, " blocks)");
  FP_CHECK(block % partition_.parts == partition_.mine, "KV block ", block, " is stored by rank ", block % partition_.parts,
           ", not by rank ", partition_.mine, " (data-parallel attention partitions the pool)");
  return block / partition_.parts;
}

void KvPool::copy_block(int32_t src, int32_t dst) {
  FP_CHECK(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_, "copy_block: invalid block ", src, " -> ", dst);
  FP_CHECK(src % partition_.parts == dst % partition_.parts, "copy_block: blocks ", src, " and ", dst,
           " lie in different partitions of the pool");
  if (record_copies_) copies_.insert(copies_.end(), {src, dst});
  if (src % partition_.parts != partition_.mine) return;  // another rank stores it
  src = storage_block(src);
  dst = storage_block(dst);
  const size_t kb = static_cast<size_t>(page_size_ * k_row_bytes_), vb = static_cast<size_t>(page_size_ * v_row_bytes_);
  for (size_t l = 0; l < k_.size(); ++l) {
    if (in_window_blocks(static_cast<int64_t>(l))) continue;
    copy_bytes(device_, k_[l].as<uint8_t>() + dst * kb, device_, k_[l].as<uint8_t>() + src * kb, kb);
    if (vb) copy_bytes(device_, v_[l].as<uint8_t>() + dst * vb, device_, v_[l].as<uint8_t>() + src * vb, vb);
  }
}

void KvPool::copy_window_block(int32_t src, int32_t dst) {
  FP_CHECK(src >= 0 && src < n_window_blocks_ && dst >= 0 && dst < n_window_blocks_, "copy_window_block: invalid block ",
           src, " -> ", dst);
  if (record_copies_) copies_.insert(copies_.end(), {-1 - src, dst});
  const size_t kb = static_cast<size_t>(page_size_ * k_row_bytes_), vb = static_cast<size_t>(page_size_ * v_row_bytes_);
  for (size_t l = 0; l < k_.size(); ++l) {
    if (!in_window_blocks(static_cast<int64_t>(l))) continue;
    copy_bytes(device_, k_[l].as<uint8_t>() + dst * kb, device_, k_[l].as<uint8_t>() + src * kb, kb);
    if (vb) copy_bytes(device_, v_[l].as<uint8_t>() + dst * vb, device_, v_[l].as<uint8_t>() + src * vb, vb);
  }
}

bool valid_page_size(int64_t page_size) {
  for (int64_t p : {1, 8, 16, 32, 64, 128, 256})
    if (p == page_size) return true;
  return false;
}

std::string page_sizes_text() { return "1, 8, 16, 32, 64, 128, 256"; }

bool valid_kv_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

std::string kv_dtypes_text() { return "f32, f16, bf16"; }

bool kv_dtype_from_name(const std::string& name, DType* out, DType auto_means) {
  std::string n;
  for (char ch : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (n == "auto") {
    *out = auto_means;
    return true;
  }
  DType t;
  if (!dtype_from_name(n, &t) || !valid_kv_dtype(t)) return false;
  *out = t;
  return true;
}

}  // namespace fp
