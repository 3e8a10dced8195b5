// kernels/cpu/attention_avx2.cpp — AVX2+FMA causal attention over a paged KV cache with GQA,
// for a varlen batch of sequences, flash-attention style: no score matrix is materialized.
//
// K/V rows are reached through slot numbers (kernels/ops.h): for each block of kBk keys the item
// looks up the slots of that block and the next one (for prefetching) once, so any power-of-two
// page size costs the same as a contiguous cache.
//
// Work item = (sequence, KV heads, block of query tokens, KV split). Its rows are the query vectors of
// the block's tokens for every query head sharing a KV head: tokens x group rows per KV head,
// so each K/V tile is loaded once for all of them. The item walks its key range in blocks of
// kBk keys keeping an online softmax per row (running max m, running sum l, unnormalized
// output O[vd]):  S = Qs Kᵀ (Qs = q * scale),  m' = max(m, max S),  P = e^(S - m'),
//                 l = l e^(m - m') + sum P,  O = O e^(m - m') + P V.
// Causality is per row: the token at position pos[i] sees cache rows 0..min(pos[i], kv_len-1)
// (from pos[i] - window + 1 with a sliding window: the keys before it score -inf, and the blocks
// before every row's window are skipped). A sink (gpt-oss) is one more term of the final sum;
// a softcap (Gemma 2) bounds S to softcap * tanh(S / softcap) before the softmax step.
//  - Prefill (several query blocks): one KV head per item, items = KV heads x query blocks.
//    With >= 8 rows per head, S comes from a register-blocked GEMM (4 rows x 16 keys) against
//    the K tile transposed once into Kt[hd][kBk].
//  - Decode (one query block): one item walks all KV heads block by block, and the threads
//    split the key range instead. With < 8 rows per head, S comes from dot products straight
//    from the cache (2 rows x 4 keys), no transpose to amortize. K/V stream from memory here,
//    so the loops prefetch the rows one block ahead.
//  - KV splits (when items are too few to feed the threads and the context is long) each keep
//    (m, l, O); a final pass merges them: m* = max m_s,
//    out = sum_s O_s e^(m_s - m*) / sum_s l_s e^(m_s - m*).
// Items are taken from an atomic counter, most expensive (latest query blocks) first. The plan,
// the items and the merge are the CPU flash driver (attention_cpu.h), which amx_flash
// (attention_amx.cpp) runs too, handing its prefill-like sequences' items to AMX tiles.
//
// The KV pool may hold F32, F16 or BF16 values: every function that reads it is a template on
// the dtype and widens 8 values at a time in registers (avx2::load8: F16 through F16C's
// vcvtph2ps, BF16 by a 16-bit shift), so a half-width cache moves half the bytes and is never
// converted as a whole. Pool positions are element indices from a `const void*` base.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

using namespace avx2;

template <DType KV>
constexpr int64_t kElemBytes = KV == DType::F32 ? 4 : 2;
template <DType KV>
constexpr int64_t kLineElems = 64 / kElemBytes<KV>;  // pool elements per cache line (the prefetch step)

template <DType KV>
FP_AVX2_INLINE const void* kv_at(const void* base, int64_t i) {
  return static_cast<const char*>(base) + i * kElemBytes<KV>;
}
template <DType KV>
FP_AVX2_INLINE void prefetch_kv(const void* base, int64_t i) {
  _mm_prefetch(static_cast<const char*>(base) + i * kElemBytes<KV>, _MM_HINT_T0);
}

using cpu::AttnPartials;
using cpu::AttnPlan;
constexpr int64_t kBk = cpu::kAttnBk;   // keys per block (the row stride of S and Kt)
constexpr int64_t kRowsPerItem = 64;    // target query rows (tokens x group) per item
constexpr int64_t kPackedMinRows = 8;   // from this many rows on, transpose K and use the GEMM
constexpr int64_t kMinSplitKeys = 128;  // fewest keys in one KV split
constexpr double kParallelMinFlops = 2e5;  // below this, one thread

// Per-thread buffers, grown on demand.
struct Scratch {
  std::vector<float> qs, o, s, kt, m, l, corr;
  std::vector<int64_t> len, first, slots;
};

// ---------------------------------------------------------------- scores, packed K (prefill)
// s[r][c..c+16) = sum_d q[r][d] * kt[d][c..c+16) for R rows; q stride hd, kt and s stride kBk.
template <int R>
FP_AVX2_INLINE void scores_tile(const float* q, int64_t hd, const float* kt, float* s) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    __m256 k0 = _mm256_loadu_ps(kt + d * kBk), k1 = _mm256_loadu_ps(kt + d * kBk + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 qb = _mm256_broadcast_ss(q + r * hd + d);
      acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * kBk, acc[r][0]);
    _mm256_storeu_ps(s + r * kBk + 8, acc[r][1]);
  }
}

template <int R>
FP_AVX2 void scores_rows_packed(const float* qs, int64_t hd, const float* kt, int64_t nk16, float* s) {
  for (int64_t c = 0; c < nk16; c += 16) scores_tile<R>(qs, hd, kt + c, s + c);
}

FP_AVX2 void scores_packed(const float* qs, int64_t rows, int64_t hd, const float* kt, int64_t nk, float* s) {
  const int64_t nk16 = (nk + 15) & ~int64_t{15};
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) scores_rows_packed<4>(qs + r * hd, hd, kt, nk16, s + r * kBk);
  switch (rows - r) {
    case 3: scores_rows_packed<3>(qs + r * hd, hd, kt, nk16, s + r * kBk); break;
    case 2: scores_rows_packed<2>(qs + r * hd, hd, kt, nk16, s + r * kBk); break;
    case 1: scores_rows_packed<1>(qs + r * hd, hd, kt, nk16, s + r * kBk); break;
    default: break;
  }
}

// kt[d][t] = K row t (t < nk; rows nk.. up to a multiple of 16 repeat the last row, so the
// padded scores are finite; they are masked out before the softmax). Row t is pool element sl[t] * ld of k;
// sl[kBk + t] is row t of the next block (for the prefetch).
template <DType KV>
FP_AVX2 void pack_kt(const void* k, const int64_t* sl, int64_t ld, int64_t nk, int64_t hd, float* kt, bool prefetch) {
  const int64_t nk16 = (nk + 15) & ~int64_t{15};
  for (int64_t t = 0; t < nk16; t += 8) {
    int64_t src[8];
    for (int i = 0; i < 8; ++i) src[i] = sl[std::min<int64_t>(t + i, nk - 1)] * ld;
    for (int i = 0; prefetch && i < 8 && t + i < kBk; ++i)  // the same rows one block ahead
      for (int64_t d = 0; d < hd; d += kLineElems<KV>) prefetch_kv<KV>(k, sl[t + i + kBk] * ld + d);
    for (int64_t d = 0; d < hd; d += 8) {
      __m256 r0 = load8<KV>(k, src[0] + d), r1 = load8<KV>(k, src[1] + d);
      __m256 r2 = load8<KV>(k, src[2] + d), r3 = load8<KV>(k, src[3] + d);
      __m256 r4 = load8<KV>(k, src[4] + d), r5 = load8<KV>(k, src[5] + d);
      __m256 r6 = load8<KV>(k, src[6] + d), r7 = load8<KV>(k, src[7] + d);
      __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* dst = kt + d * kBk + t;
      _mm256_storeu_ps(dst + 0 * kBk, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(dst + 1 * kBk, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(dst + 2 * kBk, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(dst + 3 * kBk, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(dst + 4 * kBk, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(dst + 5 * kBk, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(dst + 6 * kBk, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(dst + 7 * kBk, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  }
}

// ---------------------------------------------------------------- scores, direct K (decode)
// s[r][t] = q[r] . k[t] for t < nk, k rows of stride ld straight from the cache. Two rows x
// four keys share their loads (6 loads per 8 FMAs); the eight sums come out of one
// horizontal-add tree as [row0 keys 0..3 | row1 keys 0..3]. A lone last row takes 8 keys.
FP_AVX2_INLINE __m256 hadd_tree8(const __m256* a) {
  __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// x . (pool elements y0 .. y0 + len)
template <DType KV>
FP_AVX2_INLINE float dot(const float* x, const void* pool, int64_t y0, int64_t len) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < len; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), load8<KV>(pool, y0 + d), acc);
  return hsum(acc);
}

template <DType KV>
FP_AVX2 void scores_direct(const float* qs, int64_t rows, int64_t hd, const void* k, const int64_t* sl, int64_t ld, int64_t nk,
                           float* s) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const float *q0 = qs + r * hd, *q1 = q0 + hd;
    float *s0 = s + r * kBk, *s1 = s0 + kBk;
    int64_t t = 0;
    for (; t + 4 <= nk; t += 4) {
      const int64_t kr[4] = {sl[t] * ld, sl[t + 1] * ld, sl[t + 2] * ld, sl[t + 3] * ld};
      if (r == 0)  // the same keys one block ahead
        for (int i = 0; i < 4; ++i)
          for (int64_t d = 0; d < hd; d += kLineElems<KV>) prefetch_kv<KV>(k, sl[t + i + kBk] * ld + d);
      __m256 a[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8) {
        __m256 qa = _mm256_loadu_ps(q0 + d), qb = _mm256_loadu_ps(q1 + d);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m256 kv = load8<KV>(k, kr[i] + d);
          a[i] = _mm256_fmadd_ps(qa, kv, a[i]);
          a[4 + i] = _mm256_fmadd_ps(qb, kv, a[4 + i]);
        }
      }
      __m256 v = hadd_tree8(a);
      _mm_storeu_ps(s0 + t, _mm256_castps256_ps128(v));
      _mm_storeu_ps(s1 + t, _mm256_extractf128_ps(v, 1));
    }
    for (; t < nk; ++t) {
      s0[t] = dot<KV>(q0, k, sl[t] * ld, hd);
      s1[t] = dot<KV>(q1, k, sl[t] * ld, hd);
    }
  }
  if (r < rows) {
    const float* q = qs + r * hd;
    float* sr = s + r * kBk;
    int64_t t = 0;
    for (; t + 8 <= nk; t += 8) {
      int64_t kr[8];
      for (int i = 0; i < 8; ++i) kr[i] = sl[t + i] * ld;
      __m256 a[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, load8<KV>(k, kr[i] + d), a[i]);
      }
      _mm256_storeu_ps(sr + t, hadd_tree8(a));
    }
    for (; t < nk; ++t) sr[t] = dot<KV>(q, k, sl[t] * ld, hd);
  }
}

// ---------------------------------------------------------------- score soft-capping
// s[0..nk) = cap * tanh(s / cap) (Gemma 2), before the window's -inf and the softmax.
FP_AVX2 void softcap_scores(float* s, int64_t nk, float cap) {
  const __m256 c = _mm256_set1_ps(cap), two_over_cap = _mm256_set1_ps(2.0f / cap);
  int64_t t = 0;
  for (; t + 8 <= nk; t += 8) _mm256_storeu_ps(s + t, softcap8(_mm256_loadu_ps(s + t), c, two_over_cap));
  if (t < nk) {
    const __m256i tm = tail_mask(nk - t);
    _mm256_maskstore_ps(s + t, tm, softcap8(_mm256_maskload_ps(s + t, tm), c, two_over_cap));
  }
}

// ---------------------------------------------------------------- online softmax step
// For one row: p[0..valid) = e^(s - m') where m' = max(m, max s[0..valid)); p[valid..nk) = 0.
// Updates m and l, returns the factor e^(m - m') that rescales the row's O.
FP_AVX2 float softmax_step(float* p, int64_t valid, int64_t nk, float& m, float& l) {
  if (valid <= 0) {
    std::fill(p, p + nk, 0.0f);
    return 1.0f;
  }
  const int64_t v8 = valid & ~int64_t{7};
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i tm = tail_mask(valid - v8);
  __m256 mx = ninf;
  for (int64_t t = 0; t < v8; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + t));
  if (v8 < valid) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(p + v8, tm), _mm256_castsi256_ps(tm)));
  const float m_new = std::max(m, hmax(mx));
  const float corr = std::exp(m - m_new);  // 0 on the row's first keys (m = -inf)
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < v8; t += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), vm));
    _mm256_storeu_ps(p + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (v8 < valid) {
    __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(p + v8), vm)), _mm256_castsi256_ps(tm));
    _mm256_storeu_ps(p + v8, e);  // zeroes the lanes past `valid` too (p has room: stride kBk)
    sum = _mm256_add_ps(sum, e);
  }
  for (int64_t t = v8 < valid ? v8 + 8 : valid; t < nk; ++t) p[t] = 0.0f;
  l = l * corr + hsum(sum);
  m = m_new;
  return corr;
}

// ---------------------------------------------------------------- O = O * corr + P V
// R rows, W x 8 output columns from column c0 on; V row t at pool element sl[t] * ld, straight
// from the cache.
template <DType KV, int R, int W>
FP_AVX2_INLINE void pv_tile(const float* p, const void* v, int64_t c0, const int64_t* sl, int64_t ld, int64_t nk,
                            const float* corr, float* o, int64_t vd, bool prefetch) {
  __m256 acc[R][W];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 c = _mm256_broadcast_ss(corr + r);
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) acc[r][w] = _mm256_mul_ps(_mm256_loadu_ps(o + r * vd + 8 * w), c);
  }
  for (int64_t t = 0; t < nk; ++t) {
    // The same columns of the V row one block ahead.
    const int64_t vr = sl[t] * ld + c0;
#pragma GCC unroll 4
    for (int w = 0; w < W; w += kLineElems<KV> / 8)
      if (prefetch) prefetch_kv<KV>(v, sl[t + kBk] * ld + c0 + 8 * w);
    __m256 vv[W];
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) vv[w] = load8<KV>(v, vr + 8 * w);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 pb = _mm256_broadcast_ss(p + r * kBk + t);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(pb, vv[w], acc[r][w]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(o + r * vd + 8 * w, acc[r][w]);
}

template <DType KV, int R>
FP_AVX2 void pv_rows(const float* p, const void* v, const int64_t* sl, int64_t ld, int64_t nk, const float* corr, float* o,
                     int64_t vd, bool prefetch) {
  int64_t c = 0;
  if constexpr (R == 1) {  // one row: four column vectors in flight instead of two
    for (; c + 32 <= vd; c += 32) pv_tile<KV, 1, 4>(p, v, c, sl, ld, nk, corr, o + c, vd, prefetch);
  }
  for (; c + 16 <= vd; c += 16) pv_tile<KV, R, 2>(p, v, c, sl, ld, nk, corr, o + c, vd, prefetch);
  if (c < vd) pv_tile<KV, R, 1>(p, v, c, sl, ld, nk, corr, o + c, vd, prefetch);
}

// prefetch: pull the V rows one block ahead (decode, where V streams from memory); done by the
// first row tile only.
template <DType KV>
FP_AVX2 void pv(const float* p, int64_t rows, const void* v, const int64_t* sl, int64_t ld, int64_t nk, const float* corr,
                float* o, int64_t vd, bool prefetch) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) pv_rows<KV, 4>(p + r * kBk, v, sl, ld, nk, corr + r, o + r * vd, vd, prefetch && r == 0);
  switch (rows - r) {
    case 3: pv_rows<KV, 3>(p + r * kBk, v, sl, ld, nk, corr + r, o + r * vd, vd, prefetch && r == 0); break;
    case 2: pv_rows<KV, 2>(p + r * kBk, v, sl, ld, nk, corr + r, o + r * vd, vd, prefetch && r == 0); break;
    case 1: pv_rows<KV, 1>(p + r * kBk, v, sl, ld, nk, corr + r, o + r * vd, vd, prefetch && r == 0); break;
    default: break;
  }
}

// ---------------------------------------------------------------- one work item
// Sequence s: KV heads [kvh0, kvh0 + pl.heads_per_item), query block qb, KV split sp. Rows come
// per KV head j in groups of rpg = tokens x group: row j * rpg + r is (token i0 + r / group,
// head (kvh0 + j) * group + r % group). The rows go where `part` says. KV: the pool's dtype.
template <DType KV>
FP_AVX2 void run_item(const AttentionArgs& a, const AttnPlan& pl, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
                      const AttnPartials& part) {
  const int64_t hd = a.head_dim, vd = a.v_dim, g = pl.group, nh = pl.heads_per_item;
  const int64_t seq_end = a.seq_indptr[s + 1], kv_len = a.kv_len[s];
  const int64_t i0 = a.seq_indptr[s] + qb * pl.bq, i1 = std::min(seq_end, i0 + pl.bq), rpg = (i1 - i0) * g, rows = rpg * nh;
  thread_local Scratch sc;
  sc.qs.resize(static_cast<size_t>(rows * hd));
  sc.o.assign(static_cast<size_t>(rows * vd), 0.0f);
  sc.s.resize(static_cast<size_t>(rows * kBk));
  sc.m.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  sc.l.assign(static_cast<size_t>(rows), 0.0f);
  sc.corr.resize(static_cast<size_t>(rows));
  sc.len.resize(static_cast<size_t>(rows));
  sc.first.resize(static_cast<size_t>(rows));
  sc.slots.resize(static_cast<size_t>(2 * kBk));
  auto token = [&](int64_t row) { return i0 + (row % rpg) / g; };
  auto head = [&](int64_t row) { return (kvh0 + row / rpg) * g + (row % rpg) % g; };
  const __m256 scale = _mm256_set1_ps(a.scale);
  int64_t max_len = 0, min_first = std::numeric_limits<int64_t>::max();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = token(r);
    const float* q = a.q + (i * a.n_heads + head(r)) * hd;
    float* qd = sc.qs.data() + r * hd;
    for (int64_t d = 0; d < hd; d += 8) _mm256_storeu_ps(qd + d, _mm256_mul_ps(_mm256_loadu_ps(q + d), scale));
    int64_t len = std::clamp<int64_t>(static_cast<int64_t>(a.pos[i]) + 1, 0, kv_len);
    sc.len[static_cast<size_t>(r)] = len;
    sc.first[static_cast<size_t>(r)] = a.first_visible(a.pos[i]);
    max_len = std::max(max_len, len);
    min_first = std::min(min_first, sc.first[static_cast<size_t>(r)]);
  }
  // A sliding window skips the blocks before the earliest key any row sees.
  const int64_t t_begin = std::max(sp * pl.split_len, min_first / kBk * kBk);
  const int64_t t_end = std::min(max_len, (sp + 1) * pl.split_len);
  const bool packed = rpg >= kPackedMinRows;
  // Decode-like items use each K/V row for few query rows, so K/V stream from memory: prefetch
  // one block ahead, spread through the loops (rows of one head are strided, which the
  // hardware prefetcher follows poorly). Prefill items find K/V in cache; prefetching costs.
  const bool stream = pl.qblocks == 1;
  if (packed) sc.kt.resize(static_cast<size_t>(hd * kBk));
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(a.page_size));
  const int64_t mask = a.page_size - 1;
  const int32_t* pages = a.page_ids + a.page_indptr[s];
  int64_t* sl = sc.slots.data();
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kBk) {
    const int64_t nk = std::min(kBk, t_end - t0);
    // Slots of this block's keys and of the next block's (clamped to the cache, for prefetch).
    for (int64_t t = 0; t < 2 * kBk; ++t) {
      const int64_t tt = std::min(t0 + t, kv_len - 1);
      sl[t] = static_cast<int64_t>(pages[tt >> shift]) * a.page_size + (tt & mask);
    }
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t r0 = j * rpg;
      const void* kb = kv_at<KV>(a.k_pool, (kvh0 + j) * hd);
      float* sr = sc.s.data() + r0 * kBk;
      const float* qs = sc.qs.data() + r0 * hd;
      if (packed) {
        pack_kt<KV>(kb, sl, a.k_stride, nk, hd, sc.kt.data(), stream);
        scores_packed(qs, rpg, hd, sc.kt.data(), nk, sr);
      } else {
        scores_direct<KV>(qs, rpg, hd, kb, sl, a.k_stride, nk, sr);
      }
      for (int64_t r = r0; r < r0 + rpg; ++r) {
        if (a.softcap > 0) softcap_scores(sc.s.data() + r * kBk, nk, a.softcap);
        int64_t valid = std::clamp<int64_t>(sc.len[static_cast<size_t>(r)] - t0, 0, nk);
        // Keys before the row's window: -inf scores (exp8 gives 0), or none left to see.
        const int64_t from = std::clamp<int64_t>(sc.first[static_cast<size_t>(r)] - t0, 0, nk);
        if (from >= valid) valid = 0;
        else std::fill_n(sc.s.data() + r * kBk, from, -std::numeric_limits<float>::infinity());
        sc.corr[static_cast<size_t>(r)] = softmax_step(sc.s.data() + r * kBk, valid, nk, sc.m[static_cast<size_t>(r)],
                                                       sc.l[static_cast<size_t>(r)]);
      }
      pv<KV>(sr, rpg, kv_at<KV>(a.v_pool, (kvh0 + j) * vd), sl, a.v_stride, nk, sc.corr.data() + r0, sc.o.data() + r0 * vd, vd, stream);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = token(r), h = head(r);
    const float* o = sc.o.data() + r * vd;
    float l = sc.l[static_cast<size_t>(r)];
    if (part.m) {  // merge_row adds the sink
      int64_t slot = (i * a.n_heads + h) * part.max_splits + sp;
      part.m[slot] = sc.m[static_cast<size_t>(r)];
      part.l[slot] = l;
      std::copy(o, o + vd, part.o + slot * vd);
    } else {
      float* dst = a.out + (i * a.n_heads + h) * vd;
      float f = l > 0 ? 1.0f / l : 0.0f;  // no visible keys: zeros
      if (a.sinks) {  // the sink's term in the sum: out = O e^(m - m*) / (l e^(m - m*) + e^(sink - m*))
        const float m = sc.m[static_cast<size_t>(r)], mx = std::max(m, a.sinks[h]);
        const float c = std::exp(m - mx);
        f = c / (l * c + std::exp(a.sinks[h] - mx));
      }
      const __m256 inv = _mm256_set1_ps(f);
      for (int64_t c = 0; c < vd; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv));
    }
  }
}

// out row (token i, head h) from its splits' partial states.
FP_AVX2 void merge_row(const AttentionArgs& a, int64_t splits, int64_t max_splits, int64_t row, const float* part_m,
                       const float* part_l, const float* part_o) {
  const int64_t vd = a.v_dim, base = row * max_splits;
  const float sink = a.sinks ? a.sinks[row % a.n_heads] : -std::numeric_limits<float>::infinity();
  float mx = sink;  // a sink is one more logit, with no value
  for (int64_t sp = 0; sp < splits; ++sp) mx = std::max(mx, part_m[base + sp]);
  float* dst = a.out + row * vd;
  if (mx == -std::numeric_limits<float>::infinity()) {
    std::fill(dst, dst + vd, 0.0f);
    return;
  }
  float l = a.sinks ? std::exp(sink - mx) : 0.0f;
  for (int64_t c = 0; c < vd; c += 8) _mm256_storeu_ps(dst + c, _mm256_setzero_ps());
  for (int64_t sp = 0; sp < splits; ++sp) {
    float w = std::exp(part_m[base + sp] - mx);  // 0 for a split that saw no key
    if (w == 0.0f) continue;
    l += w * part_l[base + sp];
    const __m256 vw = _mm256_set1_ps(w);
    const float* o = part_o + (base + sp) * vd;
    for (int64_t c = 0; c < vd; c += 8)
      _mm256_storeu_ps(dst + c, _mm256_fmadd_ps(_mm256_loadu_ps(o + c), vw, _mm256_loadu_ps(dst + c)));
  }
  const __m256 inv = _mm256_set1_ps(1.0f / l);
  for (int64_t c = 0; c < vd; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(dst + c), inv));
}

// ---------------------------------------------------------------- plan and run
// The plan of sequence s: query blocks, heads per item; splits are decided over the whole batch.
AttnPlan make_plan(const AttentionArgs& a, int64_t n_tokens, int64_t max_len, int64_t rows_per_item) {
  AttnPlan p;
  p.max_len = max_len;
  p.group = a.n_heads / a.n_kv_heads;
  p.bq = std::clamp<int64_t>(rows_per_item / p.group, 1, std::max<int64_t>(n_tokens, 1));
  p.qblocks = (n_tokens + p.bq - 1) / p.bq;
  // Few tokens (decode): one item walks all KV heads block by block, reading whole cache rows
  // in order, and the threads split the key range instead of the heads.
  p.heads_per_item = p.qblocks == 1 ? a.n_kv_heads : 1;
  p.splits = 1;
  p.split_len = std::max<int64_t>(kBk, (max_len + kBk - 1) / kBk * kBk);
  return p;
}

void set_splits(AttnPlan& p, int64_t splits, int64_t max_len) {
  p.split_len = (max_len + splits - 1) / splits;
  p.split_len = std::max<int64_t>(kBk, (p.split_len + kBk - 1) / kBk * kBk);
  p.splits = std::max<int64_t>(1, (max_len + p.split_len - 1) / p.split_len);
}

struct Item {
  int32_t seq, kvh0, qb, sp;
};

}  // namespace

void cpu::attention_flash_cpu(const AttentionArgs& a, AttnWideItems* wide) {
  if (a.n <= 0) return;
  std::vector<AttnPlan> plans(static_cast<size_t>(a.n_seqs));
  std::vector<char> wide_seq(static_cast<size_t>(a.n_seqs), 0);  // items that go to `wide`
  std::vector<int64_t> max_lens(static_cast<size_t>(a.n_seqs), 0);
  double work = 0;  // multiply-adds, for the thread decision
  int64_t base_items = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    int64_t& max_len = max_lens[static_cast<size_t>(s)];
    for (int64_t i = a.seq_indptr[s]; i < a.seq_indptr[s + 1]; ++i) {
      int64_t len = std::clamp<int64_t>(static_cast<int64_t>(a.pos[i]) + 1, 0, a.kv_len[s]);
      max_len = std::max(max_len, len);
      work += static_cast<double>(len) * static_cast<double>(a.n_heads * (a.head_dim + a.v_dim));
    }
    AttnPlan& p = plans[static_cast<size_t>(s)];
    const bool taken = wide && wide->takes(a, s);
    wide_seq[static_cast<size_t>(s)] = taken;
    p = make_plan(a, a.seq_indptr[s + 1] - a.seq_indptr[s], max_len, taken ? wide->rows_per_item() : kRowsPerItem);
    if (a.seq_indptr[s + 1] > a.seq_indptr[s]) base_items += (a.n_kv_heads / p.heads_per_item) * p.qblocks;
  }
  const int threads = work < kParallelMinFlops ? 1 : thread_pool().size();
  // Too few items to feed the threads: split long contexts over their keys.
  const int64_t want = 4 * static_cast<int64_t>(threads);
  int64_t max_splits = 1;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t max_len = max_lens[static_cast<size_t>(s)];
    if (threads > 1 && base_items < want && max_len >= 2 * kMinSplitKeys)
      set_splits(plans[static_cast<size_t>(s)], std::min((want + base_items - 1) / base_items, max_len / kMinSplitKeys), max_len);
    max_splits = std::max(max_splits, plans[static_cast<size_t>(s)].splits);
  }
  // Items, most expensive (latest query blocks) first within each sequence.
  std::vector<Item> items;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const AttnPlan& p = plans[static_cast<size_t>(s)];
    if (a.seq_indptr[s + 1] == a.seq_indptr[s]) continue;
    const int64_t kv_items = a.n_kv_heads / p.heads_per_item;
    for (int64_t qb = p.qblocks - 1; qb >= 0; --qb)
      for (int64_t kv = 0; kv < kv_items; ++kv)
        for (int64_t sp = 0; sp < p.splits; ++sp)
          items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(kv * p.heads_per_item), static_cast<int32_t>(qb),
                           static_cast<int32_t>(sp)});
  }
  std::vector<float> part_m, part_l, part_o;
  if (max_splits > 1) {
    const int64_t slots = a.n * a.n_heads * max_splits;
    part_m.resize(static_cast<size_t>(slots));
    part_l.resize(static_cast<size_t>(slots));
    part_o.resize(static_cast<size_t>(slots * a.v_dim));
  }
  const AttnPartials part{part_m.data(), part_l.data(), part_o.data(), max_splits};
  if (wide) wide->prepare(a, plans);
  using ItemFn = void (*)(const AttentionArgs&, const AttnPlan&, int64_t, int64_t, int64_t, int64_t, const AttnPartials&);
  const ItemFn run_item_kv = a.kv_dtype == DType::F16    ? run_item<DType::F16>
                             : a.kv_dtype == DType::BF16 ? run_item<DType::BF16>
                                                         : run_item<DType::F32>;
  auto run_index = [&](int64_t it) {
    const Item& item = items[static_cast<size_t>(it)];
    const AttnPlan& p = plans[static_cast<size_t>(item.seq)];
    const AttnPartials& to = p.splits > 1 ? part : AttnPartials{};
    if (wide_seq[static_cast<size_t>(item.seq)])
      wide->run(a, p, item.seq, item.kvh0, item.qb, item.sp, to);
    else
      run_item_kv(a, p, item.seq, item.kvh0, item.qb, item.sp, to);
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t workers = std::min<int64_t>(threads, n_items);
  if (workers <= 1) {
    for (int64_t it = 0; it < n_items; ++it) run_index(it);
  } else {
    std::atomic<int64_t> next{0};
    thread_pool().parallel_for(workers, 1, [&](int64_t, int64_t) {
      for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < n_items;) run_index(it);
    });
  }
  if (max_splits > 1) {
    for (int64_t s = 0; s < a.n_seqs; ++s) {
      const int64_t splits = plans[static_cast<size_t>(s)].splits;
      if (splits <= 1) continue;
      const int64_t r0 = a.seq_indptr[s] * a.n_heads, r1 = a.seq_indptr[s + 1] * a.n_heads;
      const int64_t grain = std::max<int64_t>(1, (1 << 14) / (splits * a.v_dim));
      thread_pool().parallel_for(r1 - r0, grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) merge_row(a, splits, max_splits, r0 + r, part_m.data(), part_l.data(), part_o.data());
      });
    }
  }
}

std::string cpu::refuse_attention_avx2(const AttentionArgs& a) {
  static const std::string why = cpu_features().missing({"avx2", "fma", "f16c"});
  if (!why.empty()) return why;
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(a.n_kv_heads);
  if (a.head_dim % 8 != 0 || a.v_dim % 8 != 0 || a.head_dim <= 0 || a.v_dim <= 0)
    return "head_dim " + std::to_string(a.head_dim) + " / v_dim " + std::to_string(a.v_dim) + " not a positive multiple of 8";
  if (a.page_size <= 0 || (a.page_size & (a.page_size - 1)) != 0)
    return "page size " + std::to_string(a.page_size) + " is not a power of two (supports 1, 2, 4, ..., any power of two)";
  return refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
}

std::string cpu::refuse_attention_avx2_flash(const AttentionArgs& a) {
  if (std::string why = refuse_attention_avx2(a); !why.empty()) return why;
  return refuse_attention_options(a, {.window = true, .chunk = true, .sinks = true, .softcap = true});
}

namespace {
const bool registered = register_kernel(Kernel<AttentionArgs>{"avx2_flash", Backend::CPU, 100, false, cpu::refuse_attention_avx2_flash,
                                                              [](const AttentionArgs& a) { cpu::attention_flash_cpu(a, nullptr); }});
}  // namespace
}  // namespace fp
