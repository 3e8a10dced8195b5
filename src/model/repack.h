// model/repack.h — Q8_0, Q4_K, Q6_K, Q3_K, Q2_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS and MXFP4 matmul weights repacked once at
// load into their _X8 forms (core/dtype.h), the interleaved layouts the CPU matmul kernels read:
// Q8_0_X8 at every batch size (batched decode and prefill no longer repack weights on every
// call), the others in decode (the scales of 8 blocks apply as one vector, not one per block).
// Same bytes per row, so the repacked tensor replaces the file's: no second copy is kept. See
// docs/design.md, "Weights repacked at load".
#pragma once
#include <cstdint>
#include <map>

#include "core/tensor.h"
#include "model/model_file.h"

namespace fp {

// Whether a weight can be repacked: Q8_0, Q4_K, Q6_K, Q3_K, Q2_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS or MXFP4, 2-D
// (or a 3-D stack of Q4_K / Q6_K / IQ4_NL / IQ4_XS / Q8_0 / MXFP4 experts, rows all the same), contiguous, rows a
// multiple of 256 values (MXFP4: of 32; its _X8 rows may end in plain blocks), no block scales, on the CPU.
// Everything else (Q5_K, other expert stacks, short rows) is left as is.
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
  std::map<DType, int64_t> by_type_;  // tensors repacked, by their file type
  int64_t tensors_ = 0, bytes_ = 0, new_bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace fp
