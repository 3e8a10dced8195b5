// core/tensor.cpp — tensor view helpers.
#include "core/tensor.h"

#include <sstream>

#include "core/error.h"

namespace fp {

Tensor Tensor::view(const void* data, DType dtype, const int64_t* shape, int ndim) {
  FP_CHECK(ndim >= 1 && ndim <= 4, "tensor view: ", ndim, " dimensions (expected 1..4)");
  Tensor t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) t.shape[static_cast<size_t>(i)] = shape[i];
  int64_t s = row_bytes(dtype, shape[ndim - 1]);
  t.stride[static_cast<size_t>(ndim - 1)] = dtype_info(dtype).block_elems == 1 ? dtype_info(dtype).block_bytes : 0;
  for (int i = ndim - 2; i >= 0; --i) {
    t.stride[static_cast<size_t>(i)] = s;
    s *= shape[i];
  }
  return t;
}

Tensor Tensor::view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return view(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

int64_t Tensor::rows() const {
  int64_t n = 1;
  for (int i = 0; i + 1 < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

int64_t Tensor::nbytes() const { return rows() * row_bytes(dtype, cols()); }

bool Tensor::is_contiguous() const {
  int64_t s = row_bytes(dtype, cols());
  for (int i = ndim - 2; i >= 0; --i) {
    if (stride[static_cast<size_t>(i)] != s) return false;
    s *= shape[static_cast<size_t>(i)];
  }
  return true;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << ']';
  return os.str();
}

}  // namespace fp
