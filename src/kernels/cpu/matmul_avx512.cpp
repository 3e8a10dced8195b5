// kernels/cpu/matmul_avx512.cpp — F32 / F16 / BF16 weights for a few tokens (decode, batched
// decode: up to 32) on AVX-512F: tiles of 4 rows x 4 tokens read the rows in place, widen 16
// weights to f32 (F16 by vcvtph2ps, BF16 by a shift) and FMA them with each token's 16
// activations, 16 zmm sums. The AVX2 GEMV dots one row with up to 4 tokens (a load of each
// token's activations per FMA), which held F16 at 4 tokens to 6.8 GB/s per core; AVX2's 16
// registers cannot hold a 4 x 4 tile. Beyond 32 tokens the AVX2 panels (or, for BF16 where the
// CPU has it, avx512bf16) take over. Same arithmetic as `ref`: f32 activations and products.
#include <algorithm>
#include <cstring>

#include <immintrin.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its flow analysis reports
// as "may be used uninitialized" once inlined (GCC bug 105593); nothing here is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FP_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

namespace fp {
namespace {

constexpr int64_t kMaxTokens = 32;

// 16 weights of a row from element k as f32.
template <DType T>
FP_AVX512 inline __m512 load16(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + k));
  if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // BF16
}
// The same for the last count < 16 weights (the rest zero).
template <DType T>
FP_AVX512 inline __m512 load16_tail(const uint8_t* row, int64_t k, __mmask16 m) {
  if constexpr (T == DType::F32) return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + k);
  if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One step of 16 weights per row: acc[r][t] += w_r[k..k+16) * x_t[k..k+16) (masked: the first
// bits of m only).
template <DType T, int R, int TT, bool kMasked>
FP_AVX512 inline void fma_step(__m512 (*acc)[TT], const uint8_t* const* rows, const float* x, int64_t ldx, int64_t k,
                               __mmask16 m) {
  __m512 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = kMasked ? load16_tail<T>(rows[r], k, m) : load16<T>(rows[r], k);
  for (int t = 0; t < TT; ++t) {
    const __m512 xv = kMasked ? _mm512_maskz_loadu_ps(m, x + t * ldx + k) : _mm512_loadu_ps(x + t * ldx + k);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
  }
}

// sums[t * R + r] = row r . x_t over K. With fewer than 8 sums the loop takes 32 weights a
// step into two sets of them, so that 8 FMA chains hide the FMA latency (one token's 4 chains
// streamed F16 at 18 GB/s per core, below the AVX2 GEMV's 19).
template <DType T, int R, int TT>
FP_AVX512 void fma_tile(const uint8_t* const* rows, const float* x, int64_t ldx, int64_t K, float* sums) {
  constexpr int64_t E = T == DType::F32 ? 4 : 2;  // bytes per weight
  constexpr int U = R * TT < 8 ? 2 : 1;
  __m512 acc[U][R][TT];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) acc[u][r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= K; k += 16 * U) {
    for (int64_t line = 0; line < 16 * U * E; line += 64)  // every line of each row's stream, 2 KiB ahead
      for (int r = 0; r < R; ++r) cpu::prefetch_stream(rows[r] + k * E + line);
    for (int u = 0; u < U; ++u) fma_step<T, R, TT, false>(acc[u], rows, x, ldx, k + 16 * u, 0);
  }
  for (; k + 16 <= K; k += 16) fma_step<T, R, TT, false>(acc[0], rows, x, ldx, k, 0);
  if (k < K) fma_step<T, R, TT, true>(acc[0], rows, x, ldx, k, static_cast<__mmask16>((1u << (K - k)) - 1));
  alignas(64) float lanes[16];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) {
      __m512 v = acc[0][r][t];
      if constexpr (U == 2) v = _mm512_add_ps(v, acc[U - 1][r][t]);
      _mm512_store_ps(lanes, v);
      float total = 0;
      for (float l : lanes) total += l;
      sums[t * R + r] = total;
    }
}

// One token (decode): 256-bit registers, two sums per row — on Zen 4, whose 512-bit operations
// are two 256-bit halves, widening F16 16 at a time streamed 19 GB/s per core against the
// 256-bit form's 24 (the AVX2 GEMV's shape: each activation load serves R rows).
template <DType T>
FP_AVX512 inline __m256 load8(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
  if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <DType T, int R>
FP_AVX512 void one_token_tile(const uint8_t* const* rows, const float* x, int64_t, int64_t K, float* sums) {
  constexpr int64_t E = T == DType::F32 ? 4 : 2;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (((k * E) & 63) == 0)  // each 64-byte line of each row, 2 KiB ahead
      for (int r = 0; r < R; ++r) cpu::prefetch_stream(rows[r] + k * E);
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(load8<T>(rows[r], k), x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(load8<T>(rows[r], k + 8), x1, acc[r][1]);
    }
  }
  alignas(32) float lanes[8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(lanes, _mm256_add_ps(acc[r][0], acc[r][1]));
    float total = 0;
    for (float l : lanes) total += l;
    for (int64_t kk = k; kk < K; ++kk) {  // the last K % 16 weights
      float w;
      if constexpr (T == DType::F32) w = reinterpret_cast<const float*>(rows[r])[kk];
      else if constexpr (T == DType::F16) w = f16_to_f32(reinterpret_cast<const uint16_t*>(rows[r])[kk]);
      else w = bf16_to_f32(reinterpret_cast<const uint16_t*>(rows[r])[kk]);
      total += w * x[kk];
    }
    sums[r] = total;
  }
}

using Tile = void (*)(const uint8_t* const*, const float*, int64_t, int64_t, float*);
template <DType T, int R>
constexpr Tile kRow[5] = {nullptr, one_token_tile<T, R>, fma_tile<T, R, 2>, fma_tile<T, R, 3>, fma_tile<T, R, 4>};
template <DType T>
constexpr const Tile* kTiles[5] = {nullptr, kRow<T, 1>, kRow<T, 2>, kRow<T, 3>, kRow<T, 4>};

template <DType T>
void run(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols();
  cpu::row_token_tiles(a, [&](int R, int TT, int64_t o, int64_t i, float* sums) {
    const uint8_t* rows[4];
    for (int r = 0; r < R; ++r) rows[r] = w.row_ptr(o + r);
    kTiles<T>[R][TT](rows, a.x + i * K, K, K, sums);
  });
}

void matmul_avx512(const MatMulArgs& a) {
  if (a.n <= 0) return;
  switch (a.w->dtype) {
    case DType::F32: return run<DType::F32>(a);
    case DType::F16: return run<DType::F16>(a);
    default: return run<DType::BF16>(a);
  }
}

std::string refuse_avx512(const MatMulArgs& a) {
  static const std::string cpu = cpu_features().missing({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"});
  if (!cpu.empty()) return cpu;
  const DType t = a.w->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16)
    return std::string("only F32, F16 and BF16 weights (these are ") + dtype_name(t) + ")";
  if (a.w->block_scale) return "block-scaled weights";
  if (!a.w->is_contiguous()) return "non-contiguous weights";
  if (a.n > kMaxTokens) return "beyond 32 tokens the AVX2 panels (the products, not the weight stream, bound a prefill)";
  return {};
}

const bool registered = register_kernel(Kernel<MatMulArgs>{"avx512", Backend::CPU, 150, false, refuse_avx512, matmul_avx512});

}  // namespace
}  // namespace fp
