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

void VocabParallelOutput::init(const Tensor* output, Communicator* comm, std::deque<Tensor>& shards, const std::string& path,
                               Device device) {
  weight = output;
  part_ = DeviceBuffer(device);
  all_ = DeviceBuffer(device);
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
  if (hidden_rows) {
    FP_CHECK(part_.device() == Device::CPU, "hidden-state output runs on the CPU only");
    const int64_t n = rows * weight->cols();
    for (int64_t i = 0; i < n; ++i) logits[i] = h[i] * hidden_scale;
    return;
  }
  if (chunk_ == 0) {
    dispatch(MatMulArgs{h, rows, weight, nullptr, logits});
    if (softcap > 0) dispatch(SoftcapArgs{logits, rows * n_vocab_, softcap});
    return;
  }
  const int R = comm_->size();
  const auto part_bytes = static_cast<size_t>(rows * chunk_) * sizeof(float);  // [rows, this rank's slice], padded
  part_.reserve(part_bytes);
  all_.reserve(part_bytes * static_cast<size_t>(R));
  dispatch(MatMulArgs{h, rows, weight, nullptr, part_.as<float>()});
  if (softcap > 0) dispatch(SoftcapArgs{part_.as<float>(), rows * chunk_, softcap});
  dispatch(AllGatherArgs{comm_, part_.data(), all_.data(), static_cast<int64_t>(part_bytes)});
  // Rank r's slice [rows, len] into columns [v0, v0 + len) of every logit row.
  for (int r = 0; r < R; ++r) {
    const int64_t v0 = std::min(n_vocab_, r * chunk_), len = std::min(n_vocab_, v0 + chunk_) - v0;
    const auto width = static_cast<size_t>(len) * sizeof(float);
    copy_rows(part_.device(), logits + v0, static_cast<size_t>(n_vocab_) * sizeof(float),
              all_.as<float>() + r * rows * chunk_, width, width, static_cast<size_t>(rows));
  }
}

}  // namespace fp
