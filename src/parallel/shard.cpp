// parallel/shard.cpp — row views and column copies of weights (see shard.h).
#include "parallel/shard.h"

#include <cstring>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace fp {

Range split_range(int64_t total, int parts, int index, int64_t align, const char* what) {
  FP_CHECK(parts >= 1 && index >= 0 && index < parts, what, ": part ", index, " of ", parts);
  FP_CHECK(align >= 1 && total % align == 0, what, ": ", total, " is not a multiple of ", align);
  const int64_t units = total / align, base = units / parts, extra = units % parts;
  FP_CHECK(base >= 1, what, ": ", total, " cannot be split across ", parts, " ranks in pieces of at least ", align);
  const int64_t i = index;
  Range r;
  r.begin = (i * base + std::min(i, extra)) * align;
  r.len = (base + (i < extra ? 1 : 0)) * align;
  return r;
}

int64_t column_alignment(const Tensor& w) {
  return w.block_scale ? std::lcm(w.scale_block, dtype_info(w.dtype).block_elems) : dtype_info(w.dtype).block_elems;
}

int64_t row_alignment(const Tensor& w) { return w.block_scale ? w.scale_block : 1; }

Tensor slice_rows(const Tensor& w, Range r) {
  FP_CHECK(w.ndim == 2 && w.is_contiguous(), "slice_rows: expected a contiguous 2-D weight, got ", w.shape_str());
  FP_CHECK(r.begin >= 0 && r.len >= 1 && r.begin + r.len <= w.dim(0), "slice_rows: rows [", r.begin, ", ",
           r.begin + r.len, ") of ", w.shape_str());
  Tensor t = Tensor::view(w.row_ptr(r.begin), w.dtype, {r.len, w.dim(1)});
  if (w.block_scale) {
    const int64_t b = w.scale_block;
    FP_CHECK(r.begin % b == 0, "block-scaled weight ", w.shape_str(), ": rows can be split only at multiples of ", b,
             ", not at ", r.begin);
    t.block_scale = w.block_scale + (r.begin / b) * ((w.dim(1) + b - 1) / b);
    t.scale_block = b;
  }
  return t;
}

OwnedTensor copy_columns(const Tensor& w, Range c) {
  FP_CHECK(w.ndim == 2 && w.is_contiguous(), "copy_columns: expected a contiguous 2-D weight, got ", w.shape_str());
  FP_CHECK(c.begin >= 0 && c.len >= 1 && c.begin + c.len <= w.dim(1), "copy_columns: columns [", c.begin, ", ",
           c.begin + c.len, ") of ", w.shape_str());
  const int64_t a = column_alignment(w);
  // The cut's end may be the last column (a block-scaled weight's last scale block may be partial).
  const bool ends_the_row = c.begin + c.len == w.dim(1);
  FP_CHECK(c.begin % a == 0 && (c.len % a == 0 || (w.block_scale && ends_the_row)), "a ", dtype_name(w.dtype),
           w.block_scale ? " block-scaled" : "", " weight ", w.shape_str(), " holds blocks of ", a,
           " values per row, so its columns cannot be split at [", c.begin, ", ", c.begin + c.len,
           "); choose a parallel size that keeps each rank's share a multiple of ", a);
  // A row of an interleaved 32-value format (Q4_0_X8, IQ4_NL_X8, MXFP4_X8) is groups of 256 values
  // and a partial group at its end: only a cut at a group boundary keeps both sides' layout.
  FP_CHECK(!is_block32_x8(w.dtype) || (c.begin % 256 == 0 && (c.len % 256 == 0 || ends_the_row)), "a ", dtype_name(w.dtype),
           " weight ", w.shape_str(), " is interleaved in groups of 256 values per row, so its columns cannot be split at [",
           c.begin, ", ", c.begin + c.len, "); cut it before repacking");
  const int64_t rows = w.dim(0), skip = row_bytes(w.dtype, c.begin), keep = row_bytes(w.dtype, c.len);
  // Block-scaled: the scale tiles of the kept columns too, [row blocks, column blocks kept], after
  // the values (at a 4-byte boundary) in the same buffer.
  const int64_t b = w.scale_block, row_blocks = (rows + b - 1) / b, all_cols = (w.dim(1) + b - 1) / b;
  const int64_t col0 = c.begin / b, cols = w.block_scale ? (c.len + b - 1) / b : 0;
  const int64_t values = (rows * keep + 3) / 4 * 4, scales = row_blocks * cols * 4;
  OwnedTensor out;
  out.bytes.reset(new uint8_t[static_cast<size_t>(values + scales)]);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.bytes.get() + r * keep, w.row_ptr(r) + skip, static_cast<size_t>(keep));
  out.view = Tensor::view(out.bytes.get(), w.dtype, {rows, c.len});
  if (w.block_scale) {
    auto* sc = reinterpret_cast<float*>(out.bytes.get() + values);
    for (int64_t rb = 0; rb < row_blocks; ++rb)
      std::memcpy(sc + rb * cols, w.block_scale + rb * all_cols + col0, static_cast<size_t>(cols) * 4);
    out.view.block_scale = sc;
    out.view.scale_block = b;
  }
  return out;
}

}  // namespace fp
