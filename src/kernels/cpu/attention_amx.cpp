// kernels/cpu/attention_amx.cpp — amx_flash: causal attention of prefill-like sequences on
// AMX tiles (BF16 products, f32 sums), flash style with an online softmax; the other sequences of
// the call (decode) go to the f32 items of avx2_flash through the shared driver (attention_cpu.h).
//
// It reads a BF16 cache only (K and V multiplied as stored; F16 and F32 caches keep their
// precision on avx2_flash). A sequence is taken when AttentionArgs::wide says so (>= 4 query
// tokens and >= 16 query rows per KV head). Its work, per item (a block of query rows of one KV head, as the f32 items):
//   S = Qs Kᵀ        16 rows x 64 keys per row tile: Qs = q * scale rounded to BF16 (A tiles,
//                    straight from the item's rows), Kᵀ from K tiles packed once per call;
//   P = e^(S - m')   the online softmax of attention_avx2.cpp, 16 lanes at a time, P rounded to
//                    BF16 (the sum l adds the rounded values, so the weights stay a convex mix);
//   O = O e^(m - m') + P V   O's rows rescaled in memory, then loaded as C tiles, P as A tiles,
//                    V from tiles packed once per call.
// Packing (prepare): every wide sequence's K and V rows up to the last key its queries see go,
// per (sequence, KV head, block of 64 keys), into B-tile layout: K as [d/32][key/16] tiles whose
// row p holds dims 2p, 2p+1 of 16 keys; V as [key/32][column/16] tiles whose row p holds keys
// 2p, 2p+1 of 16 columns. Head dims are padded with zeros to 32, value dims to 16, the last
// block's missing keys are zeros (their scores are masked). The items then load whole tiles.
//
// What differs from the f32 kernel: the inputs rounded to BF16 (relative 2^-9) and P rounded to
// BF16; the reference twin `ref_bf16` (reference.cpp) rounds the same inputs, so a test against it
// sees only P's rounding and the order of sums (tests/backend_ops_attention_test.cpp).
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

struct Dims {
  int64_t hd, vd, hdp, vdp;  // hdp: head dim padded to 32, vdp: value dim padded to 16
  int64_t dsteps() const { return hdp / 32; }
  int64_t ctiles() const { return vdp / 16; }
  int64_t k_tiles() const { return dsteps() * (kBk / 16); }
  int64_t block_tiles() const { return k_tiles() + 2 * ctiles(); }
};

Dims dims_of(const AttentionArgs& a) {
  return {a.head_dim, a.v_dim, (a.head_dim + 31) / 32 * 32, (a.v_dim + 15) / 16 * 16};
}

// ---------------------------------------------------------------- e^x on 16 floats
// exp8 of exp_avx2.h on 16 lanes: x = n ln2 + r, e^r by its degree-6 Taylor polynomial, 2^n by
// vscalefps. Inputs below ln(2^-126) give 0.
FP_AMX_INLINE __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654475f), hi = _mm512_set1_ps(88.0f);
  __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512 y = _mm512_scalef_ps(p, n);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);  // below the range (and -inf): 0
}

FP_AMX_INLINE __mmask16 lanes(int64_t count) {  // the first count (clamped to 0..16) lanes
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// ---------------------------------------------------------------- packing (once per call)
// Pool row `slot` of KV head h as BF16 into dst[0..padded), zeros past n.
void row_to_bf16(const void* pool, DType t, int64_t index, int64_t n, int64_t padded, float* f32, uint16_t* dst) {
  dequantize_row(t, kv_element(pool, t, index), f32, n);
  for (int64_t d = 0; d < n; ++d) dst[d] = f32_to_bf16_daz(f32[d]);
  std::fill(dst + n, dst + padded, uint16_t{0});
}

// Block b (keys b*64 ..) of sequence s, KV head h, keys below `len`, into `tiles`
// (Dims::block_tiles() tiles: K then V).
void pack_block(const AttentionArgs& a, const Dims& dm, int64_t s, int64_t h, int64_t b, int64_t len, uint16_t* tiles,
                float* f32, uint16_t* rows) {
  const int64_t hw = dm.hdp / 2;  // uint32 words per K row
  // K: row t of the block -> rows[t][hdp]; tile (d, kt) row p, word n = word d*16 + p of key kt*16 + n.
  for (int64_t t = 0; t < kBk; ++t) {
    const int64_t key = b * kBk + t;
    if (key < len)
      row_to_bf16(a.k_pool, a.kv_dtype, a.slot(s, key) * a.k_stride + h * dm.hd, dm.hd, dm.hdp, f32, rows + t * dm.hdp);
    else
      std::fill(rows + t * dm.hdp, rows + (t + 1) * dm.hdp, uint16_t{0});
  }
  const auto* kw = reinterpret_cast<const uint32_t*>(rows);
  auto* out = reinterpret_cast<uint32_t*>(tiles);
  for (int64_t d = 0; d < dm.dsteps(); ++d)
    for (int64_t kt = 0; kt < kBk / 16; ++kt) {
      uint32_t* tile = out + (d * (kBk / 16) + kt) * (kTile / 2);
      for (int64_t p = 0; p < 16; ++p)
        for (int64_t n = 0; n < 16; ++n) tile[p * 16 + n] = kw[(kt * 16 + n) * hw + d * 16 + p];
    }
  // V: rows[t][vdp]; tile (ks, ct) row p, word c = (V[ks*32 + 2p][ct*16 + c], V[ks*32 + 2p + 1][ct*16 + c]).
  for (int64_t t = 0; t < kBk; ++t) {
    const int64_t key = b * kBk + t;
    if (key < len)
      row_to_bf16(a.v_pool, a.kv_dtype, a.slot(s, key) * a.v_stride + h * dm.vd, dm.vd, dm.vdp, f32, rows + t * dm.vdp);
    else
      std::fill(rows + t * dm.vdp, rows + (t + 1) * dm.vdp, uint16_t{0});
  }
  uint32_t* v = out + dm.k_tiles() * (kTile / 2);
  for (int64_t ks = 0; ks < 2; ++ks)
    for (int64_t ct = 0; ct < dm.ctiles(); ++ct) {
      uint32_t* tile = v + (ks * dm.ctiles() + ct) * (kTile / 2);
      for (int64_t p = 0; p < 16; ++p) {
        const uint16_t* r0 = rows + (ks * 32 + 2 * p) * dm.vdp + ct * 16;
        const uint16_t* r1 = r0 + dm.vdp;
        for (int64_t c = 0; c < 16; ++c) tile[p * 16 + c] = r0[c] | static_cast<uint32_t>(r1[c]) << 16;
      }
    }
}

// ---------------------------------------------------------------- one row tile, one block
FP_AMX void amx_configure() { _tile_loadconfig(&cpu::kAmxTiles); }
FP_AMX void amx_release() { _tile_release(); }

// s[16][64] = q (16 rows of hdp BF16) x the block's K tiles. Tiles 0-3: the four key tiles' sums;
// 4: q; 5-6: K. (The barriers: GCC's tile intrinsics do not name the memory they touch.)
FP_AMX void scores(const uint16_t* q, const Dims& dm, const uint16_t* kb, float* s) {
  asm volatile("" ::: "memory");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t d = 0; d < dm.dsteps(); ++d) {
    const uint16_t* kd = kb + d * 4 * kTile;
    _tile_loadd(4, q + d * 32, dm.hdp * 2);
    _tile_loadd(5, kd, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, kd + kTile, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, kd + 2 * kTile, 64);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, kd + 3 * kTile, 64);
    _tile_dpbf16ps(3, 4, 6);
  }
  _tile_stored(0, s, kBk * 4);
  _tile_stored(1, s + 16, kBk * 4);
  _tile_stored(2, s + 32, kBk * 4);
  _tile_stored(3, s + 48, kBk * 4);
  asm volatile("" ::: "memory");
}

// o[16][vdp] += p[16][64 BF16] x the block's V tiles, up to four column tiles at a time.
// Tiles 0-3: O; 4-5: P's two halves (keys 0-31, 32-63); 6-7: V.
FP_AMX void weighted_sum(const uint16_t* p, const Dims& dm, const uint16_t* vb, float* o) {
  asm volatile("" ::: "memory");
  const int64_t ct_all = dm.ctiles(), so = dm.vdp * 4;
  const uint16_t* v0 = vb;                  // keys 0-31
  const uint16_t* v1 = vb + ct_all * kTile;  // keys 32-63
  _tile_loadd(4, p, kBk * 2);
  _tile_loadd(5, p + 32, kBk * 2);
  int64_t ct = 0;
  for (; ct + 4 <= ct_all; ct += 4) {
    float* oc = o + ct * 16;
    _tile_loadd(0, oc, so);
    _tile_loadd(1, oc + 16, so);
    _tile_loadd(2, oc + 32, so);
    _tile_loadd(3, oc + 48, so);
    _tile_loadd(6, v0 + ct * kTile, 64);
    _tile_loadd(7, v1 + ct * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(0, 5, 7);
    _tile_loadd(6, v0 + (ct + 1) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 1) * kTile, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(1, 5, 7);
    _tile_loadd(6, v0 + (ct + 2) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 2) * kTile, 64);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(2, 5, 7);
    _tile_loadd(6, v0 + (ct + 3) * kTile, 64);
    _tile_loadd(7, v1 + (ct + 3) * kTile, 64);
    _tile_dpbf16ps(3, 4, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_stored(0, oc, so);
    _tile_stored(1, oc + 16, so);
    _tile_stored(2, oc + 32, so);
    _tile_stored(3, oc + 48, so);
  }
  for (; ct < ct_all; ++ct) {  // value dims not a multiple of 64: one column tile at a time
    float* oc = o + ct * 16;
    _tile_loadd(0, oc, so);
    _tile_loadd(6, v0 + ct * kTile, 64);
    _tile_loadd(7, v1 + ct * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(0, 5, 7);
    _tile_stored(0, oc, so);
  }
  asm volatile("" ::: "memory");
}

// The online softmax step of 16 rows over the block's keys (attention_avx2.cpp's, on 16 lanes):
// row r sees valid = len[r] - t0 keys (0..64) of s[r]; p[r] = e^(s - m') rounded to BF16
// (zeros past valid), l = l e^(m - m') + sum p, and O's row scaled by e^(m - m').
FP_AMX void softmax_rows(const float* s, const int64_t* len, int64_t t0, float* m, float* l, uint16_t* p, float* o,
                         const Dims& dm) {
  for (int64_t r = 0; r < 16; ++r) {
    const int64_t valid = std::clamp<int64_t>(len[r] - t0, 0, kBk);
    uint16_t* pr = p + r * kBk;
    if (valid == 0) {
      _mm512_store_si512(pr, _mm512_setzero_si512());
      _mm512_store_si512(pr + 32, _mm512_setzero_si512());
      continue;
    }
    const float* sr = s + r * kBk;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t v = 0; v < kBk / 16; ++v) mx = _mm512_mask_max_ps(mx, lanes(valid - 16 * v), mx, _mm512_load_ps(sr + 16 * v));
    const float m_new = std::max(m[r], _mm512_reduce_max_ps(mx));
    const float corr = std::exp(m[r] - m_new);  // 0 on the row's first keys (m = -inf)
    const __m512 vm = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t v = 0; v < kBk / 16; ++v) {
      __m512 e = _mm512_maskz_mov_ps(lanes(valid - 16 * v), exp16(_mm512_sub_ps(_mm512_load_ps(sr + 16 * v), vm)));
      __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e));
      _mm256_store_si256(reinterpret_cast<__m256i*>(pr + 16 * v), b);
      sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
    l[r] = l[r] * corr + _mm512_reduce_add_ps(sum);
    m[r] = m_new;
    if (corr != 1.0f) {
      float* orow = o + r * dm.vdp;
      const __m512 c = _mm512_set1_ps(corr);
      for (int64_t d = 0; d < dm.vdp; d += 16) _mm512_store_ps(orow + d, _mm512_mul_ps(_mm512_load_ps(orow + d), c));
    }
  }
}

// ---------------------------------------------------------------- the wide items
class AmxItems final : public cpu::AttnWideItems {
 public:
  bool takes(const AttentionArgs& a, int64_t s) const override { return a.wide(s); }
  void prepare(const AttentionArgs& a, const std::vector<AttnPlan>& plans) override;
  void run(const AttentionArgs& a, const AttnPlan& p, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
           const AttnPartials& out) override;

 private:
  std::vector<int64_t> seq_tile_, seq_blocks_;  // per sequence: first tile, blocks per KV head
  cpu::AlignedVector<uint16_t>* pack_ = nullptr;
};

void AmxItems::prepare(const AttentionArgs& a, const std::vector<AttnPlan>& plans) {
  const Dims dm = dims_of(a);
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
    std::vector<float> f32(static_cast<size_t>(std::max(dm.hd, dm.vd)));
    std::vector<uint16_t> rows(static_cast<size_t>(kBk * std::max(dm.hdp, dm.vdp)));
    for (int64_t u = u0; u < u1; ++u) {
      const Unit& un = units[static_cast<size_t>(u)];
      const int64_t blocks = seq_blocks_[static_cast<size_t>(un.s)];
      uint16_t* dst = base + (seq_tile_[static_cast<size_t>(un.s)] + (un.h * blocks + un.b) * dm.block_tiles()) * kTile;
      pack_block(a, dm, un.s, un.h, un.b, plans[static_cast<size_t>(un.s)].max_len, dst, f32.data(), rows.data());
    }
  });
}

struct ItemScratch {
  cpu::AlignedVector<uint16_t> q, p;
  cpu::AlignedVector<float> o, s;
  std::vector<float> m, l;
  std::vector<int64_t> len;
};

void AmxItems::run(const AttentionArgs& a, const AttnPlan& pl, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
                   const AttnPartials& out) {
  const Dims dm = dims_of(a);
  const int64_t g = pl.group, i0 = a.seq_indptr[s] + qb * pl.bq, i1 = std::min<int64_t>(a.seq_indptr[s + 1], i0 + pl.bq);
  const int64_t rpg = (i1 - i0) * g, rtiles = (rpg + 15) / 16, rows = rtiles * 16;
  const int64_t kv_len = a.kv_len[s], blocks = seq_blocks_[static_cast<size_t>(s)];
  thread_local ItemScratch sc;
  sc.q.resize(static_cast<size_t>(rows * dm.hdp));
  sc.o.resize(static_cast<size_t>(rows * dm.vdp));
  sc.s.resize(static_cast<size_t>(16 * kBk));
  sc.p.resize(static_cast<size_t>(16 * kBk));
  sc.m.resize(static_cast<size_t>(rows));
  sc.l.resize(static_cast<size_t>(rows));
  sc.len.resize(static_cast<size_t>(rows));
  amx_configure();  // the tile configuration is each thread's own
  for (int64_t j = 0; j < pl.heads_per_item; ++j) {
    const int64_t h = kvh0 + j;
    int64_t max_len = 0;
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t* qd = sc.q.data() + r * dm.hdp;
      if (r >= rpg) {
        std::fill(qd, qd + dm.hdp, uint16_t{0});
        sc.len[static_cast<size_t>(r)] = 0;
        continue;
      }
      const int64_t i = i0 + r / g;
      const float* q = a.q + (i * a.n_heads + h * g + r % g) * dm.hd;
      for (int64_t d = 0; d < dm.hd; ++d) qd[d] = f32_to_bf16_daz(q[d] * a.scale);
      std::fill(qd + dm.hd, qd + dm.hdp, uint16_t{0});
      const int64_t len = std::clamp<int64_t>(static_cast<int64_t>(a.pos[i]) + 1, 0, kv_len);
      sc.len[static_cast<size_t>(r)] = len;
      max_len = std::max(max_len, len);
    }
    std::fill(sc.o.begin(), sc.o.end(), 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    const int64_t t_begin = sp * pl.split_len, t_end = std::min(max_len, t_begin + pl.split_len);
    const uint16_t* head_tiles = pack_->data() + (seq_tile_[static_cast<size_t>(s)] + h * blocks * dm.block_tiles()) * kTile;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += kBk) {
      const uint16_t* kb = head_tiles + (t0 / kBk) * dm.block_tiles() * kTile;
      const uint16_t* vb = kb + dm.k_tiles() * kTile;
      for (int64_t rt = 0; rt < rtiles; ++rt) {
        const int64_t r0 = rt * 16;
        const int64_t* len = sc.len.data() + r0;
        if (*std::max_element(len, len + 16) <= t0) continue;  // no row of the tile sees these keys
        scores(sc.q.data() + r0 * dm.hdp, dm, kb, sc.s.data());
        softmax_rows(sc.s.data(), len, t0, sc.m.data() + r0, sc.l.data() + r0, sc.p.data(), sc.o.data() + r0 * dm.vdp, dm);
        weighted_sum(sc.p.data(), dm, vb, sc.o.data() + r0 * dm.vdp);
      }
    }
    for (int64_t r = 0; r < rpg; ++r) {
      const int64_t i = i0 + r / g, head = h * g + r % g;
      const float* o = sc.o.data() + r * dm.vdp;
      const float l = sc.l[static_cast<size_t>(r)];
      if (out.m) {
        const int64_t slot = (i * a.n_heads + head) * out.max_splits + sp;
        out.m[slot] = sc.m[static_cast<size_t>(r)];
        out.l[slot] = l;
        std::copy(o, o + dm.vd, out.o + slot * dm.vd);
      } else {
        float* dst = a.out + (i * a.n_heads + head) * dm.vd;
        const float inv = l > 0 ? 1.0f / l : 0.0f;  // no visible keys: zeros
        for (int64_t c = 0; c < dm.vd; ++c) dst[c] = o[c] * inv;
      }
    }
  }
  amx_release();
}

std::string refuse_amx_flash(const AttentionArgs& a) {
  static const std::string why = cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"});
  if (!why.empty()) return why;
  if (!amx_tile_permission().empty()) return amx_tile_permission();
  // A BF16 cache only: K and V are then multiplied as stored. Rounding an F16 cache's rows to
  // BF16 would drop 3 of the bits it was chosen to keep (stories260K's logits moved 7e-4 -> 5e-3
  // from an F32 cache's), an F32 cache asks for f32 attention.
  const std::string kv = refuse_kv_dtype(a.kv_dtype, {DType::BF16});
  if (!kv.empty()) return kv + " (products in BF16 would round the cache's rows; --kv-cache-dtype bf16 takes amx_flash)";
  std::string f32_items = cpu::refuse_attention_avx2(a);  // the sequences left to them
  if (!f32_items.empty()) return f32_items;
  for (int64_t s = 0; s < a.n_seqs; ++s)
    if (a.wide(s)) return {};
  return "no sequence of >= " + std::to_string(AttentionArgs::kWideMinTokens) + " query tokens and >= " +
         std::to_string(AttentionArgs::kWideMinRows) + " query rows per KV head (decode stays on avx2_flash's f32 items)";
}

void attention_amx(const AttentionArgs& a) {
  AmxItems items;
  cpu::attention_flash_cpu(a, &items);
}

const bool registered =
    register_kernel(Kernel<AttentionArgs>{"amx_flash", Backend::CPU, 110, false, refuse_amx_flash, attention_amx});

}  // namespace
}  // namespace fp
