// model/micro_batch.cpp — see micro_batch.h.
#include "model/micro_batch.h"

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

void MicroBatchSplit::split(const ForwardBatch& b, int64_t page_size) {
  const int64_t n = b.n_tokens(), half = n / 2;
  for (int i = 0; i < 2; ++i) {
    parts[i].assign_tokens(b, i == 0 ? 0 : half, i == 0 ? half : n);
    parts[i].slots(page_size, slots[i]);
    parts[i].window_slots(page_size, window_slots[i]);
    row0[i] = i == 0 ? 0 : half;
  }
}

void PendingSum::start(Communicator* comm, float* rows, int64_t n, SumNorm norm) {
  FP_CHECK(!rows_, "micro-batch overlap: a sum started while the last one is still in flight");
  FP_CHECK(!norm.weight || (norm.dim > 0 && n % norm.dim == 0), "micro-batch overlap: ", n,
           " summed values are not rows of the norm's width ", norm.dim);
  comm_ = comm;
  rows_ = rows;
  n_ = n;
  norm_ = norm;
  dispatch(AllReduceStartArgs{comm, rows, n, &handle_});
}

void PendingSum::add_into(float* x) {
  if (!rows_) return;
  dispatch(CollectiveWaitArgs{comm_, handle_});
  if (norm_.weight) dispatch(RmsNormArgs{rows_, norm_.weight, n_ / norm_.dim, norm_.dim, norm_.eps, rows_});
  dispatch(AddArgs{x, rows_, n_, x});
  rows_ = nullptr;
}

void PendingSum::reset() noexcept {
  if (!rows_) return;
  wait_out(comm_, handle_);
  rows_ = nullptr;
}

}  // namespace fp
