// kernels/cpu/matmul_vnni.cpp — Q8_0, Q4_0, the _X8 forms (and Q4_K, Q6_K, ... prefill) matmul with AVX-512 VNNI (vpdpbusd on 256-bit
// registers, AVX512-VL), every batch size; the same code for AVX-VNNI (matmul_avxvnni.cpp). vpdpbusd multiplies unsigned by signed bytes and
// accumulates in int32 without saturation (no int16 pair sums as AVX2's vpmaddubsw):
//  - Q8_0 decode (signed weights): |w| times x with w's sign (vpsignb), two cheap ops per block.
//    The prefill tiles instead offset the activations to unsigned (x + 128) and subtract the
//    offset's share, 128 x sum(w), through the accumulator's start (computed when packing).
//  - Q8_0_X8 (repacked at load: w + 128, interleaved): the unsigned weights meet the signed
//    activations; the accumulator starts at -128 x sum(x). One tile kernel at every batch size.
//  - Q4_0 (weights q - 8, q in 0..15): the unsigned q meets the signed activations directly;
//    the -8 x sum(x) term starts the accumulator (sum(x) per block is computed once per call).
//  - Q4_K_X8 / Q6_K_X8 / Q3_K_X8 / Q4_0_X8 ... Q5_1_X8 (repacked at load) decode: one vpdpbusd per chunk
//    leaves (sub-)block j's dot product in lane j; their prefill, and Q4_K's / Q6_K's, run the interleaved tiles, as
//    Q4_1 / Q5_0 / Q5_1 / Q5_K prefill (the Q4 tiles) and Q3_K prefill (the Q6 tiles) do.
//  - IQ4_NL_X8 / IQ4_XS_X8 / MXFP4_X8 (repacked at load): nibbles looked up as level + 128 (MXFP4's + 12,
//    avx2::x8_levels) by vpshufb, then as Q8_0_X8 (activations' init -offset x sum(x)); decode row
//    kernel, prefill the unsigned-weight tiles.
//    Q4_0_X8, IQ4_NL_X8 and MXFP4_X8 rows may end in a partial group (Gemma 3 1B's 1152 values, gpt-oss's
//    2880): read with masked loads as one zero-padded group (avx2::tail_group).
//  - IQ4_NL / MXFP4 in the file layout: prefill on the same tiles, a row's last group zero-padded.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/matmul_interleave.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

// This file is compiled twice: as itself, the AVX-512 VNNI kernel ("avx512vnni": vpdpbusd with the
// EVEX encoding on 256-bit registers), and included by matmul_avxvnni.cpp with the macros below
// defined for AVX-VNNI ("avxvnni": the same instruction, VEX-encoded, on CPUs without AVX-512 such
// as Intel's Alder Lake and later client cores). Nothing here uses more than 256-bit registers.
#ifndef FP_VNNI
#define FP_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define FP_DPBUSD _mm256_dpbusd_epi32
#define FP_VNNI_NAME "avx512vnni"
#define FP_VNNI_FEATURES {"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"}
#define FP_VNNI_PRIORITY 200
#endif
// Weight rows per prefill tile (gemm_interleaved_vnni): 4 x 4 tokens fits AVX-512's 32 vector
// registers; AVX-VNNI has 16 and sets 3 (matmul_avxvnni.cpp).
#ifndef FP_VNNI_TILE_ROWS
#define FP_VNNI_TILE_ROWS 4
#endif

namespace fp {
namespace {

// Activations of one call, quantized to Q8_0 blocks, in the two forms the kernels need.
struct QuantizedActs {
  std::vector<BlockQ8_0> own;     // signed, when the call did not bring them (MatMulArgs::xq)
  const BlockQ8_0* q = nullptr;   // signed
  std::vector<float> dx;          // per block scale as f32 (Q8_0 weights)
  std::vector<int32_t> sums;      // Q4_0: -8 x the sum of q per block
};

// The file layout's Q8_0 and Q4_0 rows (Q8_0 rows of a multiple of 256 repack to Q8_0_X8, Q4_0
// rows of a multiple of 32 to Q4_0_X8 at load; these run with --no-repack, or with Q8_0 rows of
// 1152 as Gemma 3 1B has). file_block: one block of 32 weights against the N tokens' activation blocks
// (xrow[i] + b: token i's block b):
//  - Q8_0: |w| is the unsigned operand and the activations take w's sign (vpsignb), so the
//    product is w * x with no offset to cancel;
//  - Q4_0: the unsigned q meets the signed activations and -8 x sum(x) (x.sums) starts the sum;
//    its 16 bytes go to both halves, the upper shifted by 4 (low nibbles, then high ones).
template <int N>
FP_VNNI inline void file_block(const BlockQ8_0* wb, const QuantizedActs& x, const int64_t* xrow, int64_t b, __m256* acc) {
  const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs));
  const __m256i wabs = _mm256_abs_epi8(wq);
  const float dw = _cvtsh_ss(wb[b].d);
  for (int i = 0; i < N; ++i) {
    const int64_t xb = xrow[i] + b;
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[xb].qs));
    const __m256i dot = FP_DPBUSD(_mm256_setzero_si256(), wabs, _mm256_sign_epi8(xq, wq));
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x.dx[static_cast<size_t>(xb)]), acc[i]);
  }
}
template <int N>
FP_VNNI inline void file_block(const BlockQ4_0* wb, const QuantizedActs& x, const int64_t* xrow, int64_t b, __m256* acc) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs)));
  const __m256i wu = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
  const float dw = _cvtsh_ss(wb[b].d);
  for (int i = 0; i < N; ++i) {
    const int64_t xb = xrow[i] + b;
    const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[xb].qs));
    const __m256i init = _mm256_castsi128_si256(_mm_cvtsi32_si128(x.sums[static_cast<size_t>(xb)]));  // -8 sum(x) in lane 0
    const __m256i dot = FP_DPBUSD(init, wu, xs);
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x.dx[static_cast<size_t>(xb)]), acc[i]);
  }
}

// Rows [r0, r1) for tokens i0 .. i0 + N - 1. Blocks go round-robin into U accumulators per token:
// one chain of dependent FMAs (4 cycles each) per 32 weights held a core near 24 GB/s.
template <int N, class Block>
FP_VNNI void q8_0_q4_0_rows(const MatMulArgs& a, const QuantizedActs& x, int64_t i0, int64_t r0, int64_t r1) {
  constexpr int U = N <= 2 ? 4 : 2;
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), nb = w.cols() / 32;
  int64_t xrow[N];
  for (int i = 0; i < N; ++i) xrow[i] = (i0 + i) * nb;
  for (int64_t o = r0; o < r1; ++o) {
    const Block* wb = reinterpret_cast<const Block*>(w.row_ptr(o));
    __m256 acc[U][N];
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < N; ++i) acc[u][i] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + U <= nb; b += U) {
      cpu::prefetch_stream(wb + b);  // U blocks of 34 or 18 bytes per pass: two lines ahead cover them
      cpu::prefetch_stream(reinterpret_cast<const char*>(wb + b) + 64);
      for (int u = 0; u < U; ++u) file_block<N>(wb, x, xrow, b + u, acc[u]);
    }
    for (; b < nb; ++b) file_block<N>(wb, x, xrow, b, acc[0]);
    for (int i = 0; i < N; ++i) {
      __m256 t = acc[0][i];
      for (int u = 1; u < U; ++u) t = _mm256_add_ps(t, acc[u][i]);
      a.y[(i0 + i) * out + o] = avx2::hsum(t) + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// The weight groups a tile reads: repacked per call (PackedW), or at load (Q8_0_X8 rows).
FP_VNNI inline const uint8_t* group_q(const cpu::PackedW& p) { return p.q; }
FP_VNNI inline __m256 group_scale(const cpu::PackedW& p) { return _mm256_loadu_ps(p.scale); }
FP_VNNI inline const uint8_t* group_q(const BlockQ8_0x8& p) { return p.qs; }
FP_VNNI inline __m256 group_scale(const BlockQ8_0x8& p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.d)));
}

// Weight rows for a tile to prefetch while it computes: R rows from `rows` (null: none), `stride`
// bytes apart; of their groups, those with g % period == phase.
struct Prefetch {
  const char* rows = nullptr;
  int64_t stride = 0, phase = 0, period = 1;
};

// y[t][o] for R rows x T tokens over all groups. kWeightsUnsigned: weights are the unsigned
// operand of vpdpbusd (Q4_0, Q4_K, Q8_0_X8; the activations' init cancels their offset), else
// the activations are (Q8_0 repacked per call; the weights' init cancels x's offset).
template <int R, int T, bool kWeightsUnsigned, bool kMins, class WG>
FP_VNNI void tile_kernel(const WG* const* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                         const float* bias, const Prefetch& pf) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    if (pf.rows && g % pf.period == pf.phase)  // rows read later (the next block), between the dot products
      for (int r = 0; r < R; ++r) {
        const char* p = pf.rows + r * pf.stride + g * static_cast<int64_t>(sizeof(WG));
        for (size_t off = 0; off < sizeof(WG); off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
      }
    __m256i iacc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        if constexpr (kWeightsUnsigned) iacc[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
        else iacc[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].init));
      }
    for (int c = 0; c < 8; ++c) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_q(w[r][g]) + 32 * c));
      for (int t = 0; t < T; ++t) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c));
        for (int r = 0; r < R; ++r)
          iacc[r][t] = kWeightsUnsigned ? FP_DPBUSD(iacc[r][t], wv[r], xv) : FP_DPBUSD(iacc[r][t], xv, wv[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 ws = group_scale(w[r][g]);
      for (int t = 0; t < T; ++t) {
        __m256 s = _mm256_mul_ps(ws, _mm256_loadu_ps(x[t][g].d));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][t]), s, acc[r][t]);
        if constexpr (kMins) acc[r][t] = _mm256_fnmadd_ps(_mm256_loadu_ps(w[r][g].min), _mm256_loadu_ps(x[t][g].bsum), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = avx2::hsum(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

template <bool U, bool M, class WG>
void tile_dispatch(int R, int T, const WG* const* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                   const float* bias, const Prefetch& pf = {}) {
  // R in 1..4 rows, T in 1..4 tokens (4 x 4 int32 accumulators + 4 weight vectors fit the 32
  // registers AVX-512VL gives 256-bit code).
  switch (R * 8 + T) {
#define FP_TILE(r, t) case r * 8 + t: return tile_kernel<r, t, U, M, WG>(w, x, groups, y, ldy, bias, pf);
    FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3) FP_TILE(1, 4) FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3) FP_TILE(2, 4)
    FP_TILE(3, 1) FP_TILE(3, 2) FP_TILE(3, 3) FP_TILE(3, 4) FP_TILE(4, 1) FP_TILE(4, 2) FP_TILE(4, 3) FP_TILE(4, 4)
#undef FP_TILE
  }
}

// Q6_K prefill: unsigned 6-bit q (the value is q - 32) against signed activations; each
// block's two 16-value groups (chunks 0..3 and 4..7) accumulate apart, started at -32 x sum(x)
// of their half, and take their own scales.
template <int R, int T>
FP_VNNI void tile_q6(const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                     const float* bias) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i lo[R][T], hi[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        lo[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
        hi[r][t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init_hi));
      }
    for (int c = 0; c < 8; ++c) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].q + 32 * c));
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c));
        for (int r = 0; r < R; ++r) {
          if (c < 4) lo[r][t] = FP_DPBUSD(lo[r][t], wv[r], xv);
          else hi[r][t] = FP_DPBUSD(hi[r][t], wv[r], xv);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 s_lo = _mm256_loadu_ps(w[r][g].scale), s_hi = _mm256_loadu_ps(w[r][g].scale_hi);
      for (int t = 0; t < T; ++t) {
        const __m256 dx = _mm256_loadu_ps(x[t][g].d);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r][t]), _mm256_mul_ps(s_lo, dx), acc[r][t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[r][t]), _mm256_mul_ps(s_hi, dx), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = avx2::hsum(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

void gemm_q6_interleaved_vnni(const MatMulArgs& a) {
  // 2 x 4 tiles: 16 int32 accumulators (two per element), 8 float sums, 2 weight vectors.
  cpu::gemm_interleaved(a, 2, 4, [&](int R, int T, const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups,
                                  float* y, int64_t ldy, const float* bias) {
    switch (R * 8 + T) {
#define FP_TILE(r, t) case r * 8 + t: return tile_q6<r, t>(w, x, groups, y, ldy, bias);
      FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3) FP_TILE(1, 4) FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3) FP_TILE(2, 4)
#undef FP_TILE
    }
  });
}

// Q8_0_X8 (packed at load), every batch size: the same 4 x 4 tiles read the weight rows where
// they lie. Decode (n <= 4) streams each thread's rows once per call; beyond, rows go in blocks
// of 32 that stay in L2 while the token groups pass (cpu::gemv_tokens) as the next block is
// prefetched.
void matmul_q8_0_x8(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), groups = w.cols() / QK8_0X8, stride = row_bytes(w.dtype, w.cols());
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  auto row = [&](int64_t r) { return base + r * stride; };  // (Tensor::row_ptr asks row_bytes each time)
  const std::vector<cpu::PackedX> xp = cpu::pack_all_activations(a);
  // Decode is bound by memory: one row at a time reads the matrix as one sequential stream
  // (4 rows side by side, 4 streams, measured slower). Larger batches reuse each loaded vector.
  const int64_t tile_rows = a.n <= cpu::kGemvMaxTokens ? 1 : cpu::kMaxTileRows;
  const int64_t passes = (a.n + cpu::kGemvMaxTokens - 1) / cpu::kGemvMaxTokens;  // token groups over a block
  // Batches read the next block of rows into L2 while computing on this one. Up to 64 tokens
  // (decode batches: few passes, little compute per byte) each tile prefetches the rows at its
  // place in the next block, pass p taking the groups g with g % passes == p: a few lines between
  // every group's dot products. (Prefetching the whole next block when the block starts stalled
  // the core on the fill buffers: 1.3-1.5x slower against DRAM at 16 tokens.) Larger batches
  // (prefill) compute long enough per block for that one burst, which measured a few percent faster there.
  const bool spread = tile_rows > 1 && passes <= 16;
  cpu::gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    constexpr int T = decltype(N)::value;
    const cpu::PackedX* xs[T];
    for (int t = 0; t < T; ++t) xs[t] = xp.data() + (i + t) * groups;
    if (tile_rows > 1 && !spread && i == 0)
      for (const auto *p = row(r1), *end = row(std::min(out, r1 + (r1 - r0))); p < end; p += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
    for (int64_t o = r0; o < r1; o += tile_rows) {
      const int R = static_cast<int>(std::min<int64_t>(tile_rows, r1 - o));
      const BlockQ8_0x8* ws[cpu::kMaxTileRows];
      for (int r = 0; r < R; ++r) ws[r] = reinterpret_cast<const BlockQ8_0x8*>(row(o + r));
      const int64_t ahead = o + (r1 - r0);
      const char* next = spread && ahead + R <= out ? reinterpret_cast<const char*>(row(ahead)) : nullptr;
      // Decode: the stream a little ahead of where the tile reads (cpu::kStreamAheadBytes).
      const Prefetch pf = tile_rows == 1 ? Prefetch{reinterpret_cast<const char*>(row(o)) + cpu::kStreamAheadBytes, 0, 0, 1}
                                         : Prefetch{next, stride, i / cpu::kGemvMaxTokens, passes};
      tile_dispatch<true, false>(R, T, ws, xs, groups, a.y + i * out + o, out, a.bias ? a.bias + o : nullptr, pf);
    }
  });
}

// Q4_K_X8 (packed at load) decode: as the AVX2 kernel (matmul_avx2.cpp), with one vpdpbusd per
// chunk in place of vpmaddubsw + the int16 add, and no vpmaddwd at the end.
template <int T>
FP_VNNI void row_q4_k_x8(const BlockQ4_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m4hi = _mm256_set1_epi8(static_cast<char>(0xf0));
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 3; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 144 bytes
    // The high nibbles stay in place (16 x their value): their dot products, summed apart, are
    // exact multiples of 16 and shift back once per super-block.
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[g].qs + 32 * c));
      lo[c] = _mm256_and_si256(q, m4);
      hi[c] = _mm256_and_si256(q, m4hi);
    }
    __m256 scale, min;
    avx2::q4_k_x8_scales_mins(w[g], &scale, &min);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i dot_lo = _mm256_setzero_si256(), dot_hi = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        dot_lo = FP_DPBUSD(dot_lo, lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c)));
        dot_hi = FP_DPBUSD(dot_hi, hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4))));
      }
      const __m256i dot = _mm256_add_epi32(dot_lo, _mm256_srai_epi32(dot_hi, 4));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
      acc[t] = _mm256_fnmadd_ps(min, _mm256_loadu_ps(x[t][g].bsum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = avx2::hsum(acc[t]) + bias;
}

void gemv_q4_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ4_Kx8>(a, [](auto N, const BlockQ4_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q4_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// Q6_K_X8 (packed at load) decode: as the AVX2 kernel, one vpdpbusd per chunk.
template <int T>
FP_VNNI void row_q6_k_x8(const BlockQ6_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 4; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 210 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) avx2::q6_k_x8_chunks(w[g], c, &lo[c], &hi[c]);
    __m256 s_lo, s_hi;
    avx2::q6_k_x8_scales(w[g], &s_lo, &s_hi);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      __m256i dot_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
      __m256i dot_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init_hi));
      for (int c = 0; c < 4; ++c) {
        dot_lo = FP_DPBUSD(dot_lo, lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c)));
        dot_hi = FP_DPBUSD(dot_hi, hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4))));
      }
      const __m256 dx = _mm256_loadu_ps(x[t][g].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_lo), _mm256_mul_ps(s_lo, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_hi), _mm256_mul_ps(s_hi, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = avx2::hsum(acc[t]) + bias;
}

void gemv_q6_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ6_Kx8>(a, [](auto N, const BlockQ6_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q6_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// Q3_K_X8 (packed at load) decode: as the AVX2 kernel, one vpdpbusd per chunk.
template <int T>
FP_VNNI void row_q3_k_x8(const BlockQ3_Kx8* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < 2; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);  // 110 bytes
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) avx2::q3_k_x8_chunks(w[g], c, &lo[c], &hi[c]);
    __m256 s_lo, s_hi;
    avx2::q3_k_x8_scales(w[g], &s_lo, &s_hi);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xq = x[t][g].q;
      // Four chains of two (chunks 0, 2 and 1, 3 of each half): vpdpbusd's latency.
      __m256i dot[4] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init)), _mm256_setzero_si256(),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init_hi)), _mm256_setzero_si256()};
      for (int c = 0; c < 4; ++c) {
        dot[c % 2] = FP_DPBUSD(dot[c % 2], lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c)));
        dot[2 + c % 2] = FP_DPBUSD(dot[2 + c % 2], hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4))));
      }
      const __m256 dx = _mm256_loadu_ps(x[t][g].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dot[0], dot[1])), _mm256_mul_ps(s_lo, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dot[2], dot[3])), _mm256_mul_ps(s_hi, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = avx2::hsum(acc[t]) + bias;
}

void gemv_q3_k_x8(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<BlockQ3_Kx8>(a, [](auto N, const BlockQ3_Kx8* w, const cpu::PackedX* const* xs, int64_t groups, float* y,
                                         int64_t ldy, float bias) { row_q3_k_x8<decltype(N)::value>(w, xs, groups, y, ldy, bias); });
}

// Q4_0_X8 / Q4_1_X8 / Q5_0_X8 / Q5_1_X8 (packed at load) decode: as the AVX2 kernel, one vpdpbusd
// per chunk (no int16 pair sums to keep in range). One group's chunks against activation group g:
template <DType W, int T>
FP_VNNI inline void block32_x8_group(const __m256i* lo, const __m256i* hi, __m256 scale, __m256 min, const cpu::PackedX* const* x,
                                     int64_t g, __m256* acc) {
  using Traits = avx2::Block32X8<W>;
  for (int t = 0; t < T; ++t) {
    const uint8_t* xq = x[t][g].q;
    // Two chains of four (the low and the high chunks), not one of eight: vpdpbusd's latency.
    __m256i dot_lo = Traits::kOffset ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init)) : _mm256_setzero_si256();
    __m256i dot_hi = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      dot_lo = FP_DPBUSD(dot_lo, lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c)));
      dot_hi = FP_DPBUSD(dot_hi, hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4))));
    }
    const __m256i dot = _mm256_add_epi32(dot_lo, dot_hi);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
    if constexpr (Traits::kMins) acc[t] = _mm256_fmadd_ps(min, _mm256_loadu_ps(x[t][g].bsum), acc[t]);
  }
}

// `tail`, `tail_blocks`: a Q4_0_X8 row's last blocks, a partial group (core/dtype.h), dotted as group
// `groups` (null, 0: none).
template <DType W, int T>
FP_VNNI void row_block32_x8(const typename avx2::Block32X8<W>::type* w, const cpu::PackedX* const* x, int64_t groups, float* y,
                            int64_t ldy, float bias, const BlockQ4_0* tail = nullptr, int64_t tail_blocks = 0) {
  using Traits = avx2::Block32X8<W>;
  constexpr int kLines = (sizeof(typename Traits::type) + 63) / 64;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  __m256i lo[4], hi[4];
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < kLines; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);
    for (int c = 0; c < 4; ++c) avx2::block32_x8_chunks<W>(w[g], c, &lo[c], &hi[c]);
    block32_x8_group<W, T>(lo, hi, avx2::block32_x8_scales<W>(w[g]), avx2::block32_x8_mins<W>(w[g]), x, g, acc);
  }
  if constexpr (W == DType::Q4_0_X8) {
    if (tail_blocks > 0) {
      __m256i q[4];
      __m256 scale;
      avx2::tail_group(tail, tail_blocks, q, &scale);
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int c = 0; c < 4; ++c) lo[c] = _mm256_and_si256(q[c], m4), hi[c] = _mm256_and_si256(_mm256_srli_epi16(q[c], 4), m4);
      block32_x8_group<W, T>(lo, hi, scale, _mm256_setzero_ps(), x, groups, acc);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = avx2::hsum(acc[t]) + bias;
}

// Q4_0_X8's rows may end in a partial group (cpu::X8Tail): its row takes it.
template <DType W>
void gemv_block32_x8_as(const MatMulArgs& a) {
  using Block = typename avx2::Block32X8<W>::type;
  cpu::gemv_repacked_rows<Block>(a, [](auto N, const Block* w, const cpu::PackedX* const* xs, int64_t groups, float* y, int64_t ldy,
                                       float bias, auto... tail) {
    row_block32_x8<W, decltype(N)::value>(w, xs, groups, y, ldy, bias, tail...);
  });
}

void gemv_block32_x8(const MatMulArgs& a) {
  switch (a.w->dtype) {
    case DType::Q4_0_X8: return gemv_block32_x8_as<DType::Q4_0_X8>(a);
    case DType::Q4_1_X8: return gemv_block32_x8_as<DType::Q4_1_X8>(a);
    case DType::Q5_0_X8: return gemv_block32_x8_as<DType::Q5_0_X8>(a);
    default: return gemv_block32_x8_as<DType::Q5_1_X8>(a);
  }
}

// IQ4_NL_X8 / IQ4_XS_X8 / MXFP4_X8 decode: each chunk's nibbles looked up as level + 128 (MXFP4's + 12;
// unsigned, one vpshufb shared by the tokens), so vpdpbusd takes them directly; -offset x sum(x)
// (PackedX::init) starts the sums. Two chains of four, as row_block32_x8. `tail`, `tail_blocks`: an IQ4_NL_X8 / MXFP4_X8 row's plain
// last blocks, dotted as group `groups` (null, 0: none). iq4_x8_group: one group's levels (lo, hi:
// chunks c and c + 4) and scales against T tokens' group g.
template <int T>
FP_VNNI inline void iq4_x8_group(const __m256i* lo, const __m256i* hi, __m256 scale, const cpu::PackedX* const* x, int64_t g, __m256* acc) {
  for (int t = 0; t < T; ++t) {
    const uint8_t* xq = x[t][g].q;
    __m256i dot_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init));
    __m256i dot_hi = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      dot_lo = FP_DPBUSD(dot_lo, lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c)));
      dot_hi = FP_DPBUSD(dot_hi, hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * (c + 4))));
    }
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dot_lo, dot_hi)), _mm256_mul_ps(scale, _mm256_loadu_ps(x[t][g].d)), acc[t]);
  }
}

template <class Block, int T, class Tail = BlockMXFP4>
FP_VNNI void row_iq4_x8(const Block* w, const cpu::PackedX* const* x, int64_t groups, float* y, int64_t ldy, float bias,
                        const Tail* tail = nullptr, int64_t tail_blocks = 0) {
  constexpr int kLines = (sizeof(Block) + 63) / 64;
  const __m256i levels = avx2::x8_levels<Block>(true);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  __m256i lo[4], hi[4];
  for (int64_t g = 0; g < groups; ++g) {
    for (int l = 0; l < kLines; ++l) cpu::prefetch_stream(reinterpret_cast<const char*>(w + g) + 64 * l);
    for (int c = 0; c < 4; ++c) avx2::iq4_x8_chunks(w[g].qs, c, levels, &lo[c], &hi[c]);
    iq4_x8_group<T>(lo, hi, avx2::iq4_x8_scales(w[g]), x, g, acc);
  }
  if (tail_blocks > 0) {
    __m256i q[4];
    __m256 scale;
    avx2::tail_group(tail, tail_blocks, q, &scale);
    for (int c = 0; c < 4; ++c) avx2::iq4_x8_split(q[c], levels, &lo[c], &hi[c]);
    iq4_x8_group<T>(lo, hi, scale, x, groups, acc);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = avx2::hsum(acc[t]) + bias;
}

template <class Block>
void gemv_iq4_x8_as(const MatMulArgs& a) {
  cpu::gemv_repacked_rows<Block>(a, [](auto N, const Block* w, const cpu::PackedX* const* xs, int64_t groups, float* y, int64_t ldy,
                                       float bias, auto... tail) {
    row_iq4_x8<Block, decltype(N)::value>(w, xs, groups, y, ldy, bias, tail...);
  });
}

void gemm_interleaved_vnni(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  const bool unsigned_w = t != DType::Q8_0, mins = cpu::packed_has_mins(t);
  cpu::gemm_interleaved(a, FP_VNNI_TILE_ROWS, 4, [&](int R, int T, const cpu::PackedW* const* w, const cpu::PackedX* const* x, int64_t groups,
                                  float* y, int64_t ldy, const float* bias) {
    if (!unsigned_w) tile_dispatch<false, false>(R, T, w, x, groups, y, ldy, bias);
    else if (mins) tile_dispatch<true, true>(R, T, w, x, groups, y, ldy, bias);
    else tile_dispatch<true, false>(R, T, w, x, groups, y, ldy, bias);
  });
}

// Q4_0_X8 ... Q5_1_X8, Q4_K_X8 and Q6_K_X8 are read in place by their decode row kernels up to 12
// tokens (3 groups of 4 over each L2-resident block of rows): beyond 4 tokens that beats the
// interleaved tiles, which unpack every group again per tile. A speculative check of 2-11 drafted
// tokens, or a batch of a few sequences, is such a step (bench/RESULTS.md, thirtieth session: on
// the 1B shape, 5 tokens 1.26x and 9 tokens 1.10x for Q4_0; 16 tokens were 0.92x, hence 12).
constexpr int64_t kRowsInPlaceMaxTokens = 12;

void matmul_vnni(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const DType t = a.w->dtype;
  if (t == DType::Q8_0_X8) return matmul_q8_0_x8(a);
  if (t == DType::Q4_K_X8 && a.n <= kRowsInPlaceMaxTokens) return gemv_q4_k_x8(a);
  if (t == DType::Q6_K_X8 && a.n <= kRowsInPlaceMaxTokens) return gemv_q6_k_x8(a);
  if (t == DType::IQ4_NL_X8 && a.n <= cpu::kGemvMaxTokens) return gemv_iq4_x8_as<BlockIQ4_NLx8>(a);
  if (t == DType::IQ4_XS_X8 && a.n <= cpu::kGemvMaxTokens) return gemv_iq4_x8_as<BlockIQ4_XSx8>(a);
  if (t == DType::MXFP4_X8 && a.n <= cpu::kGemvMaxTokens) return gemv_iq4_x8_as<BlockMXFP4x8>(a);
  if ((t == DType::Q4_0_X8 || t == DType::Q4_1_X8 || t == DType::Q5_0_X8 || t == DType::Q5_1_X8) && a.n <= kRowsInPlaceMaxTokens)
    return gemv_block32_x8(a);
  if (t == DType::Q3_K_X8 && a.n <= cpu::kGemvMaxTokens) return gemv_q3_k_x8(a);
  if (a.w->dtype == DType::Q6_K || a.w->dtype == DType::Q6_K_X8 || a.w->dtype == DType::Q3_K || a.w->dtype == DType::Q3_K_X8)
    return gemm_q6_interleaved_vnni(a);  // Q6_K, Q3_K: prefill only
  if (a.n > cpu::kGemvMaxTokens && cpu::interleaved_supported(a)) return gemm_interleaved_vnni(a);
  FP_CHECK(a.w->dtype == DType::Q8_0 || a.w->dtype == DType::Q4_0, "matmul " FP_VNNI_NAME ": ", dtype_name(a.w->dtype),
           " needs more than 4 tokens and rows that are a multiple of 32 (256 for its K-quants and _X8 forms)");
  const int64_t K = a.w->cols(), nb = K / QK8_0;
  QuantizedActs x;
  x.q = a.xq;
  if (!x.q) {
    x.own.resize(static_cast<size_t>(a.n * nb));
    for (int64_t i = 0; i < a.n; ++i) quantize_act_q8_0(a.x + i * K, x.own.data() + i * nb, K);
    x.q = x.own.data();
  }
  const auto blocks = static_cast<size_t>(a.n * nb);
  const bool q8 = a.w->dtype == DType::Q8_0;
  x.dx.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) x.dx[b] = f16_to_f32(x.q[b].d);
  if (!q8) {  // Q4_0: -8 x sum(x) per block, the accumulator's start (the weights' offset)
    x.sums.resize(blocks);
    for (size_t b = 0; b < blocks; ++b) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += x.q[b].qs[j];
      x.sums[b] = -8 * s;
    }
  }
  cpu::gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    if (q8) q8_0_q4_0_rows<decltype(N)::value, BlockQ8_0>(a, x, i, r0, r1);
    else q8_0_q4_0_rows<decltype(N)::value, BlockQ4_0>(a, x, i, r0, r1);
  });
}

std::string refuse_vnni(const MatMulArgs& a) {
  static const std::string cpu = cpu_features().missing(FP_VNNI_FEATURES);
  if (!cpu.empty()) return cpu;
  const DType t = a.w->dtype;
  // Prefill only (decode is left to the AVX2 kernel), on the interleaved tiles. IQ4_NL and MXFP4 in
  // the file layout (kept by --no-repack; IQ4_NL rows not a multiple of 256) may end inside a group:
  // their last group is packed zero-padded (cpu::partial_group_ok).
  const bool prefill_only = t == DType::Q4_K || t == DType::Q6_K || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 ||
                            t == DType::Q3_K || t == DType::Q5_K || t == DType::IQ4_NL || t == DType::MXFP4;
  if (t != DType::Q8_0 && t != DType::Q4_0 && t != DType::Q8_0_X8 && t != DType::Q4_K_X8 && t != DType::Q6_K_X8 && !is_block32_x8(t) &&
      t != DType::Q3_K_X8 && t != DType::IQ4_XS_X8 && !prefill_only)
    return std::string("only Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/MXFP4 and their repacked _X8 forms, and IQ4_XS_X8 (these are ") +
           dtype_name(t) + ")";
  if (prefill_only && a.n <= cpu::kGemvMaxTokens)
    return std::string(dtype_name(t)) + " decode (<= 4 tokens) is left to the AVX2 kernel";
  if (prefill_only && !cpu::interleaved_supported(a))
    return std::string(dtype_name(t)) + " needs rows that are a multiple of " + (cpu::partial_group_ok(t) ? "32" : "256") + " (these have " +
           std::to_string(a.w->cols()) + ")";
  return {};
}

const bool registered = register_kernel(Kernel<MatMulArgs>{FP_VNNI_NAME, Backend::CPU, FP_VNNI_PRIORITY, false, refuse_vnni, matmul_vnni});

}  // namespace
}  // namespace fp
