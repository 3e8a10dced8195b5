// kernels/cpu/reference.cpp — the plain reference kernel of every op: obviously right,
// single-threaded, the oracle that tests compare fast kernels against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {


// ---- embedding ----
void embedding_ref(const EmbeddingArgs& a) {
  const Tensor& t = *a.table;
  int64_t vocab = t.rows(), dim = t.cols();
  for (int64_t i = 0; i < a.n; ++i) {
    int32_t id = a.ids[i];
    FP_CHECK(id >= 0 && id < vocab, "embedding: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
    dequantize_row(t.dtype, t.row_ptr(id), a.out + i * dim, dim);
    if (a.scale != 1.0f)
      for (int64_t j = 0; j < dim; ++j) a.out[i * dim + j] *= a.scale;
  }
}

// ---- matmul: dequantize each weight row, dot with every activation row ----
void dequant_weight_row(const Tensor& w, int64_t o, float* dst) {
  int64_t in = w.cols();
  dequantize_row(w.dtype, w.row_ptr(o), dst, in);
  if (w.block_scale) {
    int64_t sb = w.scale_block, scale_cols = (in + sb - 1) / sb;
    const float* srow = w.block_scale + (o / sb) * scale_cols;
    for (int64_t c = 0; c < in; ++c) dst[c] *= srow[c / sb];
  }
}

void matmul_ref(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  int64_t out = w.rows(), in = w.cols();
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    dequant_weight_row(w, o, row.data());
    for (int64_t i = 0; i < a.n; ++i) {
      const float* x = a.x + i * in;
      float s = 0;
      for (int64_t c = 0; c < in; ++c) s += x[c] * row[static_cast<size_t>(c)];
      a.y[i * out + o] = s + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// BF16 products: the activations rounded to BF16 first (round to nearest even, inputs below
// the smallest normal float taken as zero, as AVX512-BF16's conversion does), and F16 or
// quantized weights dequantized and rounded the same way: what the avx512bf16 kernel computes
// with vdpbf16ps (llama.cpp's BF16 path does the same for BF16 weights).
std::string refuse_bf16act(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  if (a.w->block_scale || (t != DType::BF16 && t != DType::F16 && !dtype_info(t).quantized))
    return std::string("weights are ") + dtype_name(t) + ", needs BF16, F16 or a GGUF block format";
  return {};
}

void matmul_ref_bf16act(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t in = w.cols(), out = w.rows();
  std::vector<float> xr(static_cast<size_t>(a.n * in)), row(static_cast<size_t>(in));
  for (size_t i = 0; i < xr.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16_daz(a.x[i]));
  for (int64_t o = 0; o < out; ++o) {
    dequant_weight_row(w, o, row.data());
    for (float& v : row) v = bf16_to_f32(f32_to_bf16_daz(v));
    for (int64_t i = 0; i < a.n; ++i) {
      const float* x = xr.data() + i * in;
      float s = 0;
      for (int64_t c = 0; c < in; ++c) s += x[c] * row[static_cast<size_t>(c)];
      a.y[i * out + o] = s + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// ggml semantics for quantized weights: activations are first rounded to 8 bits — Q8_0 blocks
// for Q8_0/Q4_0 weights (integer products per block, scaled by d_w * d_x), Q8_K blocks for the
// K-quants (dequantized weights dotted with the dequantized 8-bit activations).
std::string refuse_q8act(const MatMulArgs& a) {
  DType t = a.w->dtype;
  if (!dtype_info(t).quantized)
    return std::string("weights are ") + dtype_name(t) + ", needs a GGUF block format";
  return {};
}

void matmul_ref_q8k_act(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  int64_t out = w.rows(), in = w.cols(), nb = in / QK_K;
  std::vector<float> xd(static_cast<size_t>(a.n * in)), row(static_cast<size_t>(in));
  std::vector<BlockQ8_K> xq(static_cast<size_t>(nb));
  for (int64_t i = 0; i < a.n; ++i) {
    quantize_act_q8_k(a.x + i * in, xq.data(), in);
    for (int64_t b = 0; b < nb; ++b)
      for (int j = 0; j < QK_K; ++j) xd[static_cast<size_t>(i * in + b * QK_K + j)] = xq[static_cast<size_t>(b)].d * xq[static_cast<size_t>(b)].qs[j];
  }
  for (int64_t o = 0; o < out; ++o) {
    dequantize_row(w.dtype, w.row_ptr(o), row.data(), in);
    for (int64_t i = 0; i < a.n; ++i) {
      float s = 0;
      for (int64_t c = 0; c < in; ++c) s += xd[static_cast<size_t>(i * in + c)] * row[static_cast<size_t>(c)];
      a.y[i * out + o] = s + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// The integer values of block b (32 values) of a row with 32-value blocks, the weight being
// d * q + m: Q8_0 q signed, Q4_0 / Q5_0 q - 8 / q - 16, Q4_1 / Q5_1 unsigned q with a minimum m,
// IQ4_NL the table's levels, MXFP4 its doubled E2M1 levels; IQ4_XS's 32-value block b % 8 of
// super-block b / 8, d its scale.
void block32_ints(DType t, const uint8_t* row, int64_t b, int q[32], float* d, float* m) {
  *m = 0;
  switch (t) {
    case DType::IQ4_NL: case DType::IQ4_XS: {
      const uint8_t* qs;
      if (t == DType::IQ4_NL) {
        const auto& wb = reinterpret_cast<const BlockIQ4_NL*>(row)[b];
        qs = wb.qs;
        *d = f16_to_f32(wb.d);
      } else {
        const auto& wb = reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8];
        qs = wb.qs + 16 * (b % 8);
        *d = f16_to_f32(wb.d) * static_cast<float>(iq4_xs_scale(wb, static_cast<int>(b % 8)));
      }
      for (int j = 0; j < 16; ++j) {
        q[j] = kIq4nlValues[qs[j] & 15];
        q[j + 16] = kIq4nlValues[qs[j] >> 4];
      }
      return;
    }
    case DType::Q8_0: {
      const auto& wb = reinterpret_cast<const BlockQ8_0*>(row)[b];
      for (int j = 0; j < 32; ++j) q[j] = wb.qs[j];
      *d = f16_to_f32(wb.d);
      return;
    }
    case DType::MXFP4: {  // E2M1 levels doubled to integers, d = 2^(e - 128)
      const auto& wb = reinterpret_cast<const BlockMXFP4*>(row)[b];
      for (int j = 0; j < 16; ++j) {
        q[j] = kMxfp4Values[wb.qs[j] & 15];
        q[j + 16] = kMxfp4Values[wb.qs[j] >> 4];
      }
      *d = mxfp4_half_scale(wb.e);
      return;
    }
    case DType::Q4_0: case DType::Q4_1: {
      const uint8_t* qs = t == DType::Q4_0 ? reinterpret_cast<const BlockQ4_0*>(row)[b].qs : reinterpret_cast<const BlockQ4_1*>(row)[b].qs;
      for (int j = 0; j < 16; ++j) {
        q[j] = qs[j] & 0xf;
        q[j + 16] = qs[j] >> 4;
      }
      break;
    }
    case DType::Q5_0: case DType::Q5_1: {
      uint8_t u[32];
      if (t == DType::Q5_0) q5_values(reinterpret_cast<const BlockQ5_0*>(row)[b].qs, reinterpret_cast<const BlockQ5_0*>(row)[b].qh, u);
      else q5_values(reinterpret_cast<const BlockQ5_1*>(row)[b].qs, reinterpret_cast<const BlockQ5_1*>(row)[b].qh, u);
      for (int j = 0; j < 32; ++j) q[j] = u[j];
      break;
    }
    default: fail("block32_ints: ", dtype_name(t));
  }
  switch (t) {
    case DType::Q4_0: *d = f16_to_f32(reinterpret_cast<const BlockQ4_0*>(row)[b].d); for (int j = 0; j < 32; ++j) q[j] -= 8; return;
    case DType::Q5_0: *d = f16_to_f32(reinterpret_cast<const BlockQ5_0*>(row)[b].d); for (int j = 0; j < 32; ++j) q[j] -= 16; return;
    case DType::Q4_1:
      *d = f16_to_f32(reinterpret_cast<const BlockQ4_1*>(row)[b].d);
      *m = f16_to_f32(reinterpret_cast<const BlockQ4_1*>(row)[b].m);
      return;
    default:
      *d = f16_to_f32(reinterpret_cast<const BlockQ5_1*>(row)[b].d);
      *m = f16_to_f32(reinterpret_cast<const BlockQ5_1*>(row)[b].m);
      return;
  }
}

// 32-value block formats (and IQ4_XS, whose blocks of 32 each have a scale) against Q8_0
// activations: per block d_w * d_x * sum(q_w * q_x), plus for Q4_1 / Q5_1 m_w * d_x * sum(q_x)
// (ggml's Q8_1 activations carry that sum).
void matmul_ref_q8act(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const bool block32_x8 = is_block32_x8(w.dtype);
  const bool iq4_xs = w.dtype == DType::IQ4_XS || w.dtype == DType::IQ4_XS_X8;
  if (w.dtype != DType::Q8_0_X8 && !block32_x8 && !iq4_xs && dtype_info(w.dtype).block_elems == QK_K)
    return matmul_ref_q8k_act(a);  // the K-quants
  int64_t out = w.rows(), in = w.cols(), nb = in / QK8_0;
  std::vector<BlockQ8_0> xq(static_cast<size_t>(a.n * nb));
  for (int64_t i = 0; i < a.n; ++i) quantize_row_q8_0(a.x + i * in, xq.data() + i * nb, in);
  std::vector<BlockQ5_1> unpacked(static_cast<size_t>(w.dtype == DType::Q8_0_X8 || block32_x8 || iq4_xs ? nb * 2 : 0));  // >= nb Q8_0 blocks
  int q[32];
  for (int64_t o = 0; o < out; ++o) {
    // The _X8 forms: the row's blocks back in their file format and order (the repacking is exact).
    const uint8_t* row = w.row_ptr(o);
    DType t = w.dtype;
    if (t == DType::Q8_0_X8) {
      unpack_q8_0_x8(reinterpret_cast<const BlockQ8_0x8*>(row), reinterpret_cast<BlockQ8_0*>(unpacked.data()), nb / 8);
      row = reinterpret_cast<const uint8_t*>(unpacked.data());
      t = DType::Q8_0;
    } else if (block32_x8) {
      unpack_block32_x8_row(t, row, unpacked.data(), in);
      row = reinterpret_cast<const uint8_t*>(unpacked.data());
      t = block32_base(t);
    } else if (t == DType::IQ4_XS_X8) {
      unpack_iq4_xs_x8(reinterpret_cast<const BlockIQ4_XSx8*>(row), reinterpret_cast<BlockIQ4_XS*>(unpacked.data()), nb / 8);
      row = reinterpret_cast<const uint8_t*>(unpacked.data());
      t = DType::IQ4_XS;
    }
    for (int64_t i = 0; i < a.n; ++i) {
      const BlockQ8_0* xb = xq.data() + i * nb;
      float s = 0;
      for (int64_t b = 0; b < nb; ++b) {
        float dw, mw;
        block32_ints(t, row, b, q, &dw, &mw);
        int32_t isum = 0, xsum = 0;
        for (int j = 0; j < 32; ++j) {
          isum += q[j] * xb[b].qs[j];
          xsum += xb[b].qs[j];
        }
        const float dx = f16_to_f32(xb[b].d);
        s += static_cast<float>(isum) * dw * dx + mw * dx * static_cast<float>(xsum);
      }
      a.y[i * out + o] = s + (a.bias ? a.bias[o] : 0.0f);
    }
  }
}

// ---- element-wise ----
void rmsnorm_ref(const RmsNormArgs& a) {
  FP_CHECK(!a.q8 || a.d % QK8_0 == 0, "rmsnorm: Q8_0 output needs rows that are a multiple of 32 (d = ", a.d, ")");
  FP_CHECK(!a.add == !a.sum, "rmsnorm: a residual needs both add and sum");
  for (int64_t i = 0; i < a.n; ++i) {
    const float* x = a.x + i * a.row_stride();
    float* y = a.out + i * a.row_stride();
    if (a.add) {  // the residual first: the row normalised is the sum
      const float* r = a.add + i * a.row_stride();
      float* s = a.sum + i * a.row_stride();
      for (int64_t j = 0; j < a.d; ++j) s[j] = x[j] + r[j];
      x = s;
    }
    float ss = 0;
    for (int64_t j = 0; j < a.d; ++j) ss += x[j] * x[j];
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(a.d) + a.eps);
    for (int64_t j = 0; j < a.d; ++j) y[j] = x[j] * inv * a.weight[j];
    if (a.q8) quantize_row_q8_0(y, a.q8 + i * (a.d / QK8_0), a.d);
    if (a.bf16)
      for (int64_t j = 0; j < a.d; ++j) a.bf16[i * a.d + j] = f32_to_bf16(y[j]);
  }
}

void rope_ref(const RopeArgs& a) {
  int64_t half = a.rot_dim / 2;
  for (int64_t t = 0; t < a.n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float angle = static_cast<float>(a.pos[t]) * a.inv_freq[i];
      float c = std::cos(angle) * a.mscale, s = std::sin(angle) * a.mscale;
      for (int64_t h = 0; h < a.n_heads; ++h) {
        float* x = a.x + t * a.row_stride + h * a.head_dim;
        int64_t i0 = a.style == RopeStyle::Adjacent ? 2 * i : i;
        int64_t i1 = a.style == RopeStyle::Adjacent ? 2 * i + 1 : i + half;
        float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
      }
    }
  }
}

void silu_mul_ref(const SiluMulArgs& a) {
  int64_t gs = a.gate_stride ? a.gate_stride : a.d, us = a.up_stride ? a.up_stride : a.d;
  for (int64_t i = 0; i < a.n; ++i)
    for (int64_t j = 0; j < a.d; ++j) {
      float g = a.gate[i * gs + j];
      a.out[i * a.d + j] = g / (1.0f + std::exp(-g)) * a.up[i * us + j];
      if (a.bf16) a.bf16[i * a.d + j] = f32_to_bf16(a.out[i * a.d + j]);
    }
}

// gelu_tanh(g) * u, the tanh written out as in transformers' gelu_pytorch_tanh.
void gelu_mul_ref(const GeluMulArgs& a) {
  const int64_t gs = a.gate_stride ? a.gate_stride : a.d, us = a.up_stride ? a.up_stride : a.d;
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (int64_t i = 0; i < a.n; ++i)
    for (int64_t j = 0; j < a.d; ++j) {
      const double g = a.gate[i * gs + j];
      const double gelu = 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g)));
      a.out[i * a.d + j] = static_cast<float>(gelu * a.up[i * us + j]);
      if (a.bf16) a.bf16[i * a.d + j] = f32_to_bf16(a.out[i * a.d + j]);
    }
}

void add_ref(const AddArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) a.out[i] = a.a[i] + a.b[i];
}

void softcap_ref(const SoftcapArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) a.x[i] = a.cap * std::tanh(a.x[i] / a.cap);
}

void softmax_ref(const SoftmaxArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) {
    float* x = a.x + i * a.d;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < a.d; ++j) mx = std::max(mx, x[j]);
    // The sum in double: over a 150k-wide vocabulary a float running sum is off by ~2e-4, more
    // than the fast kernels it checks (seen against the CUDA kernel's tree sum on the H200).
    double sum = 0;
    for (int64_t j = 0; j < a.d; ++j) {
      x[j] = std::exp(x[j] - mx);
      sum += x[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < a.d; ++j) x[j] *= inv;
  }
}

void argmax_ref(const ArgmaxArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) {
    const float* x = a.x + i * a.d;
    int64_t best = 0;
    for (int64_t j = 1; j < a.d; ++j)
      if (x[j] > x[best]) best = j;
    a.out[i] = static_cast<int32_t>(best);
  }
}

void token_feed_ref(const TokenFeedArgs& a) {
  for (int64_t i = 0; i < a.n; ++i)
    if (a.from_row[i] >= 0) a.tokens[i] = a.ids[a.from_row[i]];
}

// ---- attention: scores, softmax, weighted sum; one query token and head at a time ----
// A sliding window starts the keys at first_visible(pos); a sink joins the softmax's sum; a
// softcap bounds each score (softcap * tanh(s / softcap)) before the softmax.
// K/V rows are converted from the pool's dtype to f32 as they are read. With bf16_wide, the
// prefill-like sequences (AttentionArgs::wide) take q * scale, K and V rounded to BF16, as
// amx_flash multiplies them (`ref_bf16`); the softmax and sums stay f32.
void attention_ref_rounding(const AttentionArgs& a, bool bf16_wide) {
  int64_t group = a.n_heads / a.n_kv_heads;
  std::vector<float> p, qs(static_cast<size_t>(a.head_dim)), k(static_cast<size_t>(a.head_dim)), v(static_cast<size_t>(a.v_dim));
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t kv_len = a.kv_len[s];
    p.resize(static_cast<size_t>(std::max<int64_t>(kv_len, 1)));
    const bool round = bf16_wide && a.wide(s);
    auto rounded = [&](std::vector<float>& x) {
      if (round)
        for (float& e : x) e = bf16_to_f32(f32_to_bf16_daz(e));
    };
    for (int64_t i = a.seq_indptr[s]; i < a.seq_indptr[s + 1]; ++i) {
      int64_t len = std::min<int64_t>(a.pos[i] + 1, kv_len);
      const int64_t first = std::min(a.first_visible(a.pos[i]), len);  // sliding window
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const float* q = a.q + (i * a.n_heads + h) * a.head_dim;
        for (int64_t j = 0; j < a.head_dim; ++j) qs[static_cast<size_t>(j)] = round ? q[j] * a.scale : q[j];
        rounded(qs);
        int64_t kvh = h / group;
        // A sink is one more logit in the softmax, with no value.
        float mx = a.sinks ? a.sinks[h] : -std::numeric_limits<float>::infinity();
        for (int64_t t = first; t < len; ++t) {
          dequantize_row(a.kv_dtype, kv_element(a.k_pool, a.kv_dtype, a.slot(s, t) * a.k_stride + kvh * a.head_dim), k.data(),
                         a.head_dim);
          rounded(k);
          float dot = 0;
          for (int64_t j = 0; j < a.head_dim; ++j) dot += qs[static_cast<size_t>(j)] * k[static_cast<size_t>(j)];
          float sc = round ? dot : dot * a.scale;
          if (a.softcap > 0) sc = a.softcap * std::tanh(sc / a.softcap);
          p[static_cast<size_t>(t)] = sc;
          mx = std::max(mx, sc);
        }
        float sum = a.sinks ? std::exp(a.sinks[h] - mx) : 0.0f;
        for (int64_t t = first; t < len; ++t) sum += (p[static_cast<size_t>(t)] = std::exp(p[static_cast<size_t>(t)] - mx));
        float* o = a.out + (i * a.n_heads + h) * a.v_dim;
        std::fill(o, o + a.v_dim, 0.0f);
        for (int64_t t = first; t < len; ++t) {
          dequantize_row(a.kv_dtype, kv_element(a.v_pool, a.kv_dtype, a.slot(s, t) * a.v_stride + kvh * a.v_dim), v.data(),
                         a.v_dim);
          rounded(v);
          float w = p[static_cast<size_t>(t)] / sum;
          for (int64_t j = 0; j < a.v_dim; ++j) o[j] += w * v[static_cast<size_t>(j)];
        }
      }
    }
  }
}

void attention_ref(const AttentionArgs& a) { attention_ref_rounding(a, false); }
void attention_ref_bf16(const AttentionArgs& a) { attention_ref_rounding(a, true); }

std::string refuse_attention(const AttentionArgs& a) {
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(a.n_kv_heads);
  return refuse_kv_dtype(a.kv_dtype, {DType::F32, DType::F16, DType::BF16});
}

// ---- kv_write: convert each row to the pool's dtype at its slot ----
void kv_write_ref(const KvWriteArgs& a) {
  const int64_t kb = row_bytes(a.dtype, a.k_width), vb = row_bytes(a.dtype, a.v_width);
  for (int64_t i = 0; i < a.n; ++i) {
    quantize_row(a.dtype, a.k_rows + i * a.k_width, static_cast<uint8_t*>(a.k_pool) + a.slots[i] * kb, a.k_width);
    if (a.v_width)
      quantize_row(a.dtype, a.v_rows + i * a.v_width, static_cast<uint8_t*>(a.v_pool) + a.slots[i] * vb, a.v_width);
  }
}

// ---- kv_move: stored rows between slots and packed rows, as they are ----
void kv_move_ref(const KvMoveArgs& a) {
  const size_t kb = static_cast<size_t>(a.k_row_bytes), vb = static_cast<size_t>(a.v_row_bytes);
  auto* k = static_cast<uint8_t*>(a.k_pool);
  auto* v = static_cast<uint8_t*>(a.v_pool);
  for (int64_t i = 0; i < a.n; ++i) {
    uint8_t* row = static_cast<uint8_t*>(a.packed) + static_cast<size_t>(a.rows ? a.rows[i] : i) * (kb + vb);
    uint8_t* ks = k + static_cast<size_t>(a.slots[i]) * kb;
    uint8_t* vs = vb ? v + static_cast<size_t>(a.slots[i]) * vb : nullptr;
    if (a.into_pool) {
      std::memcpy(ks, row, kb);
      if (vb) std::memcpy(vs, row + kb, vb);
    } else {
      std::memcpy(row, ks, kb);
      if (vb) std::memcpy(row + kb, vs, vb);
    }
  }
}

template <class Args>
Kernel<Args> ref(void (*run)(const Args&), std::string (*refuse)(const Args&) = nullptr, const char* name = "ref") {
  Kernel<Args> k;
  k.name = name;
  k.backend = Backend::CPU;
  k.priority = 0;
  k.reference = true;
  if (refuse) k.refuse = refuse;
  k.run = run;
  return k;
}

const bool registered = [] {
  register_kernel(ref<EmbeddingArgs>(embedding_ref));
  register_kernel(ref<MatMulArgs>(matmul_ref));
  register_kernel(ref<MatMulArgs>(matmul_ref_q8act, refuse_q8act, "ref_q8act"));
  register_kernel(ref<MatMulArgs>(matmul_ref_bf16act, refuse_bf16act, "ref_bf16act"));
  register_kernel(ref<RmsNormArgs>(rmsnorm_ref));
  register_kernel(ref<RopeArgs>(rope_ref));
  register_kernel(ref<AttentionArgs>(attention_ref, refuse_attention));
  register_kernel(ref<AttentionArgs>(attention_ref_bf16, refuse_attention, "ref_bf16"));
  register_kernel(ref<KvWriteArgs>(kv_write_ref));
  register_kernel(ref<KvMoveArgs>(kv_move_ref));
  register_kernel(ref<SiluMulArgs>(silu_mul_ref));
  register_kernel(ref<GeluMulArgs>(gelu_mul_ref));
  register_kernel(ref<AddArgs>(add_ref));
  register_kernel(ref<SoftmaxArgs>(softmax_ref));
  register_kernel(ref<SoftcapArgs>(softcap_ref));
  register_kernel(ref<ArgmaxArgs>(argmax_ref));
  register_kernel(ref<TokenFeedArgs>(token_feed_ref));
  return true;
}();

}  // namespace
}  // namespace fp
