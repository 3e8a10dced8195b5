// core/tensor.h — a non-owning tensor view: pointer, shape, byte strides, dtype, device.
// Shapes are row-major, outermost first: a weight matrix mapping `in` to `out` features is
// {out, in}, each row holding `in` values (GGUF's ne order reversed).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace fp {

enum class Device { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};  // bytes between consecutive indices of each dimension
  // FP8 block-scaled weights (DeepSeek-V3 `weight_scale_inv`): one f32 per scale_block x scale_block
  // tile, row-major [ceil(rows/scale_block), ceil(cols/scale_block)]. Null when unscaled.
  const float* block_scale = nullptr;
  int64_t scale_block = 128;

  // A contiguous view over data with the given shape (last dimension contiguous).
  static Tensor view(const void* data, DType dtype, std::initializer_list<int64_t> shape);
  static Tensor view(const void* data, DType dtype, const int64_t* shape, int ndim);

  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t numel() const;
  int64_t rows() const;  // product of all but the last dimension
  int64_t cols() const { return ndim ? shape[static_cast<size_t>(ndim - 1)] : 1; }
  int64_t nbytes() const;  // for a contiguous tensor
  bool is_contiguous() const;
  // Pointer to the start of row r of the tensor seen as a [rows, cols] matrix (contiguous rows).
  const uint8_t* row_ptr(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(dtype, cols()); }
  std::string shape_str() const;  // "[64, 512]"
};

}  // namespace fp
