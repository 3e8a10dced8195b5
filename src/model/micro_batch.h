// model/micro_batch.h — what --micro-batch-overlap's two micro-batches share across the model
// families: the cut of a step into A = tokens [0, n/2) and B = [n/2, n) (each its own varlen
// view and KV slots; a cut may fall inside a sequence), and a sum in flight (a micro-batch's
// rows, all-reduced without blocking, added to its residual rows once they are in; Gemma's
// sandwich norms normalise them first).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"

namespace fp {

struct MicroBatchSplit {
  ForwardBatch parts[2];
  std::vector<int64_t> slots[2];  // each part's tokens' KV slots
  std::vector<int64_t> window_slots[2];  // ... in the window blocks (window trimming; else empty)
  int64_t row0[2] = {0, 0};       // each part's first row in the step's buffers

  void split(const ForwardBatch& b, int64_t page_size);
};

// An RMSNorm of a sum's rows before they are added (weight [dim]; null: none).
struct SumNorm {
  const float* weight = nullptr;
  int64_t dim = 0;
  float eps = 0;
};

class PendingSum {
 public:
  PendingSum() = default;
  PendingSum(const PendingSum&) = delete;
  PendingSum& operator=(const PendingSum&) = delete;
  ~PendingSum() { reset(); }
  // Starts the all-reduce of rows [n] (MPI_Iallreduce under MPI; ops all_reduce_start).
  void start(Communicator* comm, float* rows, int64_t n, SumNorm norm = {});
  // x[n] += the summed rows (normalised by the start's SumNorm) once they are in (op
  // collective_wait); nothing when none is pending.
  void add_into(float* x);
  // Drops a sum left in flight by a step that failed (or a graph recording that was abandoned):
  // waits for it, so its buffers and the communicator's handle are free, and adds nothing.
  void reset() noexcept;

 private:
  Communicator* comm_ = nullptr;
  float* rows_ = nullptr;
  int64_t n_ = 0;
  SumNorm norm_;
  int64_t handle_ = Communicator::kDone;
};

}  // namespace fp
