// kernels/cpu/matmul_bf16.cpp — matmul on AVX512-BF16 (Zen 4 and later, Cooper Lake, Sapphire
// Rapids): vdpbf16ps multiplies 16 pairs of BF16 values and adds both products to 16 f32 lanes,
// twice the f32 FMA rate or more, so the activations are rounded to BF16 once per call (as
// llama.cpp's BF16 path does; `ref_bf16act` is the reference that rounds the same way).
//  - BF16 weights, up to 32 tokens (decode, batched decode): dot products on the rows in place,
//    4 rows x 4 tokens per tile: one load and one vdpbf16ps per 32 weights and token, so a core
//    streams more than the AVX2 GEMV's widening and FMAs let it (27 vs 21 GB/s in L3), and 2-4
//    tokens run 3x faster than its token groups.
//  - BF16 weights beyond 32 tokens, and quantized weights (every GGUF block format and the
//    repacked forms) beyond 256 tokens (prefill): packed panels, the quantized rows dequantized
//    and rounded to BF16 as they are packed. Fewer tokens of quantized weights stay with the
//    integer kernels (the conversion would not pay).
//
//  - `amxbf16` (Sapphire Rapids and later): the same panels multiplied by AMX tiles instead —
//    TDPBF16PS multiplies a 16-token x 32-value tile by a 16-pair x 16-row tile into a 16 x 16
//    f32 tile, 8192 products per instruction. The panel's [pair][row] words are already the
//    layout of two B tiles side by side; 32 tokens x 32 rows of sums live in four C tiles.
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
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

// GCC 12's AVX-512 conversion intrinsics start from _mm512_undefined_*(), which its flow analysis
// reports as "may be used uninitialized" once inlined (GCC bug 105593); nothing here is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FP_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")))
#define FP_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

namespace fp {
namespace {

constexpr int64_t kNR = 32;      // weight rows per panel
constexpr int64_t kMR = 8;       // tokens per micro-kernel call
constexpr int64_t kKC = 512;     // K chunk, in columns (even)
constexpr int64_t kPanels = 4;   // panels packed together per K chunk (64 KiB of L2)
constexpr int64_t kFewTokens = 32;  // up to this many tokens: dot products on the rows in place, no packing
constexpr int64_t kAmxPairs = 16;   // pairs per tile step: a B tile's rows
#ifndef FP_AMX_KC
#define FP_AMX_KC 4096
#endif
constexpr int64_t kAmxKC = FP_AMX_KC;  // K chunk: a 32-token block and a panel, 16 KiB each, in L1 together

// c[t][r] for 32 tokens x 32 rows (row stride ldc floats) = c (or the bias rows `init`, on the
// first chunk) + x[t] . panel over `steps` x 16 pairs. x holds, per step, the 32 tokens' 16
// pairs in a row (2 KiB: both A tiles, contiguous); the panel 32 words per pair.
FP_AMX void amx_block(const uint32_t* x, const uint32_t* pack, int64_t steps, float* c, int64_t ldc, const float* init) {
  // GCC's tile load and store intrinsics are asm statements that do not name the memory they
  // read and write: the barriers keep every store to the operands before them, every read of
  // the sums after.
  asm volatile("" ::: "memory");
  const int64_t sc = ldc * 4;
  if (init) {  // 16 copies of the bias row (or zeros), stride 32 floats
    _tile_loadd(0, init, 128);
    _tile_loadd(1, init + 16, 128);
    _tile_loadd(2, init, 128);
    _tile_loadd(3, init + 16, 128);
  } else {
    _tile_loadd(0, c, sc);
    _tile_loadd(1, c + 16, sc);
    _tile_loadd(2, c + 16 * ldc, sc);
    _tile_loadd(3, c + 16 * ldc + 16, sc);
  }
  for (int64_t s = 0; s < steps; ++s) {
    const uint32_t* xs = x + s * kAmxTokens * kAmxPairs;
    const uint32_t* ps = pack + s * kAmxPairs * kNR;
    _tile_loadd(4, xs, kAmxPairs * 4);
    _tile_loadd(5, xs + 16 * kAmxPairs, kAmxPairs * 4);
    _tile_loadd(6, ps, kNR * 4);
    _tile_loadd(7, ps + 16, kNR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  _tile_stored(1, c + 16, sc);
  _tile_stored(2, c + 16 * ldc, sc);
  _tile_stored(3, c + 16 * ldc + 16, sc);
  asm volatile("" ::: "memory");
}

FP_AMX void amx_release() { _tile_release(); }

// As matmul_bf16's panel path, with the activations laid out as the A tiles read them: per
// block of 32 tokens and step of 16 pairs, the 32 rows of 64 bytes in a row (tokens padded to a
// multiple of 32 and pairs to a multiple of 16 with zeros, as are the panels' pad pairs, so
// that every tile is whole). Rows of a token-major matrix K values apart fell in few L1 sets
// and left the tile loads waiting. A block of sums that is not whole (the last tokens, the last
// rows) goes through a 32 x 32 scratch block.
void matmul_amx(const MatMulArgs& a) {
  if (a.n <= 0) return;
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), words = (K + 1) / 2;
  const int64_t all_steps = (words + kAmxPairs - 1) / kAmxPairs;
  const int64_t blocks = (a.n + kAmxTokens - 1) / kAmxTokens;
  const int64_t block_words = all_steps * kAmxTokens * kAmxPairs;  // one token block, every step
  std::vector<uint32_t>& xb = scratch_buffer<uint32_t, 0>(static_cast<size_t>(blocks * block_words));
  const int64_t pad_tokens = blocks * kAmxTokens - a.n;  // the last block's missing tokens are zeros
  for (int64_t s = 0; pad_tokens > 0 && s < all_steps; ++s)
    std::memset(xb.data() + (blocks - 1) * block_words + (s * kAmxTokens + kAmxTokens - pad_tokens) * kAmxPairs, 0,
                static_cast<size_t>(pad_tokens * kAmxPairs) * 4);
  thread_pool().parallel_for(a.n, 1, [&](int64_t i0, int64_t i1) {
    std::vector<uint32_t> row(static_cast<size_t>(all_steps * kAmxPairs), 0);
    for (int64_t i = i0; i < i1; ++i) {
      round_row(a.x + i * K, K, reinterpret_cast<uint16_t*>(row.data()));
      uint32_t* dst = xb.data() + (i / kAmxTokens) * block_words + (i % kAmxTokens) * kAmxPairs;
      for (int64_t s = 0; s < all_steps; ++s)
        std::memcpy(dst + s * kAmxTokens * kAmxPairs, row.data() + s * kAmxPairs, kAmxPairs * 4);
    }
  });
  const auto* wd = static_cast<const uint16_t*>(w.data);
  const bool quantized = w.dtype != DType::BF16;
  const int64_t group_rows = kNR * kPanels, groups = (out + group_rows - 1) / group_rows;
  thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
    amx_configure();  // the tile configuration is each thread's own
    std::vector<uint32_t>& pack = scratch_buffer<uint32_t, 1>(static_cast<size_t>(kPanels * (kAmxKC / 2) * kNR));
    std::vector<float>& f32 = scratch_buffer<float, 2>(quantized ? static_cast<size_t>(kAmxKC) : 0);
    std::vector<uint16_t>& bf16 = scratch_buffer<uint16_t, 3>(quantized ? static_cast<size_t>(kNR * kAmxKC) : 0);
    alignas(64) float init[16 * kNR];  // 16 copies of the bias row (first chunk)
    alignas(64) float scratch[kAmxTokens * kNR];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o_begin = g * group_rows, o_end = std::min(out, o_begin + group_rows);
      const int64_t panels = (o_end - o_begin + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kAmxKC) {
        const int64_t kc = std::min(kAmxKC, K - k0), pairs = (kc + 1) / 2;
        const int64_t steps = (pairs + kAmxPairs - 1) / kAmxPairs;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t o0 = o_begin + p * kNR;
          uint32_t* dst = pack.data() + p * (kAmxKC / 2) * kNR;
          if (quantized)
            pack_panel_quantized(w, o0, std::min(kNR, o_end - o0), k0, kc, dst, f32.data(), bf16.data());
          else
            pack_panel(wd, K, o0, std::min(kNR, o_end - o0), k0, kc, dst);
          std::memset(dst + pairs * kNR, 0, static_cast<size_t>((steps * kAmxPairs - pairs) * kNR) * 4);
        }
        // Token blocks outer: a block's activations (32 tokens x the chunk) serve every panel
        // of the group from L2 before the next block's are read.
        for (int64_t i0 = 0; i0 < a.n; i0 += kAmxTokens) {
          const int64_t rows = std::min(kAmxTokens, a.n - i0);
          const uint32_t* xs = xb.data() + (i0 / kAmxTokens) * block_words + (k0 / 2 / kAmxPairs) * kAmxTokens * kAmxPairs;
          for (int64_t p = 0; p < panels; ++p) {
            const int64_t o0 = o_begin + p * kNR, cols = std::min(kNR, o_end - o0);
            const float* first = nullptr;
            if (k0 == 0) {
              for (int64_t r = 0; r < 16; ++r)
                for (int64_t col = 0; col < kNR; ++col) init[r * kNR + col] = a.bias && col < cols ? a.bias[o0 + col] : 0.0f;
              first = init;
            }
            const uint32_t* ps = pack.data() + p * (kAmxKC / 2) * kNR;
            float* y = a.y + i0 * out + o0;
            if (rows == kAmxTokens && cols == kNR) {
              amx_block(xs, ps, steps, y, out, first);
              continue;
            }
            if (!first)
              for (int64_t t = 0; t < rows; ++t) std::memcpy(scratch + t * kNR, y + t * out, static_cast<size_t>(cols) * 4);
            amx_block(xs, ps, steps, scratch, kNR, first);
            for (int64_t t = 0; t < rows; ++t) std::memcpy(y + t * out, scratch + t * kNR, static_cast<size_t>(cols) * 4);
          }
        }
      }
    }
    amx_release();
  });
}

std::string refuse_bf16(const MatMulArgs& a) {
  std::string cpu = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"});
  if (!cpu.empty()) return cpu;
  const DType t = a.w->dtype;
  const bool quantized = dtype_info(t).quantized;  // every GGUF block format (and its repacked forms)
  if (t != DType::BF16 && !quantized) return std::string("only BF16 and quantized weights (these are ") + dtype_name(t) + ")";
  if (quantized && a.n <= kQuantizedMinTokens)
    return "quantized weights of up to 256 tokens: the integer kernels (converting them to BF16 would not pay)";
  if (a.w->block_scale) return "block-scaled weights";
  if (!a.w->is_contiguous()) return "non-contiguous weights";
  return {};
}

// Timed against the next candidate (registry.h): whether the BF16 panels beat the integer tiles
// on quantized prefill depends on the core, not on its features (1.4-1.6x faster on Zen 4,
// 0.4-0.7x on Sapphire Rapids; bench/RESULTS.md), so the first call of each class times both.
Kernel<MatMulArgs> bf16_kernel() {
  Kernel<MatMulArgs> k{"avx512bf16", Backend::CPU, 210, false, refuse_bf16, matmul_bf16};
  k.timed = true;
  return k;
}
const bool registered = register_kernel(bf16_kernel());

std::string refuse_amx(const MatMulArgs& a) {
  std::string cpu = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"});
  if (!cpu.empty()) return cpu;
  if (!amx_tile_permission().empty()) return amx_tile_permission();
  if (a.n <= kFewTokens) return "up to 32 tokens: the AVX512-BF16 dot tiles (a 32-token AMX block would be mostly padding)";
  const DType t = a.w->dtype;
  if (t != DType::BF16 && !dtype_info(t).quantized) return std::string("only BF16 and quantized weights (these are ") + dtype_name(t) + ")";
  if (a.w->block_scale) return "block-scaled weights";
  if (!a.w->is_contiguous()) return "non-contiguous weights";
  return {};
}

// Timed too: ranked first, it races avx512bf16 and the integer tiles below it.
Kernel<MatMulArgs> amx_kernel() {
  Kernel<MatMulArgs> k{"amxbf16", Backend::CPU, 220, false, refuse_amx, matmul_amx};
  k.timed = true;
  return k;
}
const bool amx_registered = register_kernel(amx_kernel());

}  // namespace
}  // namespace fp
