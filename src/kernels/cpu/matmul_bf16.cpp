// kernels/cpu/matmul_bf16.cpp — BF16 weights' prefill GEMM on AVX512-BF16 (Zen 4 and later,
// Cooper Lake, Sapphire Rapids): vdpbf16ps multiplies 16 pairs of BF16 values and adds both
// products to 16 f32 lanes, twice the f32 FMA rate, so the activations are rounded to BF16
// once per call (as llama.cpp's BF16 path does; `ref_bf16act` is the reference that rounds the
// same way). Decode (<= 4 tokens) is left to the AVX2 GEMV: it is bound by the weight stream,
// and keeps f32 activations.
//
// Layout: a panel is 32 weight rows x a K chunk, packed as [pair p][row r] 32-bit words (the
// two BF16 values of row r at columns 2p, 2p+1), so one zmm load holds 16 rows' pair p. The
// micro-kernel keeps 8 tokens x 32 rows of f32 sums in 16 zmm registers; per pair it loads the
// panel's two vectors and multiplies each with every token's pair broadcast from memory.
#include <algorithm>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

#define FP_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace fp {
namespace {

constexpr int64_t kNR = 32;      // weight rows per panel
constexpr int64_t kMR = 8;       // tokens per micro-kernel call
constexpr int64_t kKC = 512;     // K chunk, in columns (even)
constexpr int64_t kPanels = 4;   // panels packed together per K chunk (64 KiB of L2)
constexpr int64_t kFewTokens = 32;  // up to this many tokens: dot products on the rows in place, no packing

FP_BF16 inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
FP_BF16 inline __m512i as_si(__m512bh v) { return (__m512i)v; }

// One row of K activations to BF16 (round to nearest even, subnormals to zero), into dst.
FP_BF16 void round_row(const float* x, int64_t K, uint16_t* dst) {
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(dst + k, as_si(v));
  }
  for (; k < K; ++k) dst[k] = f32_to_bf16_daz(x[k]);
}

// x [n, K] f32 -> [n, Kp] BF16 pairs (Kp = K rounded up to even, the pad a zero).
void round_activations(const float* x, int64_t n, int64_t K, std::vector<uint32_t>& out) {
  const int64_t words = (K + 1) / 2;
  out.assign(static_cast<size_t>(n * words), 0);
  thread_pool().parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) round_row(x + i * K, K, reinterpret_cast<uint16_t*>(out.data() + i * words));
  });
}

// Rows [o0, o0 + rows) x columns [k0, k0 + kc) of the BF16 matrix w ([out][K]) packed as
// dst[p * 32 + r] = (w[o0 + r][k0 + 2p], w[o0 + r][k0 + 2p + 1]); missing rows and the pad
// column of an odd K are zero.
void pack_panel(const uint16_t* w, int64_t K, int64_t o0, int64_t rows, int64_t k0, int64_t kc, uint32_t* dst) {
  const int64_t pairs = (kc + 1) / 2;
  std::memset(dst, 0, static_cast<size_t>(pairs * kNR) * 4);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = w + (o0 + r) * K + k0;
    if (K % 2 == 0) {  // rows start on a 4-byte boundary: copy pairs as words
      uint32_t word;
      for (int64_t p = 0; p < kc / 2; ++p) {
        std::memcpy(&word, row + 2 * p, 4);
        dst[p * kNR + r] = word;
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) reinterpret_cast<uint16_t*>(dst + (k / 2) * kNR + r)[k % 2] = row[k];
    }
  }
}

// y[t][0..cols) (+)= sum over the chunk's pairs of x[t] . panel, for MR tokens.
template <int MR>
FP_BF16 void micro_kernel(const uint32_t* x, int64_t ldx, const uint32_t* pack, int64_t pairs, float* y, int64_t ldy,
                          int64_t cols, bool first, const float* bias) {
  __m512 lo[MR], hi[MR];
  for (int t = 0; t < MR; ++t) lo[t] = hi[t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = as_bh(_mm512_loadu_si512(pack + p * kNR));
    const __m512bh b1 = as_bh(_mm512_loadu_si512(pack + p * kNR + 16));
    for (int t = 0; t < MR; ++t) {
      const __m512bh a = as_bh(_mm512_set1_epi32(static_cast<int>(x[t * ldx + p])));
      lo[t] = _mm512_dpbf16_ps(lo[t], a, b0);
      hi[t] = _mm512_dpbf16_ps(hi[t], a, b1);
    }
  }
  alignas(64) float tmp[kNR];
  for (int t = 0; t < MR; ++t) {
    float* yr = y + t * ldy;
    _mm512_store_ps(tmp, lo[t]);
    _mm512_store_ps(tmp + 16, hi[t]);
    if (first) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = tmp[c] + (bias ? bias[c] : 0.0f);
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] += tmp[c];
    }
  }
}

using MicroKernel = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, int64_t, bool, const float*);
constexpr MicroKernel kMicro[kMR + 1] = {nullptr,          micro_kernel<1>, micro_kernel<2>, micro_kernel<3>, micro_kernel<4>,
                                         micro_kernel<5>, micro_kernel<6>, micro_kernel<7>, micro_kernel<8>};

// ---- a few tokens (batched decode, an MoE expert's share of a prefill): dot products ----
// sums[t * R + r] = w_r . x_t over K, the rows read in place (no packing) 32 values at a time,
// each weight vector serving T tokens and each activation vector R rows. The tail of K is a
// masked load of both.
template <int R, int T>
FP_BF16 void dot_tile(const uint16_t* const* rows, const uint16_t* x, int64_t ldx, int64_t K, float* sums) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if ((k & 511) == 0)  // each row's stream 2 KiB ahead (the hardware prefetchers lag a kernel that computes)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + k) + 2048, _MM_HINT_T0);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = as_bh(_mm512_loadu_si512(rows[r] + k));
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(x + t * ldx + k));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  if (k < K) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = as_bh(_mm512_maskz_loadu_epi16(m, rows[r] + k));
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_maskz_loadu_epi16(m, x + t * ldx + k));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  alignas(64) float lanes[16];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      _mm512_store_ps(lanes, acc[r][t]);
      float v = 0;
      for (float l : lanes) v += l;
      sums[t * R + r] = v;
    }
}

using DotTile = void (*)(const uint16_t* const*, const uint16_t*, int64_t, int64_t, float*);
template <int R>
constexpr DotTile kDotRow[5] = {nullptr, dot_tile<R, 1>, dot_tile<R, 2>, dot_tile<R, 3>, dot_tile<R, 4>};
constexpr const DotTile* kDot[5] = {nullptr, kDotRow<1>, kDotRow<2>, kDotRow<3>, kDotRow<4>};

// Rows split across threads, in blocks that stay in L2 while every group of 4 tokens passes.
void matmul_bf16_few(const MatMulArgs& a, const std::vector<uint32_t>& xb, int64_t words) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), ldx = 2 * words;
  const auto* x = reinterpret_cast<const uint16_t*>(xb.data());
  thread_pool().parallel_for(out, 32, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += cpu::kRowBlock) {
      const int64_t re = std::min(r1, rb + cpu::kRowBlock);
      for (int64_t i = 0; i < a.n; i += 4) {
        const int T = static_cast<int>(std::min<int64_t>(4, a.n - i));
        for (int64_t o = rb; o < re; o += 4) {
          const int R = static_cast<int>(std::min<int64_t>(4, re - o));
          const uint16_t* rows[4];
          for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint16_t*>(w.data) + (o + r) * K;
          float sums[16];
          kDot[R][T](rows, x + i * ldx, ldx, K, sums);
          for (int t = 0; t < T; ++t)
            for (int r = 0; r < R; ++r) a.y[(i + t) * out + o + r] = sums[t * R + r] + (a.bias ? a.bias[o + r] : 0.0f);
        }
      }
    }
  });
}

void matmul_bf16(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), words = (K + 1) / 2;
  std::vector<uint32_t> xb;
  round_activations(a.x, a.n, K, xb);
  if (a.n <= kFewTokens) return matmul_bf16_few(a, xb, words);
  const auto* wd = static_cast<const uint16_t*>(w.data);
  const int64_t group_rows = kNR * kPanels, groups = (out + group_rows - 1) / group_rows;
  thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<uint32_t> pack(static_cast<size_t>(kPanels * (kKC / 2) * kNR));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o_begin = g * group_rows, o_end = std::min(out, o_begin + group_rows);
      const int64_t panels = (o_end - o_begin + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t kc = std::min(kKC, K - k0), pairs = (kc + 1) / 2;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t o0 = o_begin + p * kNR;
          pack_panel(wd, K, o0, std::min(kNR, o_end - o0), k0, kc, pack.data() + p * (kKC / 2) * kNR);
        }
        for (int64_t i0 = 0; i0 < a.n; i0 += kMR) {
          const int64_t mr = std::min(kMR, a.n - i0);
          for (int64_t p = 0; p < panels; ++p) {
            const int64_t o0 = o_begin + p * kNR;
            kMicro[mr](xb.data() + i0 * words + k0 / 2, words, pack.data() + p * (kKC / 2) * kNR, pairs, a.y + i0 * out + o0,
                       out, std::min(kNR, o_end - o0), k0 == 0, a.bias ? a.bias + o0 : nullptr);
          }
        }
      }
    }
  });
}

std::string refuse_bf16(const MatMulArgs& a) {
  std::string cpu = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"});
  if (!cpu.empty()) return cpu;
  if (a.w->dtype != DType::BF16) return std::string("only BF16 weights (these are ") + dtype_name(a.w->dtype) + ")";
  if (a.w->block_scale) return "block-scaled weights";
  if (!a.w->is_contiguous()) return "non-contiguous weights";
  if (a.n <= cpu::kGemvMaxTokens)
    return "decode (<= 4 tokens) is bound by the weight stream: the AVX2 GEMV reads it, with f32 activations";
  return {};
}

const bool registered = register_kernel(Kernel<MatMulArgs>{"avx512bf16", Backend::CPU, 210, false, refuse_bf16, matmul_bf16});

}  // namespace
}  // namespace fp
