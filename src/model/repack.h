// model/repack.h — Q8_0, Q4_K and Q6_K matmul weights repacked once at load into Q8_0_X8, Q4_K_X8
// and Q6_K_X8 (core/dtype.h), the interleaved layouts the CPU matmul kernels read: Q8_0_X8 at
// every batch size (batched decode and prefill no longer repack weights on every call), the
// K-quant forms in decode (their scales apply once per super-block, not per sub-block). Same bytes per row, so the repacked
// tensor replaces the file's: no second copy is kept. See docs/design.md, "Weights repacked at load".
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/model_file.h"

namespace fp {

// Whether a weight can be repacked: Q8_0, Q4_K or Q6_K, 2-D (or a 3-D stack of Q4_K / Q6_K
// experts, rows all the same), contiguous, rows a multiple of 256 values, no block scales, on the
// CPU. Everything else (Q4_0, Q8_0 expert stacks, short rows) is left as is.
bool repackable(const Tensor& w);
// The layout a repackable weight of type t becomes (t itself when there is none).
DType repacked_dtype(DType t);
// Repacks a weight whose bytes this model owns and may rewrite (a tensor-parallel column copy)
// where it lies; false (and untouched) when it is not repackable.
bool repack_in_place(Tensor& w);

// Repacks the matmul weights of one model as it is built (ModelFile::repack_weights; the
// --no-repack flag turns it off). Call repack() on every weight that only MatMulArgs reads.
class WeightRepacker {
 public:
  explicit WeightRepacker(ModelFile& f) : f_(f) {}
  // The weight to use in place of w: w when it is not repackable or repacking is off. A whole
  // file tensor is repacked where it lies when the weights sit in writable memory (--no-mmap),
  // else into a new buffer, and its mapped pages are given back; the file's tensor entry then
  // describes the repacked bytes, so every user of it (a tied embedding) sees one layout. Any
  // other view (a tensor-parallel row slice into the file) gets a new buffer of its own.
  const Tensor* repack(const Tensor* w);
  // Logs what was repacked and what it cost (one line), if anything was.
  void report() const;

 private:
  ModelFile& f_;
  int64_t tensors_ = 0, q8_tensors_ = 0, q4k_tensors_ = 0, q6k_tensors_ = 0, bytes_ = 0, new_bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace fp
