// model/data_parallel.h — data-parallel attention (--data-parallel-attention, with expert
// parallelism): each rank runs attention only for its own sequences of a batch and keeps only
// their rows in its KV cache; the FFN/expert layers see every token. Per layer the ranks
// all-gather the normalised hidden rows of their tokens (so every rank holds the whole batch),
// run their experts and their share of the shared/dense FFN width on all of them, and a
// reduce-scatter returns to each rank the sum for its own tokens — the volume of one all-reduce,
// with the attention work and the latent cache divided by the ranks (DeepSeek's MLA cache has
// no heads for tensor parallelism to split).
//
// A sequence belongs to rank (its first KV block % ranks): stable for its lifetime. The engine's
// pool is partitioned the same way (KvPartition: rank r stores blocks b % ranks == r), and a
// sequence takes all its blocks from one partition, so each rank stores only its own
// sequences' rows and the ranks together hold `ranks` times the tokens. An unpartitioned pool
// (one sequence's cache, tests) works too: every rank then has room for every block.
//
// On a device (the pool's; GPU ranks) the exchanges work on device buffers: the row
// permutations between a rank's rows and the batch order are index arrays uploaded once per step
// (with the batch's logit rows), applied by the embedding op as row gathers around the
// all-gather and reduce-scatter, so a recorded decode graph holds the whole exchange.
//
// Under --micro-batch-overlap the step's exchanges run per micro-batch (begin_part: every rank's
// first half of its tokens, or its second half), started and waited in two halves so that one
// micro-batch's rows travel while the other computes.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "model/model.h"
#include "model/placement.h"
#include "parallel/communicator.h"

namespace fp {

class DataParallelStep {
 public:
  explicit DataParallelStep(Device d = Device::CPU) : device_(d), uploads_(d), rows_send_(d), rows_recv_(d) {}
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;
  ~DataParallelStep() { settle(); }
  // Splits `b` (which must outlive the step) by owner rank; run()'s block ids are where `pool`
  // stores them. On a device, also uploads the permutations and b's logit rows.
  void begin(Communicator* comm, const ForwardBatch& b, const KvPool& pool);
  // One micro-batch of `whole` (begun for this step) under --micro-batch-overlap: every rank's
  // first half of its tokens (part 0: its first k/2 of k) or the rest (part 1) — the halves
  // MicroBatchSplit cuts this rank's run() into. Its FFN rows are those tokens in batch order.
  void begin_part(const DataParallelStep& whole, int part);
  // This rank's sequences as a batch (possibly empty), and the rows the exchanges send per rank.
  const ForwardBatch& run() const { return run_; }
  int64_t rows() const { return static_cast<int64_t>(tokens_[static_cast<size_t>(comm_->rank())].size()); }
  int64_t padded_rows() const { return chunk_; }
  // Rows the FFN layers see: every rank's tokens (of this part).
  int64_t total_rows() const { return total_; }
  // own [rows(), dim] of every rank → all [total_rows(), dim] in the batch's token order. On a
  // device `own` must hold padded_rows() rows (those past rows() are sent but never read).
  void gather(const float* own, int64_t dim, float* all) {
    send_gather(own, dim, false);
    finish_gather(dim, all);
  }
  // all [total_rows(), dim] partial sums of every rank → own [rows(), dim], summed over the ranks.
  void reduce_scatter(const float* all, int64_t dim, float* own) {
    send_reduce_scatter(all, dim, false);
    finish_reduce_scatter(dim, own, false);
  }
  // The same exchanges in two halves each (--micro-batch-overlap), so that compute runs while
  // the rows travel: one exchange of this step in flight at a time. `all` and `own` may be
  // reused once started; finish_reduce_scatter stores this rank's sums into own, or adds them
  // (add: own += sums, the residual rows).
  void start_gather(const float* own, int64_t dim) { send_gather(own, dim, true); }
  void finish_gather(int64_t dim, float* all);
  void start_reduce_scatter(const float* all, int64_t dim) { send_reduce_scatter(all, dim, true); }
  void finish_reduce_scatter(int64_t dim, float* own, bool add);
  // On a device: the batch's logit rows (indices into the batch's tokens) there.
  const int32_t* logit_rows_on_device() const { return ids_.as<int32_t>() + logit_ids_at_; }
  // An exchange left in flight by a step that failed (or a graph recording abandoned midway):
  // waited out before the buffers change or go, and nothing is added.
  void settle() noexcept;
  // What a recorded step of this layout depends on beyond the rank's own batch shape.
  int64_t graph_variant() const { return total_ * (int64_t{1} << 24) + chunk_; }

 private:
  // The exchanges' first halves: the rows sent, blocking or started.
  void send_gather(const float* own, int64_t dim, bool started);
  void send_reduce_scatter(const float* all, int64_t dim, bool started);
  void upload_maps();
  Device device_;
  Communicator* comm_ = nullptr;
  const ForwardBatch* batch_ = nullptr;
  ForwardBatch run_;
  int64_t chunk_ = 0;                         // the most tokens any rank owns
  int64_t total_ = 0;                         // tokens of every rank (of this part)
  std::vector<std::vector<int64_t>> tokens_;  // per rank: the batch token indices it owns, in order
  std::vector<int64_t> ffn_row_;              // per batch token: its row of the FFN layers' rows
  std::vector<float> send_, recv_;
  std::vector<int32_t> pages_;
  // On a device: [gather ids: total_rows() | scatter ids: ranks x chunk_ | logit rows] there.
  std::vector<int32_t> host_ids_;
  DeviceBuffer ids_{device_};
  UploadRing uploads_;
  int64_t scatter_ids_at_ = 0, logit_ids_at_ = 0;
  DeviceBuffer rows_send_, rows_recv_;
  RowGather gather_rows_{device_};
  int64_t handle_ = Communicator::kDone;
  bool in_flight_ = false;
};

// The rank that owns sequence s of `b`.
int data_parallel_owner(const ForwardBatch& b, int64_t s, int ranks);

}  // namespace fp
