// model/data_parallel.cpp — see data_parallel.h.
#include "model/data_parallel.h"

#include <algorithm>
#include <cstring>

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
  chunk_ = 0;
  for (const auto& t : tokens_) chunk_ = std::max<int64_t>(chunk_, static_cast<int64_t>(t.size()));
  if (device_ == Device::CPU) return;
  // The permutations as index arrays: the gathered row of each batch token, the batch token of
  // each sent row (row 0 for padding: summed, never read), then the batch's logit rows.
  const int64_t total = b.n_tokens();
  scatter_ids_at_ = total;
  logit_ids_at_ = total + R * chunk_;
  host_ids_.assign(static_cast<size_t>(logit_ids_at_), 0);
  for (int r = 0; r < R; ++r) {
    const auto& t = tokens_[static_cast<size_t>(r)];
    for (size_t i = 0; i < t.size(); ++i) {
      const int64_t row = r * chunk_ + static_cast<int64_t>(i);
      host_ids_[static_cast<size_t>(t[i])] = static_cast<int32_t>(row);
      host_ids_[static_cast<size_t>(scatter_ids_at_ + row)] = static_cast<int32_t>(t[i]);
    }
  }
  host_ids_.insert(host_ids_.end(), b.logit_rows.begin(), b.logit_rows.end());
  ids_.reserve(std::max<size_t>(host_ids_.size(), 1) * sizeof(int32_t));
  uploads_.upload(ids_.data(), host_ids_.data(), host_ids_.size() * sizeof(int32_t));
}

void DataParallelStep::gather(const float* own, int64_t dim, float* all) {
  const int R = comm_->size();
  if (device_ != Device::CPU) {
    rows_recv_.reserve(static_cast<size_t>(R * chunk_ * dim) * sizeof(float));
    dispatch(AllGatherArgs{comm_, own, rows_recv_.data(), chunk_ * dim * 4});
    gather_rows_.run(rows_recv_.as<float>(), R * chunk_, dim, ids_.as<int32_t>(), total_rows(), all);
    return;
  }
  const size_t row = static_cast<size_t>(dim) * 4;
  send_.assign(static_cast<size_t>(chunk_ * dim), 0.0f);  // this rank's rows, padded to chunk_
  if (rows() > 0) std::memcpy(send_.data(), own, static_cast<size_t>(rows()) * row);
  recv_.resize(static_cast<size_t>(R * chunk_ * dim));
  dispatch(AllGatherArgs{comm_, send_.data(), recv_.data(), chunk_ * dim * 4});
  for (int r = 0; r < R; ++r) {
    const auto& t = tokens_[static_cast<size_t>(r)];
    for (size_t i = 0; i < t.size(); ++i)
      std::memcpy(all + t[i] * dim, recv_.data() + (r * chunk_ + static_cast<int64_t>(i)) * dim, row);
  }
}

void DataParallelStep::reduce_scatter(const float* all, int64_t dim, float* own) {
  const int R = comm_->size();
  if (device_ != Device::CPU) {
    rows_send_.reserve(static_cast<size_t>(R * chunk_ * dim) * sizeof(float));
    rows_recv_.reserve(static_cast<size_t>(chunk_ * dim) * sizeof(float));
    gather_rows_.run(all, total_rows(), dim, ids_.as<int32_t>() + scatter_ids_at_, R * chunk_, rows_send_.as<float>());
    dispatch(ReduceScatterArgs{comm_, rows_send_.as<float>(), rows_recv_.as<float>(), chunk_ * dim});
    copy_bytes_async(device_, own, device_, rows_recv_.data(), static_cast<size_t>(rows() * dim) * sizeof(float));
    return;
  }
  const size_t row = static_cast<size_t>(dim) * 4;
  send_.assign(static_cast<size_t>(R * chunk_ * dim), 0.0f);  // block r: rank r's rows, padded
  for (int r = 0; r < R; ++r) {
    const auto& t = tokens_[static_cast<size_t>(r)];
    for (size_t i = 0; i < t.size(); ++i)
      std::memcpy(send_.data() + (r * chunk_ + static_cast<int64_t>(i)) * dim, all + t[i] * dim, row);
  }
  recv_.resize(static_cast<size_t>(chunk_ * dim));
  dispatch(ReduceScatterArgs{comm_, send_.data(), recv_.data(), chunk_ * dim});
  if (rows() > 0) std::memcpy(own, recv_.data(), static_cast<size_t>(rows()) * row);
}

}  // namespace fp
