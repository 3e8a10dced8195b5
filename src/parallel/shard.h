// parallel/shard.h — cutting a weight into one rank's slice for tensor parallelism.
//
// Weights are row-major [out, in]. A column-parallel layer (q/k/v, gate/up) splits the output
// features: the slice is a contiguous range of rows, a view into the same (memory-mapped) bytes.
// A row-parallel layer (attention output, down) splits the input features: the slice is a range
// of columns of every row, not contiguous, so it is copied into a buffer this rank owns. Quantized
// rows are blocks of 32 or 256 values, so column ranges must start and end on block boundaries.
#pragma once
#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace fp {

// The range [begin, begin + len) of part `index` when `total` is cut into `parts` pieces whose
// boundaries fall on multiples of `align`: equal pieces, the first ones one `align` larger when
// it does not divide evenly. Throws (naming `what` and the numbers) when total is not a multiple
// of align or a piece would be empty.
struct Range {
  int64_t begin = 0, len = 0;
};
Range split_range(int64_t total, int parts, int index, int64_t align, const char* what);

// Rows [r.begin, r.begin + r.len) of a 2-D weight, as a view (no copy). FP8 block-scaled weights
// must be cut on multiples of their scale block.
Tensor slice_rows(const Tensor& w, Range r);

// A weight that owns the bytes of its slice (the view points into `bytes`).
struct OwnedTensor {
  Tensor view;
  std::shared_ptr<uint8_t[]> bytes;
};
// Columns [c.begin, c.begin + c.len) of every row of a 2-D weight, copied; a block-scaled (FP8)
// weight's scale tiles of those columns too. Throws when the range does not fall on the dtype's
// block boundaries (block-scaled: on its scale blocks, the last cut may end at the last column).
OwnedTensor copy_columns(const Tensor& w, Range c);

// The alignment a column cut must respect: elements per block of the dtype (1 for
// F32/F16/BF16), the scale block (128) for block-scaled weights.
int64_t column_alignment(const Tensor& w);
// The alignment a row cut must respect: the scale block for block-scaled weights, else 1.
int64_t row_alignment(const Tensor& w);

}  // namespace fp
