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
  if (device != device_) {
    device_ = device;
    maps_ = DeviceBuffer(device);
    uploads_ = UploadRing(device);
    for (DeviceBuffer* d : {&kv_send_, &kv_all_, &x_all_dev_}) *d = DeviceBuffer(device);
    gather_rows_ = RowGather(device);
  }
  // The step's maps: this rank's rows' slots, the other tokens' slots and the rows of the
  // gathered buffer holding them, the gathered row of each logit row — on a device, one upload.
  const int64_t others = n_ - rows();
  const auto n_logits = static_cast<int64_t>(batch_->logit_rows.size());
  other_slots_at_ = static_cast<size_t>(rows()) * sizeof(int64_t);
  other_rows_at_ = other_slots_at_ + static_cast<size_t>(others) * sizeof(int64_t);
  logit_rows_at_ = other_rows_at_ + static_cast<size_t>(others) * sizeof(int32_t);
  host_maps_.resize(logit_rows_at_ + static_cast<size_t>(n_logits) * sizeof(int32_t));
  auto* mine_slots = reinterpret_cast<int64_t*>(host_maps_.data());
  auto* other_slots = reinterpret_cast<int64_t*>(host_maps_.data() + other_slots_at_);
  auto* other_rows = reinterpret_cast<int32_t*>(host_maps_.data() + other_rows_at_);
  auto* logit_rows = reinterpret_cast<int32_t*>(host_maps_.data() + logit_rows_at_);
  for (const Piece& p : mine)
    for (int64_t t = p.t0; t < p.t1; ++t) *mine_slots++ = slots_[static_cast<size_t>(t)];
  for (int64_t t = 0; t < n_; ++t) {
    if (t >= mine[0].t0 && t < mine[0].t1) continue;
    if (t >= mine[1].t0 && t < mine[1].t1) continue;
    *other_slots++ = slots_[static_cast<size_t>(t)];
    *other_rows++ = static_cast<int32_t>(gathered_row(t));
  }
  for (int64_t i = 0; i < n_logits; ++i) logit_rows[i] = static_cast<int32_t>(gathered_row(batch_->logit_rows[static_cast<size_t>(i)]));
  if (device_ == Device::CPU) return;
  maps_.reserve(std::max<size_t>(host_maps_.size(), 1));
  uploads_.upload(maps_.data(), host_maps_.data(), host_maps_.size());
}

const uint8_t* ContextParallelStep::maps() const {
  return device_ == Device::CPU ? host_maps_.data() : maps_.as<uint8_t>();
}

void ContextParallelStep::settle() noexcept {
  if (kv_layer_ < 0) return;
  wait_out(comm_, kv_handle_);
  kv_layer_ = -1;
}

void ContextParallelStep::start_kv(KvPool& pool, int64_t layer, const float* k, const float* v) {
  FP_CHECK(kv_layer_ < 0, "context parallel: layer ", layer, "'s K/V exchange started before layer ", kv_layer_,
           "'s finished");
  FP_CHECK(pool.device() == device_, "context parallel: the step was cut for ", device_name(device_), ", the pool is on ",
           device_name(pool.device()));
  const int64_t vw = pool.layout().v_width, rb = pool.slot_bytes();
  const auto* mine_slots = reinterpret_cast<const int64_t*>(maps());
  pool.write(layer, mine_slots, rows(), k, vw > 0 ? v : nullptr);
  // Every rank sends padded_rows() rows; those past rows() are padding, never stored.
  const auto send = static_cast<size_t>(chunk_ * rb);
  kv_send_.reserve(std::max<size_t>(send, 1));
  kv_all_.reserve(std::max<size_t>(send * static_cast<size_t>(comm_->size()), 1));
  pool.pack_rows(layer, mine_slots, rows(), kv_send_.data());
  dispatch(AllGatherStartArgs{comm_, kv_send_.data(), kv_all_.data(), chunk_ * rb, &kv_handle_});
  kv_layer_ = layer;
}

void ContextParallelStep::finish_kv(KvPool& pool) {
  FP_CHECK(kv_layer_ >= 0, "context parallel: no K/V exchange to finish");
  dispatch(CollectiveWaitArgs{comm_, std::exchange(kv_handle_, Communicator::kDone)});
  // The other ranks' rows into their slots, as the cache stores them (this rank's were written
  // before the exchange).
  pool.unpack_rows(kv_layer_, reinterpret_cast<const int64_t*>(maps() + other_slots_at_), n_ - rows(), kv_all_.data(),
                   reinterpret_cast<const int32_t*>(maps() + other_rows_at_));
  kv_layer_ = -1;
}

int64_t ContextParallelStep::gather_logit_rows(const float* x, int64_t dim, float* out) {
  const auto rows = static_cast<int64_t>(batch_->logit_rows.size());
  if (rows == 0) return 0;
  const int R = comm_->size();
  const auto* logit_rows = reinterpret_cast<const int32_t*>(maps() + logit_rows_at_);
  if (device_ != Device::CPU) {
    x_all_dev_.reserve(static_cast<size_t>(R * chunk_ * dim) * sizeof(float));
    dispatch(AllGatherArgs{comm_, x, x_all_dev_.data(), chunk_ * dim * 4});
    gather_rows_.run(x_all_dev_.as<float>(), R * chunk_, dim, logit_rows, rows, out);
    return rows;
  }
  x_all_.resize(static_cast<size_t>(R * chunk_ * dim));
  dispatch(AllGatherArgs{comm_, x, x_all_.data(), chunk_ * dim * 4});
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(out + i * dim, x_all_.data() + logit_rows[i] * dim, static_cast<size_t>(dim) * 4);
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
