// model/data_parallel.cpp — see data_parallel.h.
#include "model/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

int data_parallel_owner(const ForwardBatch& b, int64_t s, int ranks) {
  const int32_t p0 = b.page_indptr[s], p1 = b.page_indptr[s + 1];
  FP_CHECK(p1 > p0, "data-parallel attention: sequence ", s, " of the batch has no KV block");
  return static_cast<int>(b.page_ids[p0] % ranks);
}

void DataParallelStep::begin(Communicator* comm, const ForwardBatch& b, const KvPool& pool) {
  settle();
  comm_ = comm;
  batch_ = &b;
  const int R = comm->size(), me = comm->rank();
  tokens_.assign(static_cast<size_t>(R), {});
  run_.clear();
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    const int owner = data_parallel_owner(b, s, R);
    const int32_t t0 = b.seq_indptr[s], t1 = b.seq_indptr[s + 1];
    for (int32_t t = t0; t < t1; ++t) tokens_[static_cast<size_t>(owner)].push_back(t);
    if (owner != me) continue;
    // Its blocks where this rank stores them (a partitioned pool keeps only this rank's blocks).
    pages_.clear();
    for (int32_t p = b.page_indptr[s]; p < b.page_indptr[s + 1]; ++p) pages_.push_back(pool.storage_block(b.page_ids[p]));
    run_.add_sequence(b.tokens.data() + t0, t1 - t0, b.positions[t0], pages_.data(), static_cast<int64_t>(pages_.size()), false);
  }
  total_ = b.n_tokens();
  ffn_row_.resize(static_cast<size_t>(total_));
  for (int64_t t = 0; t < total_; ++t) ffn_row_[static_cast<size_t>(t)] = t;
  upload_maps();
}

void DataParallelStep::begin_part(const DataParallelStep& whole, int part) {
  FP_CHECK(part == 0 || part == 1, "data-parallel attention: micro-batch ", part, " of 2");
  settle();
  comm_ = whole.comm_;
  batch_ = whole.batch_;
  run_.clear();  // the rank's own half is MicroBatchSplit's
  tokens_ = whole.tokens_;
  std::vector<char> kept(static_cast<size_t>(batch_->n_tokens()), 0);
  for (auto& t : tokens_) {
    const auto half = static_cast<std::ptrdiff_t>(t.size() / 2);
    if (part == 0) t.erase(t.begin() + half, t.end());
    else t.erase(t.begin(), t.begin() + half);
    for (int64_t i : t) kept[static_cast<size_t>(i)] = 1;
  }
  // The FFN rows: the kept tokens in batch order.
  ffn_row_.assign(kept.size(), -1);
  total_ = 0;
  for (size_t t = 0; t < kept.size(); ++t)
    if (kept[t]) ffn_row_[t] = total_++;
  upload_maps();
}

void DataParallelStep::upload_maps() {
  chunk_ = 0;
  for (const auto& t : tokens_) chunk_ = std::max<int64_t>(chunk_, static_cast<int64_t>(t.size()));
  if (device_ == Device::CPU) return;
  // The permutations as index arrays: the gathered row of each FFN row, the FFN row of each sent
  // row (row 0 for padding: summed, never read), then the batch's logit rows.
  const int R = comm_->size();
  scatter_ids_at_ = total_;
  logit_ids_at_ = total_ + R * chunk_;
  host_ids_.assign(static_cast<size_t>(logit_ids_at_), 0);
  for (int r = 0; r < R; ++r) {
    const auto& t = tokens_[static_cast<size_t>(r)];
    for (size_t i = 0; i < t.size(); ++i) {
      const int64_t row = r * chunk_ + static_cast<int64_t>(i), f = ffn_row_[static_cast<size_t>(t[i])];
      host_ids_[static_cast<size_t>(f)] = static_cast<int32_t>(row);
      host_ids_[static_cast<size_t>(scatter_ids_at_ + row)] = static_cast<int32_t>(f);
    }
  }
  host_ids_.insert(host_ids_.end(), batch_->logit_rows.begin(), batch_->logit_rows.end());
  ids_.reserve(std::max<size_t>(host_ids_.size(), 1) * sizeof(int32_t));
  uploads_.upload(ids_.data(), host_ids_.data(), host_ids_.size() * sizeof(int32_t));
}

void DataParallelStep::settle() noexcept {
  if (!in_flight_) return;
  wait_out(comm_, handle_);
  in_flight_ = false;
}

void DataParallelStep::send_gather(const float* own, int64_t dim, bool started) {
  FP_CHECK(!in_flight_, "data-parallel attention: a gather started while an exchange is in flight");
  const int R = comm_->size();
  const void* send = own;
  void* recv = nullptr;
  if (device_ != Device::CPU) {
    rows_recv_.reserve(std::max<size_t>(static_cast<size_t>(R * chunk_ * dim) * sizeof(float), 1));
    recv = rows_recv_.data();
  } else {
    send_.assign(static_cast<size_t>(chunk_ * dim), 0.0f);  // this rank's rows, padded to chunk_
    if (rows() > 0) std::memcpy(send_.data(), own, static_cast<size_t>(rows() * dim) * sizeof(float));
    recv_.resize(static_cast<size_t>(R * chunk_ * dim));
    send = send_.data();
    recv = recv_.data();
  }
  in_flight_ = true;
  if (started) dispatch(AllGatherStartArgs{comm_, send, recv, chunk_ * dim * 4, &handle_});
  else dispatch(AllGatherArgs{comm_, send, recv, chunk_ * dim * 4});
}

void DataParallelStep::finish_gather(int64_t dim, float* all) {
  FP_CHECK(in_flight_, "data-parallel attention: no gather in flight");
  if (handle_ != Communicator::kDone) dispatch(CollectiveWaitArgs{comm_, std::exchange(handle_, Communicator::kDone)});
  in_flight_ = false;
  const int R = comm_->size();
  if (device_ != Device::CPU) {
    gather_rows_.run(rows_recv_.as<float>(), R * chunk_, dim, ids_.as<int32_t>(), total_, all);
    return;
  }
  const size_t row = static_cast<size_t>(dim) * sizeof(float);
  for (int r = 0; r < R; ++r) {
    const auto& t = tokens_[static_cast<size_t>(r)];
    for (size_t i = 0; i < t.size(); ++i)
      std::memcpy(all + ffn_row_[static_cast<size_t>(t[i])] * dim, recv_.data() + (r * chunk_ + static_cast<int64_t>(i)) * dim,
                  row);
  }
}

void DataParallelStep::send_reduce_scatter(const float* all, int64_t dim, bool started) {
  FP_CHECK(!in_flight_, "data-parallel attention: a reduce-scatter started while an exchange is in flight");
  const int R = comm_->size();
  const float* send = nullptr;
  float* recv = nullptr;
  if (device_ != Device::CPU) {
    rows_send_.reserve(std::max<size_t>(static_cast<size_t>(R * chunk_ * dim) * sizeof(float), 1));
    rows_recv_.reserve(std::max<size_t>(static_cast<size_t>(chunk_ * dim) * sizeof(float), 1));
    gather_rows_.run(all, total_, dim, ids_.as<int32_t>() + scatter_ids_at_, R * chunk_, rows_send_.as<float>());
    send = rows_send_.as<float>();
    recv = rows_recv_.as<float>();
  } else {
    const size_t row = static_cast<size_t>(dim) * sizeof(float);
    send_.assign(static_cast<size_t>(R * chunk_ * dim), 0.0f);  // block r: rank r's rows, padded
    for (int r = 0; r < R; ++r) {
      const auto& t = tokens_[static_cast<size_t>(r)];
      for (size_t i = 0; i < t.size(); ++i)
        std::memcpy(send_.data() + (r * chunk_ + static_cast<int64_t>(i)) * dim, all + ffn_row_[static_cast<size_t>(t[i])] * dim,
                    row);
    }
    recv_.resize(static_cast<size_t>(chunk_ * dim));
    send = send_.data();
    recv = recv_.data();
  }
  in_flight_ = true;
  if (started) dispatch(ReduceScatterStartArgs{comm_, send, recv, chunk_ * dim, &handle_});
  else dispatch(ReduceScatterArgs{comm_, send, recv, chunk_ * dim});
}

void DataParallelStep::finish_reduce_scatter(int64_t dim, float* own, bool add) {
  FP_CHECK(in_flight_, "data-parallel attention: no reduce-scatter in flight");
  if (handle_ != Communicator::kDone) dispatch(CollectiveWaitArgs{comm_, std::exchange(handle_, Communicator::kDone)});
  in_flight_ = false;
  const float* sums = device_ != Device::CPU ? rows_recv_.as<float>() : recv_.data();
  if (rows() == 0) return;
  if (add) dispatch(AddArgs{own, sums, rows() * dim, own});
  else copy_bytes_async(device_, own, device_, sums, static_cast<size_t>(rows() * dim) * sizeof(float));
}

}  // namespace fp
