// kernels/cpu/mla_ref.cpp — reference MLA attention: for each query token and head, every
// visible position's key [W_UK_h c | k_pe] and value W_UV_h c are rebuilt from the latent cache
// with plain dequantized dot products, then softmax and the weighted sum. Slow and obvious.
// Latent rows are converted from the pool's dtype (F32/F16/BF16) to f32 as they are read.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

void dequant_row(const Tensor& w, int64_t o, float* dst) {
  const int64_t in = w.cols();
  dequantize_row(w.dtype, w.row_ptr(o), dst, in);
  if (w.block_scale) {
    const int64_t sb = w.scale_block, sc = (in + sb - 1) / sb;
    for (int64_t c = 0; c < in; ++c) dst[c] *= w.block_scale[(o / sb) * sc + c / sb];
  }
}

// Dequantizes a [rows, cols] weight into dst.
void dequant(const Tensor& w, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(w.rows() * w.cols()));
  for (int64_t o = 0; o < w.rows(); ++o) dequant_row(w, o, dst.data() + o * w.cols());
}

void mla_ref(const MlaAttentionArgs& a) {
  const int64_t H = a.n_heads, L = a.kv_lora, qd = a.nope + a.rope;
  std::vector<float> wk, wv, k(static_cast<size_t>(qd)), v, p, latent(static_cast<size_t>(L + a.rope));
  const float* row = latent.data();
  for (int64_t h = 0; h < H; ++h) {
    dequant(a.wk[h], wk);  // [nope, L]
    dequant(a.wv[h], wv);  // [v, L]
    for (int64_t s = 0; s < a.n_seqs; ++s) {
      const int64_t kv_len = a.kv_len[s];
      p.resize(static_cast<size_t>(std::max<int64_t>(kv_len, 1)));
      v.resize(static_cast<size_t>(std::max<int64_t>(kv_len, 1) * a.v_dim));
      for (int64_t i = a.seq_indptr[s]; i < a.seq_indptr[s + 1]; ++i) {
        const float* q = a.q + (i * H + h) * qd;
        const int64_t len = std::min<int64_t>(a.pos[i] + 1, kv_len);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < len; ++t) {
          dequantize_row(a.kv_dtype, kv_element(a.latent_pool, a.kv_dtype, a.slot(s, t) * a.latent_stride), latent.data(), L + a.rope);
          for (int64_t j = 0; j < a.nope; ++j) {
            float acc = 0;
            for (int64_t c = 0; c < L; ++c) acc += wk[static_cast<size_t>(j * L + c)] * row[c];
            k[static_cast<size_t>(j)] = acc;
          }
          for (int64_t j = 0; j < a.rope; ++j) k[static_cast<size_t>(a.nope + j)] = row[L + j];
          for (int64_t j = 0; j < a.v_dim; ++j) {
            float acc = 0;
            for (int64_t c = 0; c < L; ++c) acc += wv[static_cast<size_t>(j * L + c)] * row[c];
            v[static_cast<size_t>(t * a.v_dim + j)] = acc;
          }
          float dot = 0;
          for (int64_t j = 0; j < qd; ++j) dot += q[j] * k[static_cast<size_t>(j)];
          p[static_cast<size_t>(t)] = dot * a.scale;
          mx = std::max(mx, p[static_cast<size_t>(t)]);
        }
        float sum = 0;
        for (int64_t t = 0; t < len; ++t) sum += (p[static_cast<size_t>(t)] = std::exp(p[static_cast<size_t>(t)] - mx));
        float* o = a.out + (i * H + h) * a.v_dim;
        std::fill(o, o + a.v_dim, 0.0f);
        for (int64_t t = 0; t < len; ++t)
          for (int64_t j = 0; j < a.v_dim; ++j) o[j] += p[static_cast<size_t>(t)] / sum * v[static_cast<size_t>(t * a.v_dim + j)];
      }
    }
  }
}

std::string refuse_mla_ref(const MlaAttentionArgs& a) { return refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16}); }

const bool registered = register_kernel(Kernel<MlaAttentionArgs>{"ref", Backend::CPU, 0, true, refuse_mla_ref, mla_ref});

}  // namespace
}  // namespace fp
