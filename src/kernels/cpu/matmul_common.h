// kernels/cpu/matmul_common.h — the work split shared by the CPU matmul kernels: weight rows
// across threads, rows in L2-sized blocks, tokens in groups of up to 4 per pass over a row.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <xmmintrin.h>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace fp::cpu {

constexpr int64_t kGemvMaxTokens = 4;  // tokens dotted per pass over a weight row
constexpr int64_t kRowBlock = 32;      // rows per L2-resident block when many tokens share them

// How far ahead of its read position a decode GEMV prefetches its weight stream. The hardware
// prefetchers alone fall behind kernels that compute between their loads: on the Xeon VM here
// (2026-12-01) Q4_K streamed 4.9 GB/s per core without, 12.8 with 2 KiB ahead (1 and 4 KiB:
// 11.4, 10.7); F16 and Q8_0_X8, lighter per byte, gain less. bench/RESULTS.md has the figures.
constexpr int64_t kStreamAheadBytes = 2048;
inline void prefetch_stream(const void* at, int64_t ahead = kStreamAheadBytes) {
  _mm_prefetch(static_cast<const char*>(at) + ahead, _MM_HINT_T0);
}

// Calls fn(integral_constant<N>, first token, r0, r1) for groups of up to 4 tokens, with the
// weight rows split across threads.
template <class Fn>
void gemv_tokens(const MatMulArgs& a, Fn fn) {
  // Rows go in blocks small enough to stay in L2 while every token group passes over them.
  const int64_t row_block = a.n <= kGemvMaxTokens ? a.w->rows() : kRowBlock;
  thread_pool().parallel_for(a.w->rows(), 32, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += row_block) {
      const int64_t re = std::min(r1, rb + row_block);
      for (int64_t i = 0; i < a.n; i += kGemvMaxTokens) {
        switch (std::min<int64_t>(kGemvMaxTokens, a.n - i)) {
          case 1: fn(std::integral_constant<int, 1>{}, i, rb, re); break;
          case 2: fn(std::integral_constant<int, 2>{}, i, rb, re); break;
          case 3: fn(std::integral_constant<int, 3>{}, i, rb, re); break;
          default: fn(std::integral_constant<int, 4>{}, i, rb, re); break;
        }
      }
    }
  });
}

// Tiles of up to 4 weight rows x 4 tokens for the kernels that dot rows in place (a few tokens):
// rows split across threads, in blocks that stay in L2 while every group of 4 tokens passes;
// tile(R, T, o, i, sums) fills sums[t * R + r] with row o + r dotted with token i + t, written
// out here with the bias.
template <class Tile>
void row_token_tiles(const MatMulArgs& a, Tile tile) {
  const int64_t out = a.w->rows();
  thread_pool().parallel_for(out, 32, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
      const int64_t re = std::min(r1, rb + kRowBlock);
      for (int64_t i = 0; i < a.n; i += 4) {
        const int T = static_cast<int>(std::min<int64_t>(4, a.n - i));
        for (int64_t o = rb; o < re; o += 4) {
          const int R = static_cast<int>(std::min<int64_t>(4, re - o));
          float sums[16];
          tile(R, T, o, i, sums);
          for (int t = 0; t < T; ++t)
            for (int r = 0; r < R; ++r) a.y[(i + t) * out + o + r] = sums[t * R + r] + (a.bias ? a.bias[o + r] : 0.0f);
        }
      }
    }
  });
}

}  // namespace fp::cpu
