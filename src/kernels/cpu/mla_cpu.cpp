// kernels/cpu/mla_cpu.cpp — the two execution forms of MLA attention.
//
// "expanded" (prefill): per sequence, the latent rows of every cached position are expanded
//   into per-head keys [W_UK_h c | k_pe] and values W_UV_h c by batched matmuls, then the
//   ordinary attention op runs on them (page size 1 over the expanded buffer). Cost per chunk:
//   T x H x (nope + v) x kv_lora for the expansion, amortised over the chunk's queries.
// "absorbed" (decode): W_UK is folded into the query (q_lat = W_UK_h^T q_nope, [kv_lora]) and W_UV
//   applied after the weighted sum, so attention runs over the latent rows themselves: each
//   cached position costs H x (kv_lora + rope) multiply-adds for the scores and H x kv_lora for
//   the sum, and the cache is read once per token for all heads. Positions are split into
//   chunks across threads (partial softmax per chunk, merged per token).
// The latent cache may hold F32, F16 or BF16: "expanded" converts the rows it copies out,
// "absorbed" widens them in registers as it reads (avx2::load8), never the whole cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/cpu/moe_gemv.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// ------------------------------------------------------------------ expanded form
void mla_expanded(const MlaAttentionArgs& a) {
  static thread_local std::vector<float> c, kn, vv, K, V;
  static thread_local std::vector<int32_t> ids;
  const int64_t H = a.n_heads, L = a.kv_lora, qd = a.nope + a.rope;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t i0 = a.seq_indptr[s], m = a.seq_indptr[s + 1] - i0, T = a.kv_len[s];
    if (m == 0) continue;
    grow(c, T * L);
    grow(kn, T * std::max(a.nope, a.v_dim));
    grow(K, T * H * qd);
    grow(V, T * H * a.v_dim);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = a.slot(s, t) * a.latent_stride;
      float* pe = K.data() + t * H * qd + a.nope;  // head 0's k_pe, copied to the other heads below
      dequantize_row(a.kv_dtype, kv_element(a.latent_pool, a.kv_dtype, row), c.data() + t * L, L);
      dequantize_row(a.kv_dtype, kv_element(a.latent_pool, a.kv_dtype, row + L), pe, a.rope);
      for (int64_t h = 1; h < H; ++h) std::memcpy(pe + h * qd, pe, static_cast<size_t>(a.rope) * 4);
    }
    for (int64_t h = 0; h < H; ++h) {
      dispatch(MatMulArgs{c.data(), T, &a.wk[h], nullptr, kn.data()});
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(K.data() + (t * H + h) * qd, kn.data() + t * a.nope, static_cast<size_t>(a.nope) * 4);
      dispatch(MatMulArgs{c.data(), T, &a.wv[h], nullptr, kn.data()});
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(V.data() + (t * H + h) * a.v_dim, kn.data() + t * a.v_dim, static_cast<size_t>(a.v_dim) * 4);
    }
    ids.resize(static_cast<size_t>(T));
    std::iota(ids.begin(), ids.end(), 0);
    const int32_t seq_indptr[2] = {0, static_cast<int32_t>(m)}, page_indptr[2] = {0, static_cast<int32_t>(T)};
    const int32_t kv_len = static_cast<int32_t>(T);
    AttentionArgs att{};
    att.q = a.q + i0 * H * qd;
    att.pos = a.pos + i0;
    att.n = m;
    att.n_seqs = 1;
    att.seq_indptr = seq_indptr;
    att.n_heads = att.n_kv_heads = H;
    att.head_dim = qd;
    att.v_dim = a.v_dim;
    att.k_pool = K.data();
    att.v_pool = V.data();
    att.k_stride = H * qd;
    att.v_stride = H * a.v_dim;
    att.page_size = 1;
    att.page_indptr = page_indptr;
    att.page_ids = ids.data();
    att.kv_len = &kv_len;
    att.scale = a.scale;
    att.out = a.out + i0 * H * a.v_dim;
    dispatch(att);
  }
}

std::string refuse_expanded(const MlaAttentionArgs& a) {
  if (a.n == a.n_seqs) return "decode (one token per sequence): the absorbed form reads only the latent cache";
  return refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
}

// ------------------------------------------------------------------ absorbed form
// Element j of a latent row (pool elements from row on) as f32, for the tails below 8.
template <DType KV>
float latent_at(const void* pool, int64_t row, int64_t j) {
  if constexpr (KV == DType::F32) return static_cast<const float*>(pool)[row + j];
  if constexpr (KV == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(pool)[row + j]);
  if constexpr (KV == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(pool)[row + j]);
}

// x . (pool elements y0 .. y0 + d)
template <DType KV>
FP_AVX2 float dot_avx2(const float* x, const void* pool, int64_t y0, int64_t d) {
  using avx2::load8;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), load8<KV>(pool, y0 + j), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 8), load8<KV>(pool, y0 + j + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 16), load8<KV>(pool, y0 + j + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 24), load8<KV>(pool, y0 + j + 24), s3);
  }
  for (; j + 8 <= d; j += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), load8<KV>(pool, y0 + j), s0);
  float s = avx2::hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; j < d; ++j) s += x[j] * latent_at<KV>(pool, y0, j);
  return s;
}

// y += w * (pool elements x0 .. x0 + d)
template <DType KV>
FP_AVX2 void axpy_avx2(float w, const void* pool, int64_t x0, float* y, int64_t d) {
  const __m256 vw = _mm256_set1_ps(w);
  int64_t j = 0;
  for (; j + 8 <= d; j += 8)
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(vw, avx2::load8<KV>(pool, x0 + j), _mm256_loadu_ps(y + j)));
  for (; j < d; ++j) y[j] += w * latent_at<KV>(pool, x0, j);
}

constexpr int64_t kChunk = 128;  // positions per work item

// One work item: token i of sequence s over positions [t0, t1): per head the chunk's max score,
// sum of exp(score - max) and the exp-weighted sum of latent rows.
// part = [H] max, [H] sum, [H, L] acc. KV: the latent pool's dtype.
template <DType KV>
FP_AVX2 void latent_chunk(const MlaAttentionArgs& a, const float* q_lat, int64_t i, int64_t s, int64_t t0, int64_t t1,
                          float* part, std::vector<float>& sc) {
  const int64_t H = a.n_heads, L = a.kv_lora, qd = a.nope + a.rope, C = t1 - t0;
  sc.resize(static_cast<size_t>(H * C));
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = a.slot(s, t) * a.latent_stride;
    for (int64_t h = 0; h < H; ++h) {
      const float* ql = q_lat + (i * H + h) * L;
      const float* qpe = a.q + (i * H + h) * qd + a.nope;
      sc[static_cast<size_t>(h * C + (t - t0))] =
          (dot_avx2<KV>(ql, a.latent_pool, row, L) + dot_avx2<KV>(qpe, a.latent_pool, row + L, a.rope)) * a.scale;
    }
  }
  float* mx = part;
  float* sum = part + H;
  float* acc = part + 2 * H;
  for (int64_t h = 0; h < H; ++h) {
    float* p = sc.data() + h * C;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < C; ++t) m = std::max(m, p[t]);
    float l = 0;
    for (int64_t t = 0; t < C; ++t) l += (p[t] = std::exp(p[t] - m));
    mx[h] = m;
    sum[h] = l;
  }
  std::fill(acc, acc + H * L, 0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = a.slot(s, t) * a.latent_stride;
    for (int64_t h = 0; h < H; ++h) axpy_avx2<KV>(sc[static_cast<size_t>(h * C + (t - t0))], a.latent_pool, row, acc + h * L, L);
  }
}

void mla_absorbed(const MlaAttentionArgs& a) {
  static thread_local std::vector<float> q_lat, o_lat, tmp_in, tmp_out, parts;
  const int64_t n = a.n, H = a.n_heads, L = a.kv_lora, qd = a.nope + a.rope, V = a.v_dim;
  grow(q_lat, n * H * L);
  grow(o_lat, n * H * L);
  grow(tmp_in, n * std::max(a.nope, L));
  grow(tmp_out, n * std::max(L, V));
  // Decode: the per-head projections as one parallel region each (see moe_gemv.h).
  const bool fused = n <= 4 && moe_gemv::refuse(a.wk_t[0]).empty() && moe_gemv::refuse(a.wv[0]).empty();
  std::vector<moe_gemv::Job> jobs;
  // q_lat[i, h] = W_UK_h^T q_nope[i, h]
  if (fused) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) jobs.push_back({&a.wk_t[h], a.q + (i * H + h) * qd, q_lat.data() + (i * H + h) * L});
    moe_gemv::run(jobs);
  }
  for (int64_t h = 0; !fused && h < H; ++h) {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(tmp_in.data() + i * a.nope, a.q + (i * H + h) * qd, static_cast<size_t>(a.nope) * 4);
    dispatch(MatMulArgs{tmp_in.data(), n, &a.wk_t[h], nullptr, tmp_out.data()});
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(q_lat.data() + (i * H + h) * L, tmp_out.data() + i * L, static_cast<size_t>(L) * 4);
  }
  // Work items: (token, chunk of its visible positions).
  struct Item {
    int64_t i, s, t0, t1;
  };
  std::vector<Item> items;
  std::vector<int64_t> first(static_cast<size_t>(n + 1), 0);
  for (int64_t s = 0; s < a.n_seqs; ++s)
    for (int64_t i = a.seq_indptr[s]; i < a.seq_indptr[s + 1]; ++i) {
      const int64_t len = std::min<int64_t>(a.pos[i] + 1, a.kv_len[s]);
      first[static_cast<size_t>(i)] = static_cast<int64_t>(items.size());
      for (int64_t t0 = 0; t0 < len; t0 += kChunk) items.push_back({i, s, t0, std::min(len, t0 + kChunk)});
    }
  first[static_cast<size_t>(n)] = static_cast<int64_t>(items.size());
  const int64_t part_size = H * (L + 2);
  grow(parts, static_cast<int64_t>(items.size()) * part_size);
  const float* ql = q_lat.data();
  float* pp = parts.data();
  const auto chunk = a.kv_dtype == DType::F16    ? latent_chunk<DType::F16>
                     : a.kv_dtype == DType::BF16 ? latent_chunk<DType::BF16>
                                                 : latent_chunk<DType::F32>;
  thread_pool().parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    std::vector<float> sc;
    for (int64_t k = b; k < e; ++k) {
      const Item& it = items[static_cast<size_t>(k)];
      chunk(a, ql, it.i, it.s, it.t0, it.t1, pp + k * part_size, sc);
    }
  });
  // Merge the chunks of each token: o_lat = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k0 = first[static_cast<size_t>(i)], k1 = first[static_cast<size_t>(i + 1)];
    for (int64_t h = 0; h < H; ++h) {
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t k = k0; k < k1; ++k) M = std::max(M, pp[k * part_size + h]);
      float* o = o_lat.data() + (i * H + h) * L;
      std::fill(o, o + L, 0.0f);
      float l = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const float f = std::exp(pp[k * part_size + h] - M);
        l += f * pp[k * part_size + H + h];
        const float* acc = pp + k * part_size + 2 * H + h * L;
        for (int64_t j = 0; j < L; ++j) o[j] += f * acc[j];
      }
      for (int64_t j = 0; j < L; ++j) o[j] /= l;
    }
  }
  // out[i, h] = W_UV_h o_lat[i, h]
  if (fused) {
    jobs.clear();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) jobs.push_back({&a.wv[h], o_lat.data() + (i * H + h) * L, a.out + (i * H + h) * V});
    moe_gemv::run(jobs);
    return;
  }
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(tmp_in.data() + i * L, o_lat.data() + (i * H + h) * L, static_cast<size_t>(L) * 4);
    dispatch(MatMulArgs{tmp_in.data(), n, &a.wv[h], nullptr, tmp_out.data()});
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(a.out + (i * H + h) * V, tmp_out.data() + i * V, static_cast<size_t>(V) * 4);
  }
}

std::string refuse_absorbed(const MlaAttentionArgs& a) {
  static const std::string why = cpu_features().missing({"avx2", "fma", "f16c"});
  if (!why.empty()) return why;
  return refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
}

const bool registered = [] {
  register_kernel(Kernel<MlaAttentionArgs>{"expanded", Backend::CPU, 100, false, refuse_expanded, mla_expanded});
  register_kernel(Kernel<MlaAttentionArgs>{"absorbed", Backend::CPU, 50, false, refuse_absorbed, mla_absorbed});
  return true;
}();

}  // namespace
}  // namespace fp
