// kernels/cpu/matmul_interleave.h — the interleaved-block layout for integer prefill GEMMs.
// One 32-byte vector holds 4 bytes of each of 8 consecutive 32-value blocks, so 8 integer
// multiply-accumulate steps leave block j's complete dot product in int32 lane j and the 8
// per-block scales apply with one multiply-add per 8 blocks instead of one per block. A "group"
// is 8 blocks = 256 values (one Q4_K super-block). Weights are repacked per row block (kept in
// L2), activations once per call. Used by the AVX-512 VNNI and the AVX2 kernels.
// Q8_0_X8, Q4_K_X8, Q6_K_X8 and Q4_0_X8 ... Q5_1_X8 weights (core/dtype.h) are already in this layout, packed once at load:
// the decode kernels read them in place and only the activations are packed per call.
#pragma once
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/ops.h"

namespace fp::cpu {

struct PackedW {
  uint8_t q[256];    // Q8_0: signed; Q4_0 / Q4_1 / Q4_K: unsigned 0..15; Q5_*: 0..31; Q6_K: 0..63; Q3_K: 0..7;
                     // IQ4: the level + 128 (1..241); MXFP4: the level + 12 (0..24)
  float scale[8];    // per block: d (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1), d * sub-block scale (Q4_K/Q5_K),
                     // d * scale of values 0..15 (Q6_K/Q3_K)
  int32_t init[8];   // Q8_0: -128 * sum(w) per block, cancelling the activation offset
  float min[8];      // Q4_K/Q5_K: dmin * sub-block min; Q4_1/Q5_1: -m (the minimum is added)
  float scale_hi[8]; // Q6_K/Q3_K: d * scale of the block's values 16..31 (its second 16-value group)
};
struct PackedX {
  uint8_t q[256];    // Q8_0 weights: x + 128 (unsigned); otherwise signed x
  float d[8];        // per block activation scale
  int32_t init[8];   // Q4_0: -8 * sum(x) per block, for the weights' -8 offset; Q5_0: -16 * sum(x);
                     // Q8_0_X8 / IQ4: -128 * sum(x); MXFP4: -12 * sum(x); Q6_K / Q3_K: -32 / -4 * sum(x) over the block's values 0..15
  float bsum[8];     // Q4_K/Q5_K/Q4_1/Q5_1: d * sum(x) per sub-block, for the minimums
  int32_t init_hi[8];  // Q6_K / Q3_K: -32 / -4 * sum(x) over the block's values 16..31
  int32_t sum16[16];   // Q2_K_X8: sum(x) over block j's values 0..15 (sum16[j]) and 16..31 (sum16[8 + j]), for its minimums
};

// Q6_K's 16-value groups: chunks 0..3 of a group hold every block's values 0..15 (the first group
// of its two), chunks 4..7 its values 16..31, so its kernels keep two accumulators per tile
// element, one per half, scaled by `scale` and `scale_hi`; the -32 offset starts them (init, init_hi).

// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (and their _X8 forms), Q3_K, Q4_K(_X8), Q5_K, Q6_K(_X8), IQ4_XS_X8 with
// rows a multiple of 256; the 32-value file formats (partial_group_ok) with rows a multiple of 32.
bool interleaved_supported(const MatMulArgs& a);
// Formats whose rows may end inside a group (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 in the file
// layout, and Q4_0_X8, IQ4_NL_X8, MXFP4_X8, whose rows end in a partial group): the last group is packed zero-padded,
// weights and activations both, so it adds nothing (gpt-oss's 2880-value rows are 11 groups and 2 blocks).
bool partial_group_ok(DType t);
// Groups of a K-value row: K / 256 rounded up.
inline int64_t interleaved_groups(int64_t K) { return (K + 255) / 256; }
// Weights whose activations are Q8_K (256-value blocks with 16-value sums): the K-quants.
bool k_quant_activations(DType t);
// Weights whose packed groups carry a minimum (PackedW::min, applied per unit of PackedX::bsum).
bool packed_has_mins(DType t);
void pack_weights(const Tensor& w, int64_t row, PackedW* dst);
// xq: the row already quantized to Q8_0 (Q8_0/Q4_0/Q8_0_X8 weights), or null to quantize x here.
void pack_activations(DType wtype, const float* x, const BlockQ8_0* xq, int64_t K, PackedX* dst);
// All a.n rows of the call's activations, interleaved_groups(K) groups per row (threads share the rows).
std::vector<PackedX> pack_all_activations(const MatMulArgs& a);

// The blocks an _X8 row of this group type may end in, a partial group (core/dtype.h,
// block32_x8_takes_tail), typed by their plain block: Q4_0_X8's and IQ4_NL_X8's (one group type)
// BlockQ4_0, MXFP4_X8's BlockMXFP4; void for the forms whose rows are whole groups.
template <class Block> struct X8Tail { using type = void; };
template <> struct X8Tail<BlockQ4_0x8> { using type = BlockQ4_0; };
template <> struct X8Tail<BlockMXFP4x8> { using type = BlockMXFP4; };

// Decode over weights repacked at load (Q4_K_X8, Q6_K_X8, Q4_0_X8 ...): the call's activations packed once,
// then row(integral_constant<T>, row's blocks, activations[T], groups, y, ldy, bias) for each
// weight row and group of T <= 4 tokens, rows split across threads (gemv_tokens). Where the group
// type has an X8Tail, row takes two more arguments, `tail` and `tail_blocks`: the row's partial
// last group (0 blocks when the row is whole groups), dotted as one zero-padded group
// (avx2::tail_group) against the activations' zero-padded last group.
template <class Block, class RowFn>
void gemv_repacked_rows(const MatMulArgs& a, RowFn row) {
  using Tail = typename X8Tail<Block>::type;
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), groups = w.cols() / 256, tail = w.cols() % 256 / 32, xgroups = interleaved_groups(w.cols());
  if constexpr (std::is_void_v<Tail>)
    FP_CHECK(tail == 0, "gemv_repacked_rows: ", dtype_name(w.dtype), " rows of ", w.cols(), " values (a multiple of 256 expected)");
  const std::vector<PackedX> xp = pack_all_activations(a);
  gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    constexpr int T = decltype(N)::value;
    const PackedX* xs[T];
    for (int t = 0; t < T; ++t) xs[t] = xp.data() + (i + t) * xgroups;
    for (int64_t o = r0; o < r1; ++o) {
      const auto* wr = reinterpret_cast<const Block*>(w.row_ptr(o));
      float* y = a.y + i * out + o;
      const float bias = a.bias ? a.bias[o] : 0.0f;
      if constexpr (!std::is_void_v<Tail>) {
        row(N, wr, xs, groups, y, out, bias, reinterpret_cast<const Tail*>(wr + groups), tail);
      } else {
        row(N, wr, xs, groups, y, out, bias);
      }
    }
  });
}

// tile(R, T, weights[R], activations[T], groups, y, ldy, bias): y[t * ldy + r] for R rows and
// T tokens, R <= rows_per_tile <= 4 and T <= tokens_per_tile <= 4. Rows go in blocks of 32
// across threads (packed once per block), tokens in tiles of tokens_per_tile. group_block > 0
// cuts K into blocks of that many groups, each swept by all the block's tiles before the next
// (the tiles' activations then stay in L1; the blocks' sums add up in y); 0: K at once.
constexpr int kMaxTileRows = 4, kMaxTileTokens = 4;
using InterleavedTile = std::function<void(int, int, const PackedW* const*, const PackedX* const*, int64_t, float*,
                                           int64_t, const float*)>;
void gemm_interleaved(const MatMulArgs& a, int rows_per_tile, int tokens_per_tile, const InterleavedTile& tile,
                      int64_t group_block = 0);

}  // namespace fp::cpu
