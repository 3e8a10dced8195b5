// kernels/cpu/attention_amx.cpp — amx_flash: causal attention of prefill-like sequences on
// AMX tiles (BF16 products, f32 sums), flash style with an online softmax; the other sequences of
// the call (decode) go to the f32 items of avx2_flash through the shared driver (attention_cpu.h).
//
// It reads a BF16 cache only (K and V multiplied as stored; F16 and F32 caches keep their
// precision on avx2_flash). A sequence is taken when AttentionArgs::wide says so (>= 4 query
// tokens and >= 16 query rows per KV head). Per item (a block of query rows of one KV head, as
// the f32 items), per row tile of 16 query rows, per block of 64 keys, everything transposed so
// that one key's values for the tile's 16 rows are one vector:
//   Sᵀ = K Qsᵀ       4 C tiles of 16 keys x 16 rows: K's rows as A tiles, Qsᵀ (q * scale
//                    rounded to BF16) as B tiles built once per item;
//   P = e^(S - m')   the online softmax of attention_avx2.cpp down the keys, the 16 rows in the
//                    lanes (no horizontal reductions); P rounded to BF16 in place, two keys per
//                    32-bit lane, which is a B tile's layout (Pᵀ); l sums the rounded values, so
//                    the weights stay a convex mix;
//   Oᵀ = Oᵀ e^(m - m') + Vᵀ Pᵀ   Oᵀ (value dims x rows) rescaled in memory by the row vector,
//                    then loaded as C tiles, Vᵀ as A tiles.
// Packing (prepare, once per call): every wide sequence's K and V rows up to the last key its
// queries see go, per (sequence, KV head, block of 64 keys), into tiles: K as its rows (64 x hd,
// padded with zeros to a multiple of 32 dims), Vᵀ as [key/32][value dim/16] tiles of 16 value
// dims x 32 keys (value dims padded to 16). The last block's missing keys are zeros (masked).
//
// What differs from the f32 kernel: q * scale and P rounded to BF16; the reference twin
// `ref_bf16` (reference.cpp) rounds the same inputs, so a test against it sees only P's rounding
// and the order of sums (tests/backend_ops_attention_test.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

// GCC 12's AVX-512 intrinsics (_mm512_undefined_ps inside the reductions and conversions) are
// reported as "may be used uninitialized" once inlined (GCC bug 105593); nothing here is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define FP_AMX_INLINE \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"), always_inline)) inline

namespace fp {
namespace {

using cpu::AttnPartials;
using cpu::AttnPlan;
constexpr int64_t kBk = cpu::kAttnBk;  // keys per block: 4 key tiles of 16
constexpr int64_t kTile = 512;         // uint16 per tile (16 rows x 64 bytes)
#ifndef FP_AMX_ATTN_ROWS
#define FP_AMX_ATTN_ROWS 128
#endif
constexpr int64_t kRowsPerItem = FP_AMX_ATTN_ROWS;  // query rows per item

struct Dims {
  int64_t hd, vd, hdp, vdp;  // hdp: head dim padded to 32, vdp: value dim padded to 16
  bool split;                // amx_flash_x3: every operand as a high and a low BF16 part
  int64_t dsteps() const { return hdp / 32; }
  int64_t ctiles() const { return vdp / 16; }
  int64_t k_tiles() const { return dsteps() * (kBk / 16); }
  int64_t part_tiles() const { return k_tiles() + 2 * ctiles(); }  // K then Vᵀ of one part
  int64_t block_tiles() const { return split ? 2 * part_tiles() : part_tiles(); }
};

Dims dims_of(const AttentionArgs& a, bool split) {
  return {a.head_dim, a.v_dim, (a.head_dim + 31) / 32 * 32, (a.v_dim + 15) / 16 * 16, split};
}

FP_AMX_INLINE __mmask16 lanes(int64_t count) {  // the first count (clamped to 0..16) lanes
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// ---------------------------------------------------------------- packing (once per call)
// n values of the pool from element `index` into hi[0..padded), zeros past n: a BF16 pool's as
// they are; an F16 pool's (lo given) as two BF16 parts, v = hi + lo exactly (hi holds 8 of the
// 11 significant bits, lo the other 3; F16's range lies inside BF16's).
// (vcvtneps2bf16 rounds to nearest even as f32_to_bf16 does; the inputs it takes as zero, f32
// subnormals, do not occur: an F16 value and its remainder are f32 normals or zero.)
FP_AMX void copy_row(const void* pool, int64_t index, int64_t n, int64_t padded, uint16_t* hi, uint16_t* lo) {
  const auto* src = static_cast<const uint16_t*>(pool) + index;
  if (!lo) {
    std::memcpy(hi, src, static_cast<size_t>(n) * 2);
  } else {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = lanes(n - i);
      const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i));
      const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
      const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm256_mask_storeu_epi16(hi + i, k, h);
      _mm256_mask_storeu_epi16(lo + i, k, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf))));
    }
    std::fill(lo + n, lo + padded, uint16_t{0});
  }
  std::fill(hi + n, hi + padded, uint16_t{0});
}

// Block b (keys b*64 ..) of sequence s, KV head h, keys below `len`, into `tiles`
// (Dims::block_tiles() tiles: K then Vᵀ, and split, the low parts' K then Vᵀ after them); keys
// from len on are zeros. `rows`: 2 x 64 x vdp scratch.
void pack_block(const AttentionArgs& a, const Dims& dm, int64_t s, int64_t h, int64_t b, int64_t len, uint16_t* tiles,
                uint16_t* rows) {
  uint16_t* lo_tiles = dm.split ? tiles + dm.part_tiles() * kTile : nullptr;
  uint16_t* lo_rows = dm.split ? rows + kBk * dm.vdp : nullptr;
  // K: the block's rows as they are, [64][hdp] (an A tile is 16 keys x 32 dims of it).
  for (int64_t t = 0; t < kBk; ++t) {
    const int64_t key = b * kBk + t;
    uint16_t* dst = tiles + t * dm.hdp;
    uint16_t* lo = lo_tiles ? lo_tiles + t * dm.hdp : nullptr;
    if (key < len) {
      copy_row(a.k_pool, a.slot(s, key) * a.k_stride + h * dm.hd, dm.hd, dm.hdp, dst, lo);
    } else {
      std::fill(dst, dst + dm.hdp, uint16_t{0});
      if (lo) std::fill(lo, lo + dm.hdp, uint16_t{0});
    }
  }
  // Vᵀ: tile (ks, ct) row c = V[ks*32 .. ks*32 + 32)[ct*16 + c] (16 value dims x 32 keys).
  for (int64_t t = 0; t < kBk; ++t) {
    const int64_t key = b * kBk + t;
    uint16_t* lo = lo_rows ? lo_rows + t * dm.vdp : nullptr;
    if (key < len) {
      copy_row(a.v_pool, a.slot(s, key) * a.v_stride + h * dm.vd, dm.vd, dm.vdp, rows + t * dm.vdp, lo);
    } else {
      std::fill(rows + t * dm.vdp, rows + (t + 1) * dm.vdp, uint16_t{0});
      if (lo) std::fill(lo, lo + dm.vdp, uint16_t{0});
    }
  }
  for (int part = 0; part < (dm.split ? 2 : 1); ++part) {
    const uint16_t* src = part ? lo_rows : rows;
    uint16_t* vt = (part ? lo_tiles : tiles) + dm.k_tiles() * kTile;
    for (int64_t ks = 0; ks < 2; ++ks)
      for (int64_t ct = 0; ct < dm.ctiles(); ++ct) {
        uint16_t* tile = vt + (ks * dm.ctiles() + ct) * kTile;
        for (int64_t c = 0; c < 16; ++c)
          for (int64_t k = 0; k < 32; ++k) tile[c * 32 + k] = src[(ks * 32 + k) * dm.vdp + ct * 16 + c];
      }
  }
}

// ---------------------------------------------------------------- one row tile, one block
// The item works on transposed scores Sᵀ = K Qsᵀ (keys x rows), so that each key's scores for
// the tile's 16 rows are one vector: the softmax's max, sum and rescale run down the keys with
// no horizontal reductions, and Pᵀ goes to a B tile as rounded, two keys per lane. Likewise
// Oᵀ (value dims x rows) = Vᵀ Pᵀ, whose rows are rescaled by the row vector e^(m - m').
FP_AMX void amx_configure() { _tile_loadconfig(&cpu::kAmxTiles); }
FP_AMX void amx_release() { _tile_release(); }

// The four sum tiles 0-3 as 16 x 16 f32 blocks 256 floats apart (rows of 64 bytes): zeroed,
// loaded from c, stored to c.
FP_AMX_INLINE void zero_c4() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
FP_AMX_INLINE void load_c4(const float* c) {
  _tile_loadd(0, c, 64);
  _tile_loadd(1, c + 256, 64);
  _tile_loadd(2, c + 512, 64);
  _tile_loadd(3, c + 768, 64);
}
FP_AMX_INLINE void store_c4(float* c) {
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

// st[64 keys][16 rows] = K (the block's 64 rows, hdp BF16 each) x qt (per 32 dims a B tile of
// 16 dim pairs x 16 rows). Tiles 0-3: the four key tiles' sums; 4-5: K; 6: qt. (The barriers:
// GCC's tile intrinsics do not name the memory they touch.)
FP_AMX void scores_t(const uint16_t* qt, const Dims& dm, const uint16_t* kb, float* st) {
  asm volatile("" ::: "memory");
  const int64_t sk = dm.hdp * 2;
  zero_c4();
  for (int64_t d = 0; d < dm.dsteps(); ++d) {
    const uint16_t* kd = kb + d * 32;
    _tile_loadd(6, qt + d * kTile, 64);
    _tile_loadd(4, kd, sk);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, kd + 16 * dm.hdp, sk);
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(4, kd + 32 * dm.hdp, sk);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(5, kd + 48 * dm.hdp, sk);
    _tile_dpbf16ps(3, 5, 6);
  }
  store_c4(st);
  asm volatile("" ::: "memory");
}

// scores_t with every operand in two parts (amx_flash_x3): K = kh + kl (the same layout, F16
// rows exactly), qt = qh + ql; the three products that count, kh qh + kl qh + kh ql (kl ql is
// below 2^-16 of the sum). Tiles 0-3: sums; 4-5: one key tile's kh and kl; 6-7: qh and ql.
// (Written out per key tile, as weighted_sum_t: the tile numbers must be literals.)
FP_AMX void scores_t_x3(const uint16_t* qh, const uint16_t* ql, const Dims& dm, const uint16_t* kh, const uint16_t* kl,
                        float* st) {
  asm volatile("" ::: "memory");
  const int64_t sk = dm.hdp * 2;
  zero_c4();
  for (int64_t d = 0; d < dm.dsteps(); ++d) {
    const uint16_t *hd = kh + d * 32, *ld = kl + d * 32;
    _tile_loadd(6, qh + d * kTile, 64);
    _tile_loadd(7, ql + d * kTile, 64);
    _tile_loadd(4, hd, sk);
    _tile_loadd(5, ld, sk);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(0, 5, 6);
    _tile_dpbf16ps(0, 4, 7);
    _tile_loadd(4, hd + 16 * dm.hdp, sk);
    _tile_loadd(5, ld + 16 * dm.hdp, sk);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(4, hd + 32 * dm.hdp, sk);
    _tile_loadd(5, ld + 32 * dm.hdp, sk);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(4, hd + 48 * dm.hdp, sk);
    _tile_loadd(5, ld + 48 * dm.hdp, sk);
    _tile_dpbf16ps(3, 4, 6);
    _tile_dpbf16ps(3, 5, 6);
    _tile_dpbf16ps(3, 4, 7);
  }
  store_c4(st);
  asm volatile("" ::: "memory");
}

// ot[vdp][16 rows] += Vᵀ tiles x pt (Pᵀ: two B tiles of 16 key pairs x 16 rows), up to four
// column tiles at a time. Tiles 0-3: Oᵀ; 4-5: pt's halves (keys 0-31, 32-63); 6-7: Vᵀ. (Written
// out per tile: GCC's tile intrinsics paste the tile numbers into the assembly, so they cannot
// be loop or template variables.)
FP_AMX void weighted_sum_t(const uint16_t* pt, const Dims& dm, const uint16_t* vt, float* ot) {
  asm volatile("" ::: "memory");
  const int64_t ct_all = dm.ctiles();
  const uint16_t* v0 = vt;                   // keys 0-31
  const uint16_t* v1 = vt + ct_all * kTile;  // keys 32-63
  _tile_loadd(4, pt, 64);
  _tile_loadd(5, pt + kTile, 64);
  int64_t ct = 0;
  for (; ct + 4 <= ct_all; ct += 4) {
    float* oc = ot + ct * 256;
    load_c4(oc);
    _tile_loadd(6, v0 + ct * kTile, 64);
    _tile_loadd(7, v1 + ct * kTile, 64);
    _tile_dpbf16ps(0, 6, 4);
    _tile_dpbf16ps(0, 7, 5);
    _tile_loadd(6, v0 + (ct + 1) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 1) * kTile, 64);
    _tile_dpbf16ps(1, 6, 4);
    _tile_dpbf16ps(1, 7, 5);
    _tile_loadd(6, v0 + (ct + 2) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 2) * kTile, 64);
    _tile_dpbf16ps(2, 6, 4);
    _tile_dpbf16ps(2, 7, 5);
    _tile_loadd(6, v0 + (ct + 3) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 3) * kTile, 64);
    _tile_dpbf16ps(3, 6, 4);
    _tile_dpbf16ps(3, 7, 5);
    store_c4(oc);
  }
  for (; ct < ct_all; ++ct) {  // value dims not a multiple of 64: one column tile at a time
    float* oc = ot + ct * 256;
    _tile_loadd(0, oc, 64);
    _tile_loadd(6, v0 + ct * kTile, 64);
    _tile_loadd(7, v1 + ct * kTile, 64);
    _tile_dpbf16ps(0, 6, 4);
    _tile_dpbf16ps(0, 7, 5);
    _tile_stored(0, oc, 64);
  }
  asm volatile("" ::: "memory");
}

// weighted_sum_t in two parts (amx_flash_x3): Vᵀ = vh + vl, Pᵀ = ph + pl; vh ph + vl ph + vh pl
// per key half. Tiles 0-3: Oᵀ; 4-5: ph and pl of one key half; 6-7: one column tile's vh and vl.
FP_AMX void weighted_sum_t_x3(const uint16_t* ph, const uint16_t* pl, const Dims& dm, const uint16_t* vh,
                              const uint16_t* vl, float* ot) {
  asm volatile("" ::: "memory");
  const int64_t ct_all = dm.ctiles();
  int64_t ct = 0;
  for (; ct + 4 <= ct_all; ct += 4) {
    float* oc = ot + ct * 256;
    load_c4(oc);
    for (int64_t ks = 0; ks < 2; ++ks) {  // keys 0-31, 32-63
      const uint16_t *h = vh + (ks * ct_all + ct) * kTile, *l = vl + (ks * ct_all + ct) * kTile;
      _tile_loadd(4, ph + ks * kTile, 64);
      _tile_loadd(5, pl + ks * kTile, 64);
      _tile_loadd(6, h, 64);
      _tile_loadd(7, l, 64);
      _tile_dpbf16ps(0, 6, 4);
      _tile_dpbf16ps(0, 7, 4);
      _tile_dpbf16ps(0, 6, 5);
      _tile_loadd(6, h + kTile, 64);
      _tile_loadd(7, l + kTile, 64);
      _tile_dpbf16ps(1, 6, 4);
      _tile_dpbf16ps(1, 7, 4);
      _tile_dpbf16ps(1, 6, 5);
      _tile_loadd(6, h + 2 * kTile, 64);
      _tile_loadd(7, l + 2 * kTile, 64);
      _tile_dpbf16ps(2, 6, 4);
      _tile_dpbf16ps(2, 7, 4);
      _tile_dpbf16ps(2, 6, 5);
      _tile_loadd(6, h + 3 * kTile, 64);
      _tile_loadd(7, l + 3 * kTile, 64);
      _tile_dpbf16ps(3, 6, 4);
      _tile_dpbf16ps(3, 7, 4);
      _tile_dpbf16ps(3, 6, 5);
    }
    store_c4(oc);
  }
  for (; ct < ct_all; ++ct) {  // value dims not a multiple of 64: one column tile at a time
    float* oc = ot + ct * 256;
    _tile_loadd(0, oc, 64);
    for (int64_t ks = 0; ks < 2; ++ks) {
      _tile_loadd(4, ph + ks * kTile, 64);
      _tile_loadd(5, pl + ks * kTile, 64);
      _tile_loadd(6, vh + (ks * ct_all + ct) * kTile, 64);
      _tile_loadd(7, vl + (ks * ct_all + ct) * kTile, 64);
      _tile_dpbf16ps(0, 6, 4);
      _tile_dpbf16ps(0, 7, 4);
      _tile_dpbf16ps(0, 6, 5);
    }
    _tile_stored(0, oc, 64);
  }
  asm volatile("" ::: "memory");
}

// e^x on 16 lanes for the softmax, where x = s - m' or m - m' <= 0 on every lane that counts (the
// caller zeroes the weights of the others, whatever they hold): exp8 of exp_avx2.h cut to what
// the weights need. x = n ln2 + r, e^r by a Taylor polynomial of degree kSplit ? 6 : 4 (|r| <=
// ln2/2: relative error <= 1.2e-7, the f32 kernel's, for amx_flash_x3's weights; <= 4.2e-5,
// against the 2^-9 to which amx_flash rounds P next), 2^n by vscalefps; only the lower clamp,
// which also takes NaN (a row that saw no key yet: -inf - -inf) to it: below it the result is
// ~1e-38, not 0, negligible beside the row's largest weight, 1.
template <bool kSplit>
FP_AMX_INLINE __m512 exp16_weight(__m512 x) {
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.33654475f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 24);
  if constexpr (kSplit) {
    p = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(1.0f / 720), r, _mm512_set1_ps(1.0f / 120)), r,
                        _mm512_set1_ps(1.0f / 24));
  }
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The rows (lanes) that see key `key` (len > key); all of them when kAll (the caller checked).
template <bool kAll>
FP_AMX_INLINE __mmask16 sees(__m512i len, int64_t key) {
  if constexpr (kAll) return __mmask16(0xFFFF);
  return _mm512_cmpgt_epi32_mask(len, _mm512_set1_epi32(static_cast<int>(key)));
}

// The online softmax step of the tile's 16 rows (lanes) over the block's keys: key t counts for
// the rows whose len > t0 + t. m' = max(m, max_t s_t), P_t = e^(s_t - m') rounded to BF16
// (to nearest; zeros where masked), l = l e^(m - m') + sum_t P_t, Oᵀ's rows times e^(m - m').
// `keys`: the keys any row sees (pt holds zeros for the rest). A row that saw no key yet keeps
// m = -inf, l = 0 and O = 0, which any rescale keeps. kAll: every row sees every
// one of the keys (blocks before the diagonal), so nothing is masked. kSplit (amx_flash_x3):
// P_t = hi + lo, both BF16 (hi in pt, lo in the two tiles after it, 2 * kTile on), hi + lo
// within 2^-17 of P_t; l sums P_t unrounded.
template <bool kAll, bool kSplit>
FP_AMX void softmax_t(const float* st, __m512i len, int64_t t0, int64_t keys, __m512& m, __m512& l, uint16_t* pt,
                      float* ot, const Dims& dm) {
  __m512 mx = m;
  for (int64_t t = 0; t < keys; ++t) mx = _mm512_mask_max_ps(mx, sees<kAll>(len, t0 + t), mx, _mm512_load_ps(st + 16 * t));
  const __m512 corr = exp16_weight<kSplit>(_mm512_sub_ps(m, mx));
  const __m512i half = _mm512_set1_epi32(0x8000);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < kBk; t += 2) {
    __m512i pair = _mm512_setzero_si512(), pair_lo = _mm512_setzero_si512();
    if (t < keys) {
      const __mmask16 k0 = sees<kAll>(len, t0 + t), k1 = t + 1 < keys ? sees<kAll>(len, t0 + t + 1) : __mmask16(0);
      const __m512 e0 = _mm512_maskz_mov_ps(k0, exp16_weight<kSplit>(_mm512_sub_ps(_mm512_load_ps(st + 16 * t), mx)));
      const __m512 e1 = _mm512_maskz_mov_ps(k1, exp16_weight<kSplit>(_mm512_sub_ps(_mm512_load_ps(st + 16 * t + 16), mx)));
      // Both rounded to BF16 in place, P_t to the low and P_t+1 to the high half of each lane:
      // adding half a BF16 unit then dropping the low 16 bits rounds to nearest (ties away;
      // 0 <= P <= 1, so nothing overflows), with no cross-lane shuffle.
      const __m512i u0 = _mm512_add_epi32(_mm512_castps_si512(e0), half);
      const __m512i u1 = _mm512_add_epi32(_mm512_castps_si512(e1), half);
      pair = _mm512_or_si512(_mm512_srli_epi32(u0, 16), _mm512_and_si512(u1, high));
      if constexpr (kSplit) {
        // What rounding left, e - hi (exact in f32), rounded the same way (to nearest in
        // magnitude: the sign bit is not touched).
        const __m512 r0 = _mm512_sub_ps(e0, _mm512_castsi512_ps(_mm512_and_si512(u0, high)));
        const __m512 r1 = _mm512_sub_ps(e1, _mm512_castsi512_ps(_mm512_and_si512(u1, high)));
        const __m512i v0 = _mm512_add_epi32(_mm512_castps_si512(r0), half);
        const __m512i v1 = _mm512_add_epi32(_mm512_castps_si512(r1), half);
        pair_lo = _mm512_or_si512(_mm512_srli_epi32(v0, 16), _mm512_and_si512(v1, high));
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      } else {
        // The rounded values back to f32 (each 32-bit lane holds row r's two): the weights l sums.
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)));
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_and_si512(pair, high)));
      }
    }
    _mm512_store_si512(pt + 16 * t, pair);  // B tile row t / 2 (tile t / 32)
    if constexpr (kSplit) _mm512_store_si512(pt + 2 * kTile + 16 * t, pair_lo);
  }
  l = _mm512_fmadd_ps(l, corr, sum);
  m = mx;
  if (_mm512_cmp_ps_mask(corr, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ))
    for (int64_t c = 0; c < dm.vdp; ++c) _mm512_store_ps(ot + 16 * c, _mm512_mul_ps(_mm512_load_ps(ot + 16 * c), corr));
}

// ---------------------------------------------------------------- the wide items
class AmxItems final : public cpu::AttnWideItems {
 public:
  explicit AmxItems(bool split) : split_(split) {}
  bool takes(const AttentionArgs& a, int64_t s) const override { return a.wide(s); }
  // 128: each block's K and Vᵀ tiles serve 8 row tiles (64 rows: level at head dim 64, 13%
  // slower at 128, bench/RESULTS.md).
  int64_t rows_per_item() const override { return kRowsPerItem; }
  void prepare(const AttentionArgs& a, const std::vector<AttnPlan>& plans) override;
  void run(const AttentionArgs& a, const AttnPlan& p, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
           const AttnPartials& out) override;

 private:
  bool split_;                                   // amx_flash_x3 (an F16 cache): two parts each
  std::vector<int64_t> seq_tile_, seq_blocks_;  // per sequence: first tile, blocks per KV head
  cpu::AlignedVector<uint16_t>* pack_ = nullptr;
};

void AmxItems::prepare(const AttentionArgs& a, const std::vector<AttnPlan>& plans) {
  const Dims dm = dims_of(a, split_);
  seq_tile_.assign(static_cast<size_t>(a.n_seqs), 0);
  seq_blocks_.assign(static_cast<size_t>(a.n_seqs), 0);
  struct Unit {
    int64_t s, h, b;
  };
  std::vector<Unit> units;
  int64_t tiles = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    if (!a.wide(s)) continue;
    const int64_t blocks = (plans[static_cast<size_t>(s)].max_len + kBk - 1) / kBk;
    seq_tile_[static_cast<size_t>(s)] = tiles;
    seq_blocks_[static_cast<size_t>(s)] = blocks;
    tiles += a.n_kv_heads * blocks * dm.block_tiles();
    for (int64_t h = 0; h < a.n_kv_heads; ++h)
      for (int64_t b = 0; b < blocks; ++b) units.push_back({s, h, b});
  }
  // Kept across calls (grown, never shrunk): a fresh buffer of megabytes per layer would be
  // faulted in page by page every call.
  static thread_local cpu::AlignedVector<uint16_t> pack;
  if (pack.size() < static_cast<size_t>(tiles * kTile)) pack.resize(static_cast<size_t>(tiles * kTile));
  pack_ = &pack;
  uint16_t* base = pack.data();
  thread_pool().parallel_for(static_cast<int64_t>(units.size()), 4, [&](int64_t u0, int64_t u1) {
    std::vector<uint16_t> rows(static_cast<size_t>(2 * kBk * dm.vdp));
    for (int64_t u = u0; u < u1; ++u) {
      const Unit& un = units[static_cast<size_t>(u)];
      const int64_t blocks = seq_blocks_[static_cast<size_t>(un.s)];
      uint16_t* dst = base + (seq_tile_[static_cast<size_t>(un.s)] + (un.h * blocks + un.b) * dm.block_tiles()) * kTile;
      pack_block(a, dm, un.s, un.h, un.b, plans[static_cast<size_t>(un.s)].max_len, dst, rows.data());
    }
  });
}

struct ItemScratch {
  cpu::AlignedVector<uint16_t> qs, qt, pt;
  cpu::AlignedVector<float> ot, st, m, l;
  cpu::AlignedVector<int32_t> len;
};

// dst[0..hdp) = q[0..hd) * scale rounded to BF16 (vcvtneps2bf16: to nearest even, inputs below
// the smallest normal float as zero, as f32_to_bf16_daz and the twin round), zeros past hd.
// With lo (amx_flash_x3): what that rounding left, rounded the same way, into lo.
FP_AMX void round_scaled(const float* q, float scale, const Dims& dm, uint16_t* dst, uint16_t* lo) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t d = 0; d < dm.hdp; d += 16) {
    const __mmask16 k = lanes(dm.hd - d);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, q + d), vs);
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), h);
    if (lo) {
      const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + d),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf))));
    }
  }
}

// Every row tile of the item's current KV head through the block of keys [t0, t0 + 64) (K and
// Vᵀ tiles at kb), keys from t_end on left out.
FP_AMX void block_step(ItemScratch& sc, const Dims& dm, int64_t rtiles, const uint16_t* kb, int64_t t0, int64_t t_end) {
  const uint16_t* vt = kb + dm.k_tiles() * kTile;
  const uint16_t* kl = kb + dm.part_tiles() * kTile;  // split: the low parts
  const uint16_t* vl = kl + dm.k_tiles() * kTile;
  const int64_t ql_offset = rtiles * dm.dsteps() * kTile;
  for (int64_t rt = 0; rt < rtiles; ++rt) {
    const __m512i len = _mm512_load_si512(sc.len.data() + rt * 16);
    const int64_t keys = std::min<int64_t>({kBk, _mm512_reduce_max_epi32(len) - t0, t_end - t0});
    if (keys <= 0) continue;  // no row of the tile sees these keys
    float* ot = sc.ot.data() + rt * dm.vdp * 16;
    const uint16_t* qt = sc.qt.data() + rt * dm.dsteps() * kTile;
    if (dm.split)
      scores_t_x3(qt, qt + ql_offset, dm, kb, kl, sc.st.data());
    else
      scores_t(qt, dm, kb, sc.st.data());
    __m512 m = _mm512_load_ps(sc.m.data() + rt * 16), l = _mm512_load_ps(sc.l.data() + rt * 16);
    const bool all = _mm512_cmpge_epi32_mask(len, _mm512_set1_epi32(static_cast<int>(t0 + keys))) == 0xFFFF;
    if (dm.split) {
      if (all)
        softmax_t<true, true>(sc.st.data(), len, t0, keys, m, l, sc.pt.data(), ot, dm);
      else
        softmax_t<false, true>(sc.st.data(), len, t0, keys, m, l, sc.pt.data(), ot, dm);
    } else {
      if (all)
        softmax_t<true, false>(sc.st.data(), len, t0, keys, m, l, sc.pt.data(), ot, dm);
      else
        softmax_t<false, false>(sc.st.data(), len, t0, keys, m, l, sc.pt.data(), ot, dm);
    }
    _mm512_store_ps(sc.m.data() + rt * 16, m);
    _mm512_store_ps(sc.l.data() + rt * 16, l);
    if (dm.split)
      weighted_sum_t_x3(sc.pt.data(), sc.pt.data() + 2 * kTile, dm, vt, vl, ot);
    else
      weighted_sum_t(sc.pt.data(), dm, vt, ot);
  }
}

void AmxItems::run(const AttentionArgs& a, const AttnPlan& pl, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
                   const AttnPartials& out) {
  const Dims dm = dims_of(a, split_);
  const int64_t parts = split_ ? 2 : 1;
  const int64_t g = pl.group, i0 = a.seq_indptr[s] + qb * pl.bq, i1 = std::min<int64_t>(a.seq_indptr[s + 1], i0 + pl.bq);
  const int64_t rpg = (i1 - i0) * g, rtiles = (rpg + 15) / 16, rows = rtiles * 16;
  const int64_t kv_len = a.kv_len[s], blocks = seq_blocks_[static_cast<size_t>(s)];
  const int64_t ot_floats = dm.vdp * 16;  // one row tile's Oᵀ
  thread_local ItemScratch sc;
  sc.qs.resize(static_cast<size_t>(parts * rows * dm.hdp));  // split: the low parts after the high
  sc.qt.resize(static_cast<size_t>(parts * rtiles * dm.dsteps() * kTile));
  sc.pt.resize(static_cast<size_t>(parts * 2 * kTile));
  sc.ot.resize(static_cast<size_t>(rtiles * ot_floats));
  sc.st.resize(static_cast<size_t>(kBk * 16));
  sc.m.resize(static_cast<size_t>(rows));
  sc.l.resize(static_cast<size_t>(rows));
  sc.len.resize(static_cast<size_t>(rows));
  amx_configure();  // the tile configuration is each thread's own
  for (int64_t j = 0; j < pl.heads_per_item; ++j) {
    const int64_t h = kvh0 + j;
    int64_t max_len = 0;
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t* qd = sc.qs.data() + r * dm.hdp;
      uint16_t* ql = split_ ? qd + rows * dm.hdp : nullptr;
      if (r >= rpg) {
        std::fill(qd, qd + dm.hdp, uint16_t{0});
        if (ql) std::fill(ql, ql + dm.hdp, uint16_t{0});
        sc.len[static_cast<size_t>(r)] = 0;
        continue;
      }
      const int64_t i = i0 + r / g;
      round_scaled(a.q + (i * a.n_heads + h * g + r % g) * dm.hd, a.scale, dm, qd, ql);
      const int64_t len = std::clamp<int64_t>(static_cast<int64_t>(a.pos[i]) + 1, 0, kv_len);
      sc.len[static_cast<size_t>(r)] = static_cast<int32_t>(len);
      max_len = std::max(max_len, len);
    }
    // Qsᵀ as B tiles: tile (rt, d) row p, word r = dims d*32 + 2p, +1 of row rt*16 + r.
    for (int64_t part = 0; part < parts; ++part) {
      const auto* qw = reinterpret_cast<const uint32_t*>(sc.qs.data() + part * rows * dm.hdp);
      auto* qt = reinterpret_cast<uint32_t*>(sc.qt.data() + part * rtiles * dm.dsteps() * kTile);
      for (int64_t rt = 0; rt < rtiles; ++rt)
        for (int64_t d = 0; d < dm.dsteps(); ++d) {
          uint32_t* tile = qt + (rt * dm.dsteps() + d) * (kTile / 2);
          for (int64_t p = 0; p < 16; ++p)
            for (int64_t r = 0; r < 16; ++r) tile[p * 16 + r] = qw[(rt * 16 + r) * (dm.hdp / 2) + d * 16 + p];
        }
    }
    std::fill(sc.ot.begin(), sc.ot.end(), 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    const int64_t t_begin = sp * pl.split_len, t_end = std::min(max_len, t_begin + pl.split_len);
    const uint16_t* head_tiles = pack_->data() + (seq_tile_[static_cast<size_t>(s)] + h * blocks * dm.block_tiles()) * kTile;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += kBk) {
      const uint16_t* kb = head_tiles + (t0 / kBk) * dm.block_tiles() * kTile;
      block_step(sc, dm, rtiles, kb, t0, t_end);
    }
    for (int64_t r = 0; r < rpg; ++r) {
      const int64_t i = i0 + r / g, head = h * g + r % g;
      const float* o = sc.ot.data() + (r / 16) * ot_floats + r % 16;  // column r % 16 of Oᵀ
      const float l = sc.l[static_cast<size_t>(r)];
      float* dst;
      float scale = 1.0f;
      if (out.m) {
        const int64_t slot = (i * a.n_heads + head) * out.max_splits + sp;
        out.m[slot] = sc.m[static_cast<size_t>(r)];
        out.l[slot] = l;
        dst = out.o + slot * dm.vd;
      } else {
        dst = a.out + (i * a.n_heads + head) * dm.vd;
        scale = l > 0 ? 1.0f / l : 0.0f;  // no visible keys: zeros
      }
      for (int64_t c = 0; c < dm.vd; ++c) dst[c] = o[c * 16] * scale;
    }
  }
  amx_release();
}

// What both AMX kernels ask of the CPU, checked first: on a CPU without AMX that is the reason,
// whatever the cache.
std::string refuse_amx_cpu() {
  static const std::string why = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"});
  if (!why.empty()) return why;
  return amx_tile_permission();
}

// What both AMX kernels ask of the call, past the CPU and the cache's dtype.
std::string refuse_amx_common(const AttentionArgs& a) {
  std::string f32_items = cpu::refuse_attention_avx2(a);  // the sequences left to them
  if (!f32_items.empty()) return f32_items;
  if (std::string why = refuse_attention_options(a, {}); !why.empty()) return why;  // not in the tiles yet
  for (int64_t s = 0; s < a.n_seqs; ++s)
    if (a.wide(s)) return {};
  return "no sequence of >= " + std::to_string(AttentionArgs::kWideMinTokens) + " query tokens and >= " +
         std::to_string(AttentionArgs::kWideMinRows) + " query rows per KV head (decode stays on avx2_flash's f32 items)";
}

std::string refuse_amx_flash(const AttentionArgs& a) {
  // A BF16 cache only: K and V are then multiplied as stored. Rounding an F16 cache's rows to
  // BF16 would drop 3 of the bits it was chosen to keep (stories260K's logits moved 7e-4 -> 5e-3
  // from an F32 cache's): amx_flash_x3 takes those; an F32 cache asks for f32 attention.
  if (const std::string cpu = refuse_amx_cpu(); !cpu.empty()) return cpu;
  const std::string kv = refuse_kv_dtype(a.kv_dtype, {DType::BF16});
  if (!kv.empty())
    return kv + " (products in BF16 would round the cache's rows: amx_flash_x3 takes F16 caches in two parts; "
                "--kv-cache-dtype bf16 takes amx_flash)";
  return refuse_amx_common(a);
}

// amx_flash_x3: an F16 cache's rows split exactly into two BF16 parts, q * scale and P into two
// parts too, three tile products where amx_flash has one: f32-level results (the f32 kernel's
// tolerance in the tests) at about half amx_flash's speed.
std::string refuse_amx_flash_x3(const AttentionArgs& a) {
  if (const std::string cpu = refuse_amx_cpu(); !cpu.empty()) return cpu;
  const std::string kv = refuse_kv_dtype(a.kv_dtype, {DType::F16});
  if (!kv.empty()) return kv + " (a BF16 cache takes amx_flash, one product per tile; an F32 cache asks for f32 attention)";
  return refuse_amx_common(a);
}

void attention_amx(const AttentionArgs& a) {
  AmxItems items(false);
  cpu::attention_flash_cpu(a, &items);
}

void attention_amx_x3(const AttentionArgs& a) {
  AmxItems items(true);
  cpu::attention_flash_cpu(a, &items);
}

const bool registered =
    register_kernel(Kernel<AttentionArgs>{"amx_flash", Backend::CPU, 110, false, refuse_amx_flash, attention_amx});
const bool registered_x3 =
    register_kernel(Kernel<AttentionArgs>{"amx_flash_x3", Backend::CPU, 105, false, refuse_amx_flash_x3, attention_amx_x3});

}  // namespace
}  // namespace fp
