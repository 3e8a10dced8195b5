// model/vocab_parallel.cpp — see vocab_parallel.h.
#include "model/vocab_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"
#include "parallel/shard.h"

namespace fp {

void VocabParallelOutput::init(const Tensor* output, Communicator* comm, std::deque<Tensor>& shards, const std::string& path) {
  weight = output;
  comm_ = comm;
  n_vocab_ = output->rows();
  chunk_ = 0;
  if (!comm || comm->size() <= 1) return;
  const int R = comm->size();
  // Shares of whole scale blocks for a block-scaled (FP8) output; every rank must get rows (the
  // check reads only figures every rank has, so all ranks fail alike).
  const int64_t align = row_alignment(*output);
  chunk_ = ((n_vocab_ + R - 1) / R + align - 1) / align * align;
  FP_CHECK((R - 1) * chunk_ < n_vocab_, path, ": a vocabulary of ", n_vocab_, " cannot be split over ", R, " ranks",
           align > 1 ? " in shares of whole " + std::to_string(align) + "-row scale blocks" : std::string());
  const int64_t v0 = comm->rank() * chunk_;
  const int64_t len = std::min<int64_t>(n_vocab_, v0 + chunk_) - v0;
  weight = &shards.emplace_back(slice_rows(*output, Range{v0, len}));
}

void VocabParallelOutput::run(const float* h, int64_t rows, float* logits) {
  if (chunk_ == 0) return dispatch(MatMulArgs{h, rows, weight, nullptr, logits});
  const int R = comm_->size();
  part_.assign(static_cast<size_t>(rows * chunk_), 0.0f);  // [rows, this rank's slice], padded to chunk_
  dispatch(MatMulArgs{h, rows, weight, nullptr, part_.data()});
  all_.resize(static_cast<size_t>(R * rows * chunk_));
  dispatch(AllGatherArgs{comm_, part_.data(), all_.data(), rows * chunk_ * 4});
  for (int r = 0; r < R; ++r) {
    const int64_t v0 = std::min(n_vocab_, r * chunk_), len = std::min(n_vocab_, v0 + chunk_) - v0;
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(logits + i * n_vocab_ + v0, all_.data() + (r * rows * chunk_ + i * len), static_cast<size_t>(len) * 4);
  }
}

}  // namespace fp
