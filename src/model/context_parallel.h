// model/context_parallel.h — prefill context parallel, for every architecture that runs it: a
// batch's tokens cut into runs of consecutive tokens (runs may cross sequence boundaries), this
// rank's runs as a varlen batch of its own, and the two all-gathers that give every rank's KV
// cache the whole batch's rows (per layer) and the logit rows their last hidden states (once).
// Each rank runs its tokens through every layer with the whole weights.
//
// The cut is zig-zag: the batch's tokens in 2N pieces, rank r taking pieces r and 2N-1-r. Causal
// attention makes a late token cost more than an early one (it attends to more positions); one
// contiguous run per rank would leave the last rank with about (2N-1)/N^2 of a long prompt's
// attention and the first with 1/N^2 of it. With the pairs, every rank holds the same number of
// tokens and, for one prompt cut evenly, exactly the same attention work (sum of the positions
// attended) — what `plan`'s CP layouts assume.
//
// On a device (GPU ranks; the pool's device) the same step works on device buffers: the step's
// maps (slots, gathered rows) are uploaded once per step, the rows are packed and unpacked by
// the kv_move op as the cache stores them (an F16 / BF16 cache's rows are half the bytes of f32)
// and the logit rows are gathered by the embedding op (RowGather).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "cache/kv_pool.h"
#include "core/device.h"
#include "model/model.h"
#include "model/placement.h"
#include "parallel/communicator.h"

namespace fp {

class ContextParallelStep {
 public:
  // A batch runs context parallel on `ranks` ranks when it holds prefill tokens (more tokens than
  // sequences) and at least `ranks` tokens; decode batches keep the decode layout. From 4 ranks a
  // rank's two pieces may still both be empty (5 tokens on 4 ranks: rank 2 gets none): it then
  // runs its layers on no rows and only joins the exchanges.
  static bool applies(const ForwardBatch& b, int ranks) { return b.n_tokens() > b.n_seqs() && b.n_tokens() >= ranks; }

  // Cuts `b` (which must outlive the step) for this rank of `comm`, with pool slots of `page_size`;
  // on `device` (the pool's) also uploads the step's slots and row maps there.
  void begin(Communicator* comm, const ForwardBatch& b, int64_t page_size, Device device = Device::CPU);
  // This rank's tokens as a batch, its first piece then its second: each sequence's tokens inside
  // a piece with its whole block table and kv_len ending at its last token there (attention is
  // causal; a sequence spanning both pieces appears twice).
  const ForwardBatch& run() const { return run_; }
  int64_t rows() const { return run_.n_tokens(); }
  // Rows of the buffers the gathers send: the longest run (the rows past rows() are padding).
  int64_t padded_rows() const { return chunk_; }
  // Writes every rank's K rows (k: this rank's [padded_rows, k_width]) and V rows (v, or null when
  // the pool has no V side) of `layer` into the pool, in two halves so that compute runs while
  // the rows travel: start_kv writes this rank's rows through the kv_write op, packs them as the
  // pool stores them (kv_move) and starts their all-gather; finish_kv waits for it and unpacks
  // the other ranks' rows into their slots. Between the two the caller may compute anything that
  // does not read the layer's cache (its queries); write_kv does both.
  void start_kv(KvPool& pool, int64_t layer, const float* k, const float* v);
  void finish_kv(KvPool& pool);
  void write_kv(KvPool& pool, int64_t layer, const float* k, const float* v) {
    start_kv(pool, layer, k, v);
    finish_kv(pool);
  }
  // Lets the started exchange advance (between the caller's matmuls).
  void progress() { comm_->progress(); }
  ContextParallelStep() : uploads_(Device::CPU) {}
  ContextParallelStep(const ContextParallelStep&) = delete;
  ContextParallelStep& operator=(const ContextParallelStep&) = delete;
  ~ContextParallelStep() { settle(); }
  // The hidden rows of the batch's logit_rows, from whichever rank's run holds them (x: this
  // rank's [padded_rows, dim]), into out [logit_rows, dim]; returns how many.
  int64_t gather_logit_rows(const float* x, int64_t dim, float* out);

 private:
  // Piece p of the 2N is tokens [edge(p), edge(p + 1)); rank r holds pieces r and 2N-1-r.
  int64_t edge(int64_t piece) const { return n_ * piece / (2 * comm_->size()); }
  struct Piece {
    int64_t t0, t1, row;  // tokens [t0, t1) sit at row `row` of their rank's buffers
  };
  std::array<Piece, 2> pieces(int rank) const;
  // The row of every rank's [padded_rows] buffers, gathered rank after rank, holding token t.
  int64_t gathered_row(int64_t t) const;
  // The step's maps (host_maps_, or their upload on a device): see begin.
  const uint8_t* maps() const;

  // A step that failed between start_kv and finish_kv left its gather in flight, writing into
  // kv_all_: waits for it (the other ranks started it too) before the buffers change or go.
  void settle() noexcept;
  Communicator* comm_ = nullptr;
  const ForwardBatch* batch_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  ForwardBatch run_;
  std::vector<int64_t> slots_;  // every token's slot
  // [this rank's rows' slots (int64) | the other tokens' slots (int64) | the gathered row of each
  // (int32) | the gathered row of each logit row (int32)], byte offsets below.
  std::vector<uint8_t> host_maps_;
  size_t other_slots_at_ = 0, other_rows_at_ = 0, logit_rows_at_ = 0;
  Device device_ = Device::CPU;
  DeviceBuffer maps_;
  UploadRing uploads_;
  // Packed K/V rows as the pool stores them: this rank's [padded_rows], every rank's.
  DeviceBuffer kv_send_, kv_all_;
  int64_t kv_layer_ = -1, kv_handle_ = Communicator::kDone;
  std::vector<float> x_all_;
  DeviceBuffer x_all_dev_;
  RowGather gather_rows_{Device::CPU};
};

// Decode after context-parallel prefill, with the heads split (tensor parallel): the cache keeps
// every KV head (prefill wrote whole rows), a TP step reads its heads out of each row and writes
// its new K/V rows whole — all-gathered across the ranks, rank r's heads at column r x width — so
// the cache stays complete for whichever phase comes next.
class EveryHeadKvWriter {
 public:
  // This rank's rows k [n, kv_dim] and v [n, v_dim] of layer `layer` -> every head's, at slots
  // (all on the pool's device).
  void write(Communicator* tp, KvPool& pool, int64_t layer, const int64_t* slots, int64_t n, const float* k,
             const float* v, int64_t kv_dim, int64_t v_dim);

 private:
  const float* whole_rows(Communicator* tp, const float* part, int64_t n, int64_t width, DeviceBuffer& rows);
  DeviceBuffer gathered_, k_rows_, v_rows_;
};

}  // namespace fp
