// kernels/cpu/lora_cpu.cpp — the lora op (LoRA updates of up to three projections sharing their
// input, kernels/ops.h): the plain reference, and an AVX2 kernel that takes one pass over each
// adapter matrix for all the rows of the step. Both run in two phases: low = A x (every part's
// ranks side by side), then y += B low. The AVX2 kernel's first phase works on blocks of 8 rows
// of A, so that each 8 values of x it loads serve 8 dot products, reduced together at the end
// (hsum8x8); its second on blocks of 16 outputs, each a column block of B^T scaled by low's values
// and added, for 4 rows of the step at a time. Each phase is one parallel_for over its blocks.
// Matrices of F16 or BF16 (an adapter file's own dtype) widen to F32 as they load.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

bool lora_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

std::string refuse_shapes(const LoraArgs& a) {
  if (a.n_parts < 1 || a.n_parts > LoraArgs::kMaxParts) return "lora: 1 to 3 parts, got " + std::to_string(a.n_parts);
  const int64_t in = a.parts[0].a->dim(1);
  for (int p = 0; p < a.n_parts; ++p) {
    const LoraArgs::Part& q = a.parts[p];
    if (!lora_dtype(q.a->dtype) || q.bt->dtype != q.a->dtype) return "lora: F32, F16 or BF16 matrices, A and B alike";
    if (q.a->dim(1) != in || q.bt->dim(0) != q.a->dim(0)) return "lora: part shapes do not chain (A [r, in], B^T [r, out])";
  }
  return "";
}

// Element i of a matrix of one of the lora dtypes, as F32.
float element(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    default: return static_cast<const float*>(t.data)[i];
  }
}

// ---- reference: the definition, row by row. (The registry runs a kernel only on a call its
// refuse() accepts: the shapes are checked there, once.)
void lora_ref(const LoraArgs& a) {
  const int64_t in = a.parts[0].a->dim(1), width = a.low_width();
  for (int64_t i = 0; i < a.n; ++i) {
    const float* x = a.x + i * in;
    float* low = a.low + i * width;
    int64_t off = 0;
    for (int p = 0; p < a.n_parts; ++p) {
      const LoraArgs::Part& q = a.parts[p];
      const int64_t rank = q.a->dim(0), out = q.bt->dim(1);
      for (int64_t j = 0; j < rank; ++j) {
        float s = 0;
        for (int64_t c = 0; c < in; ++c) s += element(*q.a, j * in + c) * x[c];
        low[off + j] = q.scale * s;
      }
      for (int64_t o = 0; o < out; ++o) {
        float s = 0;
        for (int64_t j = 0; j < rank; ++j) s += element(*q.bt, j * out + o) * low[off + j];
        q.y[i * out + o] += s;
      }
      off += rank;
    }
  }
}

// ---- AVX2

using namespace avx2;

// The sums of v[0..7]'s lanes, as one vector (element k: the sum of v[k]).
FP_AVX2_INLINE __m256 hsum8x8(const __m256* v) {
  const __m256 s01 = _mm256_hadd_ps(v[0], v[1]), s23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 s45 = _mm256_hadd_ps(v[4], v[5]), s67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Elements [k, k + count) of a matrix as F32 lanes, zero past count (count <= 8).
template <DType T>
FP_AVX2_INLINE __m256 load8_tail(const void* base, int64_t k, int64_t count) {
  if constexpr (T == DType::F32) {
    return _mm256_maskload_ps(static_cast<const float*>(base) + k, tail_mask(count));
  } else {
    alignas(16) uint16_t part[8] = {};
    std::memcpy(part, static_cast<const uint16_t*>(base) + k, static_cast<size_t>(count) * sizeof(uint16_t));
    return load8<T>(part, 0);
  }
}

// out[k] = m[k] . v for the `rows` (<= 8) rows of m starting at element m0 (rows `ld` elements
// apart), each of length len.
template <DType T>
FP_AVX2 void dot_rows8(const void* m, int64_t m0, int64_t ld, int64_t rows, const float* v, int64_t len, float* out) {
  __m256 acc[8];
  for (auto& r : acc) r = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= len; c += 8) {
    const __m256 x = _mm256_loadu_ps(v + c);
    for (int64_t k = 0; k < rows; ++k) acc[k] = _mm256_fmadd_ps(load8<T>(m, m0 + k * ld + c), x, acc[k]);
  }
  if (c < len) {
    const __m256 x = _mm256_maskload_ps(v + c, tail_mask(len - c));
    for (int64_t k = 0; k < rows; ++k) acc[k] = _mm256_fmadd_ps(load8_tail<T>(m, m0 + k * ld + c, len - c), x, acc[k]);
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, hsum8x8(acc));
  std::copy(sums, sums + rows, out);
}

// Blocks over the parts' matrices (8 rows of A for phase 1, 16 outputs of B for phase 2): block
// index -> part and first row.
struct Blocks {
  int64_t size;
  int64_t first[LoraArgs::kMaxParts + 1] = {};  // the parts' first block
  Blocks(const LoraArgs& a, bool of_b) : size(of_b ? 16 : 8) {
    for (int p = 0; p < a.n_parts; ++p) {
      const int64_t rows = of_b ? a.parts[p].bt->dim(1) : a.parts[p].a->dim(0);
      first[p + 1] = first[p] + (rows + size - 1) / size;
    }
  }
  int part_of(int64_t block, int n_parts) const {
    int p = 0;
    while (p + 1 < n_parts && block >= first[p + 1]) ++p;
    return p;
  }
};

// y[i, o0..o0+16) += sum_j low[i * width + j] * bt[j, o0..o0+16) for the n rows i, 4 rows at a
// time so that each load of bt serves four. kMasked: the block ends the row (cols < 16 outputs).
template <DType T, bool kMasked>
FP_AVX2_INLINE void add_low_times_bt16(const void* bt, int64_t o0, int64_t rank, int64_t out, const float* low,
                                       int64_t width, int64_t n, float* y0, int64_t cols) {
  const int64_t n0 = std::min<int64_t>(cols, 8), n1 = std::max<int64_t>(cols - 8, 0);
  const __m256i m0 = tail_mask(n0), m1 = tail_mask(n1);
  auto load_b = [&](int64_t j, int half) FP_AVX2_INLINE_LAMBDA {
    const int64_t k = j * out + o0 + 8 * half;
    return kMasked ? load8_tail<T>(bt, k, half ? n1 : n0) : load8<T>(bt, k);
  };
  auto load = [&](const float* p, int half) FP_AVX2_INLINE_LAMBDA {
    return kMasked ? _mm256_maskload_ps(p + 8 * half, half ? m1 : m0) : _mm256_loadu_ps(p + 8 * half);
  };
  auto store = [&](float* p, int half, __m256 v) FP_AVX2_INLINE_LAMBDA {
    if (kMasked) _mm256_maskstore_ps(p + 8 * half, half ? m1 : m0, v);
    else _mm256_storeu_ps(p + 8 * half, v);
  };
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    float* y = y0 + i * out;
    __m256 acc[4][2];
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) acc[r][h] = load(y + r * out, h);
    for (int64_t j = 0; j < rank; ++j) {
      const __m256 b0 = load_b(j, 0), b1 = load_b(j, 1);
      for (int r = 0; r < 4; ++r) {
        const __m256 l = _mm256_broadcast_ss(low + (i + r) * width + j);
        acc[r][0] = _mm256_fmadd_ps(l, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(l, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) store(y + r * out, h, acc[r][h]);
  }
  for (; i < n; ++i) {
    float* y = y0 + i * out;
    __m256 a0 = load(y, 0), a1 = load(y, 1);
    for (int64_t j = 0; j < rank; ++j) {
      const __m256 l = _mm256_broadcast_ss(low + i * width + j);
      a0 = _mm256_fmadd_ps(l, load_b(j, 0), a0);
      a1 = _mm256_fmadd_ps(l, load_b(j, 1), a1);
    }
    store(y, 0, a0);
    store(y, 1, a1);
  }
}

// Phase 1 for one block: low[i, off + j0 + k] = scale * A[j0 + k] . x[i], k < rows (<= 8).
template <DType T>
FP_AVX2 void low_block(const LoraArgs& a, const LoraArgs::Part& q, int64_t off, int64_t width, int64_t j0, int64_t rows) {
  const int64_t in = q.a->dim(1);
  float sums[8];
  for (int64_t i = 0; i < a.n; ++i) {
    dot_rows8<T>(q.a->data, j0 * in, in, rows, a.x + i * in, in, sums);
    float* low = a.low + i * width + off + j0;
    for (int64_t k = 0; k < rows; ++k) low[k] = q.scale * sums[k];
  }
}

// Phase 2 for one block of 16 outputs from o0.
template <DType T>
FP_AVX2 void add_block(const LoraArgs::Part& q, const float* low, int64_t width, int64_t n, int64_t o0) {
  const int64_t rank = q.bt->dim(0), out = q.bt->dim(1), cols = std::min<int64_t>(16, out - o0);
  if (cols == 16) add_low_times_bt16<T, false>(q.bt->data, o0, rank, out, low, width, n, q.y + o0, cols);
  else add_low_times_bt16<T, true>(q.bt->data, o0, rank, out, low, width, n, q.y + o0, cols);
}

void lora_avx2(const LoraArgs& a) {
  if (a.n <= 0) return;
  const int64_t in = a.parts[0].a->dim(1), width = a.low_width();
  int64_t offset[LoraArgs::kMaxParts] = {};
  for (int p = 1; p < a.n_parts; ++p) offset[p] = offset[p - 1] + a.parts[p - 1].a->dim(0);
  // Work per block: 8 rows of a matrix against every row of the step. Enough blocks per chunk
  // that a chunk is worth waking a worker for (~32K multiply-adds).
  auto grain = [&](int64_t len) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 8 * len * a.n)); };

  // Phase 1: low[i, offset_p + j] = scale_p A_p[j] . x[i].
  const Blocks ab(a, false);
  thread_pool().parallel_for(ab.first[a.n_parts], grain(in), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int p = ab.part_of(blk, a.n_parts);
      const LoraArgs::Part& q = a.parts[p];
      const int64_t j0 = (blk - ab.first[p]) * 8, rows = std::min<int64_t>(8, q.a->dim(0) - j0);
      switch (q.a->dtype) {
        case DType::F16: low_block<DType::F16>(a, q, offset[p], width, j0, rows); break;
        case DType::BF16: low_block<DType::BF16>(a, q, offset[p], width, j0, rows); break;
        default: low_block<DType::F32>(a, q, offset[p], width, j0, rows); break;
      }
    }
  });

  // Phase 2: y_p[i, o..o+16) += sum_j low[i, offset_p + j] * B^T_p[j, o..o+16).
  const Blocks bb(a, true);
  int64_t max_rank = 0;
  for (int p = 0; p < a.n_parts; ++p) max_rank = std::max(max_rank, a.parts[p].a->dim(0));
  thread_pool().parallel_for(bb.first[a.n_parts], grain(2 * max_rank), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int p = bb.part_of(blk, a.n_parts);
      const LoraArgs::Part& q = a.parts[p];
      const float* low = a.low + offset[p];
      const int64_t o0 = (blk - bb.first[p]) * bb.size;
      switch (q.bt->dtype) {
        case DType::F16: add_block<DType::F16>(q, low, width, a.n, o0); break;
        case DType::BF16: add_block<DType::BF16>(q, low, width, a.n, o0); break;
        default: add_block<DType::F32>(q, low, width, a.n, o0); break;
      }
    }
  });
}

Kernel<LoraArgs> lora_kernel(const char* name, int priority, bool reference, void (*run)(const LoraArgs&),
                             std::string (*refuse)(const LoraArgs&)) {
  Kernel<LoraArgs> k;
  k.name = name;
  k.backend = Backend::CPU;
  k.priority = priority;
  k.reference = reference;
  k.refuse = refuse;
  k.run = run;
  return k;
}

std::string refuse_avx2(const LoraArgs& a) {
  static const std::string cpu = cpu_features().missing({"avx2", "fma"});
  return cpu.empty() ? refuse_shapes(a) : cpu;
}

const bool registered = register_kernel(lora_kernel("ref", 0, true, lora_ref, refuse_shapes)) &&
                        register_kernel(lora_kernel("avx2", 100, false, lora_avx2, refuse_avx2));

}  // namespace
}  // namespace fp
