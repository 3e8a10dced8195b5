// model/context_parallel.cpp — the runs, the K/V exchange and the logit-row gather of prefill
// context parallel (see context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

std::array<ContextParallelStep::Piece, 2> ContextParallelStep::pieces(int rank) const {
  const int64_t last = 2 * comm_->size() - 1 - rank;
  const Piece a{edge(rank), edge(rank + 1), 0};
  return {a, Piece{edge(last), edge(last + 1), a.t1 - a.t0}};
}

void ContextParallelStep::begin(Communicator* comm, const ForwardBatch& b, int64_t page_size) {
  comm_ = comm;
  batch_ = &b;
  n_ = b.n_tokens();
  const int R = comm->size();
  chunk_ = 0;
  for (int rr = 0; rr < R; ++rr) {
    const auto p = pieces(rr);
    chunk_ = std::max(chunk_, p[1].row + p[1].t1 - p[1].t0);
  }
  const auto mine = pieces(comm->rank());
  run_.assign_tokens(b, mine[0].t0, mine[0].t1);
  run_.append_tokens(b, mine[1].t0, mine[1].t1);
  b.slots(page_size, slots_);
  settle();
  mine_.clear();
  for (const Piece& p : mine) mine_.insert(mine_.end(), slots_.begin() + p.t0, slots_.begin() + p.t1);
}

void ContextParallelStep::settle() noexcept {
  if (kv_layer_ < 0) return;
  try {
    if (comm_ && kv_handle_ != Communicator::kDone) comm_->wait(kv_handle_);
  } catch (...) {
    // The communicator failed too: nothing more to wait for.
  }
  kv_layer_ = -1;
  kv_handle_ = Communicator::kDone;
}

void ContextParallelStep::start_kv(KvPool& pool, int64_t layer, const float* k, const float* v) {
  FP_CHECK(kv_layer_ < 0, "context parallel: layer ", layer, "'s K/V exchange started before layer ", kv_layer_,
           "'s finished");
  const int64_t kw = pool.layout().k_width, vw = pool.layout().v_width, rb = pool.slot_bytes();
  for (const Piece& p : pieces(comm_->rank()))
    pool.write(layer, slots_.data() + p.t0, p.t1 - p.t0, k + p.row * kw, vw > 0 ? v + p.row * vw : nullptr);
  // Every rank sends padded_rows() rows; those past rows() are padding, never stored.
  kv_send_.resize(static_cast<size_t>(chunk_ * rb), 0);
  kv_all_.resize(static_cast<size_t>(comm_->size() * chunk_ * rb));
  pool.pack_rows(layer, mine_.data(), rows(), kv_send_.data());
  dispatch(AllGatherStartArgs{comm_, kv_send_.data(), kv_all_.data(), chunk_ * rb, &kv_handle_});
  kv_layer_ = layer;
}

void ContextParallelStep::finish_kv(KvPool& pool) {
  FP_CHECK(kv_layer_ >= 0, "context parallel: no K/V exchange to finish");
  dispatch(CollectiveWaitArgs{comm_, kv_handle_});
  const int64_t rb = pool.slot_bytes();
  for (int rr = 0; rr < comm_->size(); ++rr) {
    if (rr == comm_->rank()) continue;  // written before the exchange
    for (const Piece& p : pieces(rr))
      pool.unpack_rows(kv_layer_, slots_.data() + p.t0, p.t1 - p.t0, kv_all_.data() + (rr * chunk_ + p.row) * rb);
  }
  kv_layer_ = -1;
  kv_handle_ = Communicator::kDone;
}

int64_t ContextParallelStep::gather_logit_rows(const float* x, int64_t dim, float* out) {
  const auto rows = static_cast<int64_t>(batch_->logit_rows.size());
  if (rows == 0) return 0;
  x_all_.resize(static_cast<size_t>(comm_->size() * chunk_ * dim));
  dispatch(AllGatherArgs{comm_, x, x_all_.data(), chunk_ * dim * 4});
  const int R = comm_->size();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = batch_->logit_rows[static_cast<size_t>(i)];
    int64_t piece = 0;
    while (t >= edge(piece + 1)) ++piece;
    const int rr = static_cast<int>(piece < R ? piece : 2 * R - 1 - piece);
    const Piece p = pieces(rr)[piece < R ? 0 : 1];
    std::memcpy(out + i * dim, x_all_.data() + (rr * chunk_ + p.row + t - p.t0) * dim, static_cast<size_t>(dim) * 4);
  }
  return rows;
}

const float* EveryHeadKvWriter::whole_rows(Communicator* tp, const float* part, int64_t n, int64_t width,
                                           std::vector<float>& rows) {
  const int R = tp->size();
  gathered_.resize(static_cast<size_t>(R * n * width));
  dispatch(AllGatherArgs{tp, part, gathered_.data(), n * width * 4});
  rows.resize(static_cast<size_t>(n * R * width));
  for (int rr = 0; rr < R; ++rr)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(rows.data() + (i * R + rr) * width, gathered_.data() + (rr * n + i) * width, static_cast<size_t>(width) * 4);
  return rows.data();
}

void EveryHeadKvWriter::write(Communicator* tp, KvPool& pool, int64_t layer, const int64_t* slots, int64_t n,
                              const float* k, const float* v, int64_t kv_dim, int64_t v_dim) {
  const float* kr = whole_rows(tp, k, n, kv_dim, k_rows_);
  const float* vr = whole_rows(tp, v, n, v_dim, v_rows_);
  pool.write(layer, slots, n, kr, vr);
}

}  // namespace fp
