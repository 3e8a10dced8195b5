// model/repack.cpp — Q8_0 -> Q8_0_X8, Q4_K -> Q4_K_X8, Q6_K -> Q6_K_X8, Q3_K / Q2_K -> Q3_K_X8 / Q2_K_X8 and Q4_0 /
// Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS -> their _X8 forms at load (see repack.h).
#include "model/repack.h"

#include <sys/mman.h>

#include <chrono>
#include <memory>

#include "core/log.h"
#include "core/thread_pool.h"

namespace fp {

DType repacked_dtype(DType t) {
  switch (t) {
    case DType::Q8_0: return DType::Q8_0_X8;
    case DType::Q4_K: return DType::Q4_K_X8;
    case DType::Q6_K: return DType::Q6_K_X8;
    case DType::Q3_K: return DType::Q3_K_X8;
    case DType::Q2_K: return DType::Q2_K_X8;
    case DType::IQ4_XS: return DType::IQ4_XS_X8;
    default: return block32_x8(t);  // Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4
  }
}

bool repackable(const Tensor& w) {
  // A 3-D stack of experts is rows too (the grouped MoE kernel runs each expert's slice through
  // the matmul op). Q8_0 stacks too (twenty-ninth session: prefill of a Qwen3-30B-A3B-shaped Q8_0
  // model 1.24x, its experts' tiles no longer packed per call; decode then runs `grouped` on the
  // repacked rows, as fast as the MoE GEMV on plain ones); the other 32-value-block stacks stay.
  const bool shape_ok = w.ndim == 2 || (w.ndim == 3 && (w.dtype == DType::Q4_K || w.dtype == DType::Q6_K || w.dtype == DType::IQ4_XS ||
                                                         w.dtype == DType::IQ4_NL || w.dtype == DType::Q8_0 ||
                                                         w.dtype == DType::MXFP4));
  // Q4_0 / IQ4_NL / MXFP4 rows of any multiple of 32 values: their _X8 rows may end in a partial group
  // (core/dtype.h); gpt-oss's are 2880 values, Gemma 3 1B's 1152.
  const bool cols_ok = w.cols() % 256 == 0 || (block32_x8_takes_tail(w.dtype) && w.cols() % 32 == 0);
  return repacked_dtype(w.dtype) != w.dtype && shape_ok && w.is_contiguous() && cols_ok && !w.block_scale && w.device == Device::CPU;
}

namespace {

// Rows of src (a repackable type) into dst (the _X8 form, the same number of bytes); dst may equal src.
void repack_rows(const Tensor& src, void* dst) {
  const int64_t rb = row_bytes(src.dtype, src.cols());
  thread_pool().parallel_for(src.rows(), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* from = src.row_ptr(r);
      uint8_t* to = static_cast<uint8_t*>(dst) + r * rb;
      switch (src.dtype) {
        case DType::Q8_0:
          pack_q8_0_x8(reinterpret_cast<const BlockQ8_0*>(from), reinterpret_cast<BlockQ8_0x8*>(to), src.cols() / QK8_0X8);
          break;
        case DType::Q4_K:
          pack_q4_k_x8(reinterpret_cast<const BlockQ4_K*>(from), reinterpret_cast<BlockQ4_Kx8*>(to), src.cols() / QK_K);
          break;
        case DType::Q6_K:
          pack_q6_k_x8(reinterpret_cast<const BlockQ6_K*>(from), reinterpret_cast<BlockQ6_Kx8*>(to), src.cols() / QK_K);
          break;
        case DType::Q2_K:
          pack_q2_k_x8(reinterpret_cast<const BlockQ2_K*>(from), reinterpret_cast<BlockQ2_Kx8*>(to), src.cols() / QK_K);
          break;
        case DType::Q3_K:
          pack_q3_k_x8(reinterpret_cast<const BlockQ3_K*>(from), reinterpret_cast<BlockQ3_Kx8*>(to), src.cols() / QK_K);
          break;
        case DType::IQ4_XS:
          pack_iq4_xs_x8(reinterpret_cast<const BlockIQ4_XS*>(from), reinterpret_cast<BlockIQ4_XSx8*>(to), src.cols() / QK_K);
          break;
        default: pack_block32_x8_row(src.dtype, from, to, src.cols());
      }
    }
  });
}

}  // namespace

bool repack_in_place(Tensor& w) {
  if (!repackable(w)) return false;
  repack_rows(w, w.data);
  w.dtype = repacked_dtype(w.dtype);
  return true;
}

const Tensor* WeightRepacker::repack(const Tensor* w) {
  if (!f_.repack_weights || !w || !repackable(*w)) return w;
  const auto t0 = std::chrono::steady_clock::now();
  Tensor* entry = nullptr;  // w's entry in the file's tensor table, when w is a whole file tensor
  for (auto& [name, t] : f_.tensors)
    if (&t == w) entry = &t;
  const int64_t bytes = w->nbytes();
  const DType to = repacked_dtype(w->dtype);
  ++by_type_[w->dtype];
  const Tensor* out = nullptr;
  if (entry && f_.weights_writable) {
    repack_in_place(*entry);
    out = entry;
  } else {
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(bytes)]);
    repack_rows(*w, buf.get());
    f_.owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
    new_bytes_ += bytes;
    if (entry) {
      // The mapped pages wholly inside the tensor are no longer read: give them back (they stay
      // in the page cache, re-read from the file if anything touches them again).
      const auto page = static_cast<uintptr_t>(4096), begin = reinterpret_cast<uintptr_t>(entry->data);
      const uintptr_t lo = (begin + page - 1) / page * page, hi = (begin + static_cast<uintptr_t>(bytes)) / page * page;
      if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
      entry->data = buf.get();
      entry->dtype = to;
      out = entry;
    } else {
      auto view = std::make_shared<Tensor>(*w);
      view->data = buf.get();
      view->dtype = to;
      f_.owners.push_back(view);
      out = view.get();
    }
  }
  ++tensors_;
  bytes_ += bytes;
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void WeightRepacker::report() const {
  if (tensors_ == 0) return;
  std::string what;
  for (const auto& [from, count] : by_type_)
    what += std::string(what.empty() ? "" : ", ") + std::to_string(count) + " " + dtype_name(from) + " -> " +
            dtype_name(repacked_dtype(from));
  log_info("repacked ", tensors_, " matmul weights (", what, "; ", static_cast<double>(bytes_) / (1 << 20), " MiB) in ",
           seconds_ * 1000, " ms; ",
           new_bytes_ == 0 ? std::string("in place, no extra memory")
                           : std::to_string(static_cast<double>(new_bytes_) / (1 << 20)) +
                                 " MiB in new buffers (the file is mapped read-only, or these are row slices)");
}

}  // namespace fp
