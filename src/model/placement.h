// model/placement.h — running a model on a device other than the host: its weights uploaded
// once at load (DeviceWeights), its activation buffers on that device (Activations), and each
// step's batch index arrays staged there in one copy (StagedBatch). On the CPU all three are
// free: no copies, the pointers are the host's.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace fp {

struct ForwardBatch;

// Weights on one device. Each host tensor (and vector) is uploaded once; asking again for the
// same host data of the same shape (bytes) returns the same device copy (a tied embedding and
// output share one). A slice starting where its whole tensor does (rank 0's rows of a split
// output, the whole table beside it) is another tensor: the shape is part of the key.
class DeviceWeights {
 public:
  explicit DeviceWeights(Device d) : device_(d) {}
  Device device() const { return device_; }
  // The tensor with its bytes (and block scales) on the device; t itself on the CPU.
  const Tensor* tensor(const Tensor* t);
  // n floats on the device; p itself on the CPU. Null stays null.
  const float* floats(const float* p, int64_t n);
  // Experts [begin, end) of a stack of equal matrices in one device buffer, one after another
  // (their block scales likewise), as the grouped expert kernels read them, whether the host
  // views were one file tensor or one per expert; the other entries stay empty. `experts`
  // itself on the CPU.
  std::vector<Tensor> stack(const std::vector<Tensor>& experts, int64_t begin, int64_t end);
  // Matrices of one dtype and width stacked by rows in one device buffer, as one tensor [sum of
  // rows, cols] (block scales likewise; each part's rows then a multiple of the scale block), so
  // that one matmul computes all of them for a row of x: its output row is the parts' outputs
  // side by side. `parts` are pointed at their rows of it (asking tensor() for a part later
  // returns the same). Null on the CPU, or (parts untouched) where the parts cannot be stacked.
  const Tensor* stack_rows(const std::vector<const Tensor**>& parts);
  size_t bytes() const { return bytes_; }

 private:
  const void* upload(const void* host, size_t bytes);
  Device device_;
  using TensorKey = std::tuple<const void*, int64_t, int64_t, int>;  // data, rows, cols, dtype
  std::map<TensorKey, const Tensor*> tensors_;
  std::map<std::pair<const void*, size_t>, const void*> copies_;  // (host, bytes) -> device
  std::deque<Tensor> views_;
  std::deque<DeviceBuffer> buffers_;
  size_t bytes_ = 0;
};

// Scratch activation buffers of one forward, on the model's device, numbered by the caller.
class Activations {
 public:
  explicit Activations(Device d) : device_(d) {}
  // Buffer `slot`, holding at least n floats (contents are not kept when it grows).
  float* f32(size_t slot, int64_t n);
  // The same slots seen as n int32 (routing ids).
  int32_t* i32(size_t slot, int64_t n) { return reinterpret_cast<int32_t*>(f32(slot, n)); }

 private:
  Device device_;
  std::vector<DeviceBuffer> buffers_;
};

// Uploads through a ring of page-locked host images, so the host need not wait for the device to
// take one: each upload is queued behind the device's work, and an image is written again only
// once the copy that read it has run (a fence per image). On the CPU, a plain copy.
class UploadRing {
 public:
  explicit UploadRing(Device d) : device_(d), images_{PinnedBuffer(d), PinnedBuffer(d)} {}
  // Queues a copy of host [src, src + bytes) to device memory dst.
  void upload(void* dst, const void* src, size_t bytes);

 private:
  Device device_;
  PinnedBuffer images_[2];
  uint64_t fences_[2] = {0, 0};
  int next_ = 0;
};

// A ForwardBatch's index arrays where the kernels read them: the host vectors themselves on the
// CPU, one upload per step otherwise. slots[i] is token i's KV slot (block table lookup).
// With window trimming, window_page_ids / window_slots are the windowed layers' (host only:
// the models that have windowed layers run on the CPU).
struct StagedBatch {
  int64_t n = 0, n_seqs = 0, n_logits = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq_indptr = nullptr;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_ids = nullptr;
  const int32_t* kv_len = nullptr;
  const int32_t* logit_rows = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* window_page_ids = nullptr;
  const int64_t* window_slots = nullptr;
  // Layer `windowed` of a trimming pool (KvPool::in_window_blocks) writes and reads through the
  // window tables, every other layer through the main ones.
  const int64_t* slots_for(bool windowed) const { return windowed ? window_slots : slots; }
  const int32_t* pages_for(bool windowed) const { return windowed ? window_page_ids : page_ids; }
};

// The host arrays of b seen as a StagedBatch (slots left null: see ForwardBatch::slots).
StagedBatch host_view(const ForwardBatch& b);

// Stages a batch's arrays on the device in one queued copy. Tokens of b.feed_rows are then
// taken on the device from fed_ids (the ids the step before sampled: the token_feed op).
class BatchStager {
 public:
  explicit BatchStager(Device d) : device_(d), staging_(d), uploads_(d) {}
  StagedBatch stage(const ForwardBatch& b, int64_t page_size, const int32_t* fed_ids = nullptr);

 private:
  Device device_;
  std::vector<int64_t> slots_, window_slots_;
  std::vector<uint8_t> host_;
  DeviceBuffer staging_;
  UploadRing uploads_;
};

// Rows `ids` of an F32 table [n, dim] on device d gathered into out [count, dim] by the embedding
// op (the exchanges' permutations of context and data parallel). The table views are kept by
// address and shape: a recorded graph, or a call queued behind the device's work, reads them later.
class RowGather {
 public:
  explicit RowGather(Device d) : device_(d) {}
  void run(const float* table, int64_t n, int64_t dim, const int32_t* ids, int64_t count, float* out);

 private:
  Device device_;
  std::map<std::tuple<const void*, int64_t, int64_t>, Tensor> views_;
};

// A step's logit rows on its device: rows `ids` of x [n, dim] gathered into out (a RowGather),
// then RMS-normalised with `norm`. On a device a step cannot pick rows on the host.
class LogitRowGather {
 public:
  explicit LogitRowGather(Device d) : rows_(d) {}
  void run(const float* x, int64_t n, int64_t dim, const int32_t* ids, int64_t rows, const float* norm, float eps, float* out);

 private:
  RowGather rows_;
};

// Forward steps as device graphs (CUDA graphs): the device work of a step — hundreds of kernel
// launches — recorded once per step shape and replayed as one launch. A shape's first step runs
// eagerly (its buffers and scratch get allocated), the second is recorded and replayed, later
// ones replay, as long as no device memory was reallocated since (device_memory_epoch). Only
// decode steps (one token per sequence) are candidates: their shapes repeat. Each step's way
// is counted in the ledger (Ledger::note_step), with the reason when it ran eagerly.
class StepGraphs {
 public:
  StepGraphs(Device d, bool enabled) : device_(d), enabled_(enabled) {}
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  // Runs `body` (device work only: no host synchronisation, no allocation) for a step of batch
  // shape (n tokens, n_seqs sequences, n_logits logit rows) writing into `pool_key`'s cache;
  // `variant` names whatever else the step's launches depend on (0: nothing).
  void run(int64_t n, int64_t n_seqs, int64_t n_logits, const void* pool_key, const std::function<void()>& body,
           int64_t variant = 0);

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, const void*, int64_t>;
  struct Entry {
    void* graph = nullptr;
    uint64_t epoch = 0;
    int seen = 0;
    bool failed = false;  // recording failed once: this shape runs eagerly from now on
  };
  Device device_;
  bool enabled_;
  std::map<Key, Entry> graphs_;
};

}  // namespace fp
