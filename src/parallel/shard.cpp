// parallel/shard.cpp — row views and column copies of weights (see shard.h).
#include "parallel/shard.h"

#include <cstring>

#include <algorithm>

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

int64_t column_alignment(const Tensor& w) { return dtype_info(w.dtype).block_elems; }

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
  FP_CHECK(!w.block_scale, "block-scaled (FP8) weight ", w.shape_str(),
           ": splitting its columns across ranks is not supported yet");
  FP_CHECK(c.begin >= 0 && c.len >= 1 && c.begin + c.len <= w.dim(1), "copy_columns: columns [", c.begin, ", ",
           c.begin + c.len, ") of ", w.shape_str());
  const int64_t a = column_alignment(w);
  FP_CHECK(c.begin % a == 0 && c.len % a == 0, "a ", dtype_name(w.dtype), " weight ", w.shape_str(), " holds blocks of ",
           a, " values per row, so its columns cannot be split at [", c.begin, ", ", c.begin + c.len,
           "); choose a tensor-parallel size that keeps each rank's share a multiple of ", a);
  const int64_t rows = w.dim(0), skip = row_bytes(w.dtype, c.begin), keep = row_bytes(w.dtype, c.len);
  OwnedTensor out;
  out.bytes.reset(new uint8_t[static_cast<size_t>(rows * keep)]);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.bytes.get() + r * keep, w.row_ptr(r) + skip, static_cast<size_t>(keep));
  out.view = Tensor::view(out.bytes.get(), w.dtype, {rows, c.len});
  return out;
}

}  // namespace fp
