// kernels/cpu/moe_gemv.h — many small GEMVs in one parallel region. Decode of an MoE layer or
// of MLA's per-head projections is dozens of matrix-vector products of a few hundred KB to a few
// MB each; dispatched one by one, each pays a thread wake-up (milliseconds on a busy machine).
// Here every job's rows are cut into blocks and the blocks of all jobs are shared out at once.
// F32/F16/BF16/Q8_0 weights without block scales, and Q8_0_X8 (experts repacked at load) on CPUs
// with VNNI; callers fall back to matmul otherwise.
// Q8_0 rows take f32 activations, or (run's int8_q8_0, on CPUs with VNNI) activations quantized
// to Q8_0 blocks and vpdpbusd as the matmul kernels do; either way the weights are prefetched 2 KiB
// ahead (cpu::prefetch_stream) as the decode GEMVs do. Before both, one core streamed ~3.4 GB/s of
// Q8_0 experts (widening each weight to f32, no prefetch); bench/RESULTS.md, twenty-ninth session.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cpu_features.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/matmul_interleave.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/simd_avx2.h"

namespace fp::moe_gemv {

// Dot product of a float-like weight row (dtype T) with x, n values (n % 8 == 0).
template <DType T>
FP_AVX2_INLINE float dot_row(const void* row, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    s0 = _mm256_fmadd_ps(avx2::load8<T>(row, k), _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(avx2::load8<T>(row, k + 8), _mm256_loadu_ps(x + k + 8), s1);
  }
  for (; k < n; k += 8) s0 = _mm256_fmadd_ps(avx2::load8<T>(row, k), _mm256_loadu_ps(x + k), s0);
  return avx2::hsum(_mm256_add_ps(s0, s1));
}

// Q8_0 rows: each block's 32 int8 widened to f32 and dotted with x, times the block scale
// (f32 activations: closer to the reference than ggml's 8-bit activation rounding).
FP_AVX2 inline float dot_q8_0(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 32, ++b) {
    cpu::prefetch_stream(b);
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16));
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(x + k));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(x + k + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(x + k + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(x + k + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b->d)), s, acc);
  }
  return avx2::hsum(acc);
}

FP_AVX2 inline float dot(const Tensor& w, int64_t r, const float* x) {
  const int64_t n = w.cols();
  const uint8_t* row = w.row_ptr(r);
  switch (w.dtype) {
    case DType::Q8_0: return dot_q8_0(row, x, n);
    case DType::F16: return dot_row<DType::F16>(row, x, n);
    case DType::BF16: return dot_row<DType::BF16>(row, x, n);
    default: return dot_row<DType::F32>(row, x, n);
  }
}

// A Q8_0 row against activations in Q8_0 blocks (n / 32 blocks): |w| as vpdpbusd's unsigned
// operand, x with w's sign, each block's int32 sum scaled by both block scales; four
// accumulators (one chain of dependent FMAs per block would cap a core, as in matmul_vnni.cpp).
// Defined twice: EVEX vpdpbusd (AVX-512 VNNI) and VEX (AVX-VNNI, client CPUs without AVX-512).
#define FP_MOE_DOT_Q8_0_INT8(NAME, TARGET, DPBUSD)                                                        \
  __attribute__((target(TARGET))) inline __m256 NAME##_block(const BlockQ8_0& w, const BlockQ8_0& x, __m256 acc) { \
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));                       \
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));                       \
    const __m256i dot = DPBUSD(_mm256_setzero_si256(), _mm256_abs_epi8(wq), _mm256_sign_epi8(xv, wq));    \
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(_cvtsh_ss(w.d) * _cvtsh_ss(x.d)), acc); \
  }                                                                                                       \
  __attribute__((target(TARGET))) inline float NAME(const void* row, const BlockQ8_0* xq, int64_t nb) {  \
    const auto* wb = static_cast<const BlockQ8_0*>(row);                                                  \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                           \
    int64_t b = 0;                                                                                        \
    for (; b + 4 <= nb; b += 4) {                                                                         \
      cpu::prefetch_stream(wb + b);                                                                       \
      cpu::prefetch_stream(reinterpret_cast<const char*>(wb + b) + 64);                                   \
      a0 = NAME##_block(wb[b], xq[b], a0);                                                                \
      a1 = NAME##_block(wb[b + 1], xq[b + 1], a1);                                                        \
      a2 = NAME##_block(wb[b + 2], xq[b + 2], a2);                                                        \
      a3 = NAME##_block(wb[b + 3], xq[b + 3], a3);                                                        \
    }                                                                                                     \
    for (; b < nb; ++b) a0 = NAME##_block(wb[b], xq[b], a0);                                              \
    return avx2::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));                      \
  }
FP_MOE_DOT_Q8_0_INT8(dot_q8_0_avx512vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", _mm256_dpbusd_epi32)
FP_MOE_DOT_Q8_0_INT8(dot_q8_0_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)
#undef FP_MOE_DOT_Q8_0_INT8

// A Q8_0_X8 row (repacked at load: groups of 8 blocks, w + 128 interleaved, core/dtype.h) against
// activations packed for it (cpu::PackedX: signed x, init = -128 x sum(x) per block): 8 vpdpbusd
// per group leave block j's dot product in lane j, scaled by both block scales at once.
#define FP_MOE_DOT_Q8_0_X8(NAME, TARGET, DPBUSD)                                                              \
  __attribute__((target(TARGET))) inline float NAME(const void* row, const cpu::PackedX* x, int64_t groups) { \
    const auto* wg = static_cast<const BlockQ8_0x8*>(row);                                                    \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;                                                                 \
    for (int64_t g = 0; g < groups; ++g) {                                                                    \
      for (int l = 0; l < 272; l += 64) cpu::prefetch_stream(reinterpret_cast<const char*>(wg + g) + l);     \
      __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[g].init));                           \
      for (int c = 0; c < 8; ++c)                                                                             \
        s = DPBUSD(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg[g].qs + 32 * c)),                \
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[g].q + 32 * c)));                    \
      const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg[g].d))), \
                                     _mm256_loadu_ps(x[g].d));                                                \
      if (g & 1) a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a1);                                          \
      else a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a0);                                                \
    }                                                                                                         \
    return avx2::hsum(_mm256_add_ps(a0, a1));                                                                 \
  }
FP_MOE_DOT_Q8_0_X8(dot_q8_0_x8_avx512vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", _mm256_dpbusd_epi32)
FP_MOE_DOT_Q8_0_X8(dot_q8_0_x8_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)
#undef FP_MOE_DOT_Q8_0_X8

// A BF16 row against x rounded to BF16 (as the BF16 matmul kernels round it), on CPUs with
// AVX512-BF16: vdpbf16ps over 32 pairs a step, two accumulators, the tail masked (n % 8 == 0).
// Widening each weight to f32 instead capped 2 threads at ~16 GB/s where `grouped` (through the
// BF16 matmul's vdpbf16ps) reached ~20 (bench/RESULTS.md, twenty-ninth session).
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16"))) inline float dot_bf16_dpbf16(
    const void* row, const uint16_t* x, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t k = 0;
  for (; k + 64 <= n; k += 64) {
    cpu::prefetch_stream(w + k);  // 128 bytes a pass: two lines
    cpu::prefetch_stream(w + k + 32);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
    a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32), (__m512bh)_mm512_loadu_si512(x + k + 32));
  }
  for (; k < n; k += 32) {
    const int64_t left = n - k;
    const auto m = left >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((uint64_t{1} << left) - 1);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, w + k), (__m512bh)_mm512_maskz_loadu_epi16(m, x + k));
  }
  alignas(64) float lanes[16];  // (GCC 12 warns inside _mm512_reduce_add_ps and the 256-bit extracts)
  _mm512_store_ps(lanes, _mm512_add_ps(a0, a1));
  return avx2::hsum(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
}
inline bool has_dpbf16() {
  static const bool ok = cpu_features().missing({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"}).empty();
  return ok;
}

// Which integer dot this CPU has for Q8_0 rows: 2 AVX-512 VNNI, 1 AVX-VNNI, 0 none.
inline int int8_dot_level() {
  static const int level = cpu_features().missing({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"}).empty() ? 2
                           : cpu_features().missing({"avx2", "fma", "f16c", "avx_vnni"}).empty()                                   ? 1
                                                                                                                                   : 0;
  return level;
}

// "" when w can be used here.
inline std::string refuse(const Tensor& w) {
  if (w.dtype == DType::Q8_0_X8 && int8_dot_level() == 0) return "Q8_0_X8 weights need VNNI (AVX-512 VNNI or AVX-VNNI)";
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16 && w.dtype != DType::Q8_0 &&
      w.dtype != DType::Q8_0_X8)
    return std::string("weights are ") + dtype_name(w.dtype) + " (this path takes F32/F16/BF16/Q8_0/Q8_0_X8)";
  if (w.block_scale) return "block-scaled weights";
  if (w.cols() % (w.dtype == DType::Q8_0 ? 32 : 8)) return "rows of " + std::to_string(w.cols()) + " values (needs a multiple of 8, Q8_0 of 32)";
  return {};
}

// One matrix-vector product: y = w x.
struct Job {
  const Tensor* w;
  const float* x;
  float* y;
};

// The distinct activation rows of the jobs on `dtype` weights, each laid out once in buf by
// fill(x, cols, dst) as cols / per units; at[j]: job j's first unit (-1 for the other jobs).
template <class Unit, class Fill>
const Unit* distinct_activations(const std::vector<Job>& jobs, DType dtype, int64_t per, std::vector<Unit>& buf,
                                 std::vector<int64_t>& at, Fill fill) {
  std::unordered_map<const float*, int64_t> seen;  // x -> its first unit
  std::vector<size_t> first_use;                    // the jobs that bring a new x
  int64_t units = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].w->dtype != dtype) continue;
    auto [it, added] = seen.emplace(jobs[j].x, units);
    if (added) units += jobs[j].w->cols() / per, first_use.push_back(j);
    at[j] = it->second;
  }
  if (static_cast<int64_t>(buf.size()) < units) buf.resize(static_cast<size_t>(units));
  for (size_t j : first_use) fill(jobs[j].x, jobs[j].w->cols(), buf.data() + at[j]);
  return buf.data();
}

// y_j = W_j x_j for every job, in one parallel region over blocks of `block` rows. Jobs on the
// same weight (an expert two tokens chose, the shared expert of every token, an MLA head's
// matrix for each token) are run together: each row of W is dotted with all their x while it is
// in L1, so a weight is read from memory once per call however many tokens use it. With
// rounded_x, x is rounded as the matmul kernels round it where the CPU has their instructions:
// Q8_0 jobs read it quantized to Q8_0 blocks (VNNI), BF16 jobs rounded to BF16 (AVX512-BF16),
// each distinct x once, before the region. Q8_0_X8 jobs (refuse() lets them in only with VNNI)
// always read their x packed for the interleaved groups (cpu::PackedX), likewise once per x.
inline void run(const std::vector<Job>& jobs, int64_t block = 16, bool rounded_x = false) {
  // The jobs of each weight, listed under its first job (`members`); the others get no blocks.
  std::vector<std::vector<size_t>> members(jobs.size());
  {
    std::unordered_map<const Tensor*, size_t> lead;
    for (size_t j = 0; j < jobs.size(); ++j) members[lead.emplace(jobs[j].w, j).first->second].push_back(j);
  }
  std::vector<int64_t> first(jobs.size() + 1, 0);  // first block of each job
  for (size_t j = 0; j < jobs.size(); ++j)
    first[j + 1] = first[j] + (members[j].empty() ? 0 : (jobs[j].w->rows() + block - 1) / block);
  // The activations in the integer kernels' forms, on the calling thread (thread_local buffers:
  // the workers read them through these pointers).
  const int level = rounded_x ? int8_dot_level() : 0, x8_level = int8_dot_level();
  static thread_local std::vector<BlockQ8_0> xq;     // Q8_0 jobs' x quantized (with rounded_x)
  static thread_local std::vector<cpu::PackedX> xp;  // Q8_0_X8 jobs' x packed for the interleaved groups
  std::vector<int64_t> xq_at(jobs.size(), -1), xp_at(jobs.size(), -1);
  const cpu::PackedX* xp_all = distinct_activations(jobs, DType::Q8_0_X8, 256, xp, xp_at, [](const float* x, int64_t k, cpu::PackedX* d) {
    cpu::pack_activations(DType::Q8_0_X8, x, nullptr, k, d);
  });
  static thread_local std::vector<uint16_t> xb;     // BF16 jobs' x rounded to BF16 (with rounded_x)
  std::vector<int64_t> xb_at(jobs.size(), -1);
  const uint16_t* xb_all = nullptr;
  if (rounded_x && has_dpbf16())
    xb_all = distinct_activations(jobs, DType::BF16, 1, xb, xb_at, [](const float* x, int64_t k, uint16_t* d) {
      for (int64_t i = 0; i < k; ++i) d[i] = f32_to_bf16_daz(x[i]);
    });
  const BlockQ8_0* xq_all = nullptr;
  if (level > 0)
    xq_all = distinct_activations(jobs, DType::Q8_0, 32, xq, xq_at,
                                  [](const float* x, int64_t k, BlockQ8_0* d) { quantize_act_q8_0(x, d, k); });
  // The integer dots this CPU runs (AVX-512 VNNI or AVX-VNNI), chosen once.
  const auto dot_x8 = x8_level == 2 ? dot_q8_0_x8_avx512vnni : dot_q8_0_x8_avxvnni;
  const auto dot_q8 = level == 2 ? dot_q8_0_avx512vnni : dot_q8_0_avxvnni;
  thread_pool().parallel_for(first.back(), 1, [&](int64_t b0, int64_t b1) {
    size_t j = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin()) - 1;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[j + 1]) ++j;
      const Tensor& w = *jobs[j].w;
      const int64_t r0 = (b - first[j]) * block, r1 = std::min(w.rows(), r0 + block);
      for (int64_t r = r0; r < r1; ++r)
        for (size_t m : members[j]) {  // the same form of x for all of them (one weight, one dtype)
          const Job& job = jobs[m];
          if (xp_at[m] >= 0) job.y[r] = dot_x8(w.row_ptr(r), xp_all + xp_at[m], w.cols() / 256);
          else if (xb_at[m] >= 0) job.y[r] = dot_bf16_dpbf16(w.row_ptr(r), xb_all + xb_at[m], w.cols());
          else if (xq_at[m] >= 0) job.y[r] = dot_q8(w.row_ptr(r), xq_all + xq_at[m], w.cols() / 32);
          else job.y[r] = dot(w, r, job.x);
        }
    }
  });
}

}  // namespace fp::moe_gemv
