// model/context_parallel.cpp — the runs, the K/V exchange and the logit-row gather of prefill
// context parallel (see context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

void ContextParallelStep::begin(Communicator* comm, const ForwardBatch& b, int64_t page_size) {
  comm_ = comm;
  batch_ = &b;
  n_ = b.n_tokens();
  const int R = comm->size(), r = comm->rank();
  chunk_ = (n_ + R - 1) / R;
  const int64_t t0 = start(r), t1 = start(r + 1);
  run_.assign_tokens(b, t0, t1);
  b.slots(page_size, slots_);
}

void ContextParallelStep::write_kv(KvPool& pool, int64_t layer, const float* k, const float* v) {
  const int R = comm_->size();
  const int64_t kw = pool.layout().k_width, vw = pool.layout().v_width;
  k_all_.resize(static_cast<size_t>(R * chunk_ * kw));
  dispatch(AllGatherArgs{comm_, k, k_all_.data(), chunk_ * kw * 4});
  if (vw > 0) {
    v_all_.resize(static_cast<size_t>(R * chunk_ * vw));
    dispatch(AllGatherArgs{comm_, v, v_all_.data(), chunk_ * vw * 4});
  }
  for (int rr = 0; rr < R; ++rr)
    pool.write(layer, slots_.data() + start(rr), start(rr + 1) - start(rr), k_all_.data() + rr * chunk_ * kw,
               vw > 0 ? v_all_.data() + rr * chunk_ * vw : nullptr);
}

int64_t ContextParallelStep::gather_logit_rows(const float* x, int64_t dim, float* out) {
  const auto rows = static_cast<int64_t>(batch_->logit_rows.size());
  if (rows == 0) return 0;
  x_all_.resize(static_cast<size_t>(comm_->size() * chunk_ * dim));
  dispatch(AllGatherArgs{comm_, x, x_all_.data(), chunk_ * dim * 4});
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = batch_->logit_rows[static_cast<size_t>(i)];
    int rr = 0;
    while (t >= start(rr + 1)) ++rr;
    std::memcpy(out + i * dim, x_all_.data() + (rr * chunk_ + t - start(rr)) * dim, static_cast<size_t>(dim) * 4);
  }
  return rows;
}

}  // namespace fp
