// model/vocab_parallel.h — the output projection split by vocabulary rows across the ranks of a
// split model (CPU or GPU ranks): rank r keeps rows [r * c, (r + 1) * c) of it, c = ceil(vocab / ranks) (the
// last share shorter; for a block-scaled output rounded up to whole scale blocks), computes that slice of the logits, and one all-gather (each rank's slice
// padded to c) puts every slice in place, so every rank ends with the same logits while reading
// only its share of the largest matrix of a decode step. A final logit softcap is applied to
// each rank's slice before the gather.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace fp {

class VocabParallelOutput {
 public:
  // The whole `output` [n_vocab, dim] when `comm` is null or has one rank; else this rank's rows,
  // a view kept in `shards`. `path` names the model in errors.
  // `device`: where run() works (its buffers there; the caller uploads `weight`).
  void init(const Tensor* output, Communicator* comm, std::deque<Tensor>& shards, const std::string& path,
            Device device = Device::CPU);
  // logits [rows, n_vocab] of the normalised rows h [rows, dim] (on the device given to init).
  void run(const float* h, int64_t rows, float* logits);
  bool split() const { return chunk_ > 0; }
  const Tensor* weight = nullptr;  // what this rank multiplies by (the repacker may replace it)
  float softcap = 0.0f;            // > 0: logits capped to softcap * tanh(l / softcap) (Gemma 2)
  // Hidden-state output (Model::set_hidden_output): run() writes the rows h themselves, [rows,
  // dim] packed, times hidden_scale (Granite, whose output norm carries 1 / logit_scale), instead
  // of their logits. Every rank holds the whole rows, so nothing is gathered. CPU only.
  bool hidden_rows = false;
  float hidden_scale = 1.0f;

 private:
  Communicator* comm_ = nullptr;
  int64_t n_vocab_ = 0, chunk_ = 0;  // chunk_: rows per rank (0: not split)
  DeviceBuffer part_, all_;          // this rank's logit slice, every rank's
};

}  // namespace fp
