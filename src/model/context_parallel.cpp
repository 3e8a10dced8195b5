// model/context_parallel.cpp — the runs, the K/V exchange and the logit-row gather of prefill
// context parallel (see context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

std::array<ContextParallelStep::Piece, 2> ContextParallelStep::pieces(int rank) const {
  const int64_t last = 2 * comm_->size() - 1 - rank;
  const Piece a{edge(rank), edge(rank + 1), 0};
  return {a, Piece{edge(last), edge(last + 1), a.t1 - a.t0}};
}

int64_t ContextParallelStep::gathered_row(int64_t t) const {
  const int R = comm_->size();
  int64_t piece = 0;
  while (t >= edge(piece + 1)) ++piece;
  const int rr = static_cast<int>(piece < R ? piece : 2 * R - 1 - piece);
  const Piece p = pieces(rr)[piece < R ? 0 : 1];
  return rr * chunk_ + p.row + t - p.t0;
}

void ContextParallelStep::begin(Communicator* comm, const ForwardBatch& b, int64_t page_size, Device device) {
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
  if (device != device_) {
    device_ = device;
    maps_ = DeviceBuffer(device);
    uploads_ = UploadRing(device);
    for (DeviceBuffer* d : {&k_all_, &v_all_, &x_all_dev_, &k_batch_, &v_batch_}) *d = DeviceBuffer(device);
    gather_rows_ = RowGather(device);
  }
  if (device_ == Device::CPU) return;
  // The step's maps, one upload: every token's slot, then the gathered row of each token and of
  // each logit row.
  const auto n_logits = batch_->logit_rows.size();
  token_rows_at_ = static_cast<size_t>(n_) * sizeof(int64_t);
  logit_rows_at_ = token_rows_at_ + static_cast<size_t>(n_) * sizeof(int32_t);
  host_maps_.resize(logit_rows_at_ + n_logits * sizeof(int32_t));
  std::memcpy(host_maps_.data(), slots_.data(), token_rows_at_);
  auto* rows = reinterpret_cast<int32_t*>(host_maps_.data() + token_rows_at_);
  for (int64_t t = 0; t < n_; ++t) rows[t] = static_cast<int32_t>(gathered_row(t));
  for (size_t i = 0; i < n_logits; ++i) rows[n_ + static_cast<int64_t>(i)] = rows[batch_->logit_rows[i]];
  maps_.reserve(std::max<size_t>(host_maps_.size(), 1));
  uploads_.upload(maps_.data(), host_maps_.data(), host_maps_.size());
}

void ContextParallelStep::start_kv_on_device(const float* k, const float* v, int64_t kw, int64_t vw) {
  const int R = comm_->size();
  k_all_.reserve(static_cast<size_t>(R * chunk_ * kw) * sizeof(float));
  dispatch(AllGatherStartArgs{comm_, k, k_all_.data(), chunk_ * kw * 4, &kv_handle_});
  if (vw > 0) {
    v_all_.reserve(static_cast<size_t>(R * chunk_ * vw) * sizeof(float));
    dispatch(AllGatherStartArgs{comm_, v, v_all_.data(), chunk_ * vw * 4, &v_handle_});
  }
}

void ContextParallelStep::finish_kv_on_device(KvPool& pool) {
  const int R = comm_->size();
  const int64_t kw = pool.layout().k_width, vw = pool.layout().v_width;
  dispatch(CollectiveWaitArgs{comm_, std::exchange(kv_handle_, Communicator::kDone)});
  if (vw > 0) dispatch(CollectiveWaitArgs{comm_, std::exchange(v_handle_, Communicator::kDone)});
  const auto* token_rows = reinterpret_cast<const int32_t*>(maps_.as<uint8_t>() + token_rows_at_);
  k_batch_.reserve(static_cast<size_t>(n_ * kw) * sizeof(float));
  gather_rows_.run(k_all_.as<float>(), R * chunk_, kw, token_rows, n_, k_batch_.as<float>());
  if (vw > 0) {
    v_batch_.reserve(static_cast<size_t>(n_ * vw) * sizeof(float));
    gather_rows_.run(v_all_.as<float>(), R * chunk_, vw, token_rows, n_, v_batch_.as<float>());
  }
  pool.write(kv_layer_, maps_.as<int64_t>(), n_, k_batch_.as<float>(), vw > 0 ? v_batch_.as<float>() : nullptr);
}

void ContextParallelStep::settle() noexcept {
  if (kv_layer_ < 0) return;
  for (int64_t* h : {&kv_handle_, &v_handle_}) {  // each on its own: one failing leaves the other to wait
    try {
      if (comm_ && *h != Communicator::kDone) comm_->wait(*h);
    } catch (...) {
      // The communicator failed too: nothing more to wait for.
    }
    *h = Communicator::kDone;
  }
  kv_layer_ = -1;
  kv_handle_ = v_handle_ = Communicator::kDone;
}

void ContextParallelStep::start_kv(KvPool& pool, int64_t layer, const float* k, const float* v) {
  FP_CHECK(kv_layer_ < 0, "context parallel: layer ", layer, "'s K/V exchange started before layer ", kv_layer_,
           "'s finished");
  const int64_t kw = pool.layout().k_width, vw = pool.layout().v_width, rb = pool.slot_bytes();
  FP_CHECK(pool.device() == device_, "context parallel: the step was cut for ", device_name(device_), ", the pool is on ",
           device_name(pool.device()));
  if (device_ != Device::CPU) {
    start_kv_on_device(k, v, kw, vw);
    kv_layer_ = layer;
    return;
  }
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
  if (device_ != Device::CPU) {
    finish_kv_on_device(pool);
    kv_layer_ = -1;
    kv_handle_ = v_handle_ = Communicator::kDone;
    return;
  }
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
  const int R = comm_->size();
  if (device_ != Device::CPU) {
    x_all_dev_.reserve(static_cast<size_t>(R * chunk_ * dim) * sizeof(float));
    dispatch(AllGatherArgs{comm_, x, x_all_dev_.data(), chunk_ * dim * 4});
    const auto* logit_rows = reinterpret_cast<const int32_t*>(maps_.as<uint8_t>() + logit_rows_at_);
    gather_rows_.run(x_all_dev_.as<float>(), R * chunk_, dim, logit_rows, rows, out);
    return rows;
  }
  x_all_.resize(static_cast<size_t>(R * chunk_ * dim));
  dispatch(AllGatherArgs{comm_, x, x_all_.data(), chunk_ * dim * 4});
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = batch_->logit_rows[static_cast<size_t>(i)];
    std::memcpy(out + i * dim, x_all_.data() + gathered_row(t) * dim, static_cast<size_t>(dim) * 4);
  }
  return rows;
}

const float* EveryHeadKvWriter::whole_rows(Communicator* tp, const float* part, int64_t n, int64_t width,
                                           DeviceBuffer& rows) {
  const int R = tp->size();
  const auto row = static_cast<size_t>(width) * sizeof(float);
  gathered_.reserve(static_cast<size_t>(R * n) * row);
  dispatch(AllGatherArgs{tp, part, gathered_.data(), n * width * 4});
  rows.reserve(static_cast<size_t>(n * R) * row);
  for (int rr = 0; rr < R; ++rr)  // rank rr's rows [n, width] into columns rr x width of [n, R x width]
    copy_rows(rows.device(), rows.as<float>() + rr * width, R * row, gathered_.as<float>() + rr * n * width, row, row,
              static_cast<size_t>(n));
  return rows.as<float>();
}

void EveryHeadKvWriter::write(Communicator* tp, KvPool& pool, int64_t layer, const int64_t* slots, int64_t n,
                              const float* k, const float* v, int64_t kv_dim, int64_t v_dim) {
  if (gathered_.device() != pool.device())
    for (DeviceBuffer* d : {&gathered_, &k_rows_, &v_rows_}) *d = DeviceBuffer(pool.device());
  const float* kr = whole_rows(tp, k, n, kv_dim, k_rows_);
  const float* vr = whole_rows(tp, v, n, v_dim, v_rows_);
  pool.write(layer, slots, n, kr, vr);
}

}  // namespace fp
