// kernels/cpu/moe_ref.cpp — reference kernels of the MoE ops: routing (the only kernel: it is
// O(n * n_expert), negligible beside the experts) and the expert FFN token by token.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

// ---- routing ----
void moe_route_ref(const MoeRouteArgs& a) {
  const int64_t E = a.n_expert, G = std::max<int64_t>(a.n_group, 1), per = E / G;
  std::vector<float> probs(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(std::max(E, G)));
  std::vector<float> gscore(static_cast<size_t>(G));
  std::vector<char> keep(static_cast<size_t>(G));
  for (int64_t i = 0; i < a.n; ++i) {
    const float* l = a.logits + i * E;
    if (a.scoring == MoeScoring::Softmax) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, l[e]);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (probs[static_cast<size_t>(e)] = std::exp(l[e] - mx));
      for (auto& p : probs) p /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) probs[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    for (int64_t e = 0; e < E; ++e) choice[static_cast<size_t>(e)] = probs[static_cast<size_t>(e)] + (a.bias ? a.bias[e] : 0.0f);
    if (G > 1 && a.topk_group < G) {
      for (int64_t g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per;
        if (a.group_score == MoeGroupScore::Max) {
          gscore[static_cast<size_t>(g)] = *std::max_element(c, c + per);
        } else {  // sum of the two largest
          float b0 = -std::numeric_limits<float>::infinity(), b1 = b0;
          for (int64_t j = 0; j < per; ++j) {
            if (c[j] > b0) b1 = b0, b0 = c[j];
            else if (c[j] > b1) b1 = c[j];
          }
          gscore[static_cast<size_t>(g)] = per > 1 ? b0 + b1 : b0;
        }
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::stable_sort(order.begin(), order.begin() + G,
                       [&](int32_t x, int32_t y) { return gscore[static_cast<size_t>(x)] > gscore[static_cast<size_t>(y)]; });
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t g = 0; g < a.topk_group; ++g) keep[static_cast<size_t>(order[static_cast<size_t>(g)])] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[static_cast<size_t>(e / per)]) choice[static_cast<size_t>(e)] = a.masked;
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::stable_sort(order.begin(), order.begin() + E,
                     [&](int32_t x, int32_t y) { return choice[static_cast<size_t>(x)] > choice[static_cast<size_t>(y)]; });
    float sum = 0;
    for (int64_t j = 0; j < a.k; ++j) sum += probs[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      float w = probs[static_cast<size_t>(e)];
      if (a.norm_topk) w /= sum + a.norm_eps;
      a.ids[i * a.k + j] = e;
      a.weights[i * a.k + j] = w * a.scale;
    }
  }
}

std::string refuse_route(const MoeRouteArgs& a) {
  if (a.k <= 0 || a.k > a.n_expert) return "k " + std::to_string(a.k) + " is not in [1, n_expert " + std::to_string(a.n_expert) + "]";
  if (a.n_group < 1 || a.n_expert % a.n_group != 0) return "n_group " + std::to_string(a.n_group) + " does not divide n_expert";
  if (a.topk_group < 1 || a.topk_group > a.n_group) return "topk_group " + std::to_string(a.topk_group) + " is not in [1, n_group]";
  return {};
}

// ---- expert FFN: one token and one expert at a time, weight rows dequantized ----
void weight_row(const Tensor& w, int64_t o, float* dst) {
  const int64_t in = w.cols();
  dequantize_row(w.dtype, w.row_ptr(o), dst, in);
  if (w.block_scale) {
    const int64_t sb = w.scale_block, sc = (in + sb - 1) / sb;
    const float* srow = w.block_scale + (o / sb) * sc;
    for (int64_t c = 0; c < in; ++c) dst[c] *= srow[c / sb];
  }
}

// y[rows of w] = w · x
void matvec(const Tensor& w, const float* x, float* y, std::vector<float>& row) {
  const int64_t in = w.cols();
  row.resize(static_cast<size_t>(in));
  for (int64_t o = 0; o < w.rows(); ++o) {
    weight_row(w, o, row.data());
    float s = 0;
    for (int64_t c = 0; c < in; ++c) s += x[c] * row[static_cast<size_t>(c)];
    y[o] = s;
  }
}

// One expert's FFN of x added to out with weight w. Biases (gpt-oss) may be null; `a` says the
// activation. The shared expert passes a plain SwiGLU.
void ffn_add(const Tensor& g, const Tensor& u, const Tensor& d, const float* x, float w, float* out, int64_t dim,
             const float* gb = nullptr, const float* ub = nullptr, const float* db = nullptr, bool clamped = false,
             float alpha = 0, float limit = 0) {
  std::vector<float> row, gv(static_cast<size_t>(g.rows())), uv(gv.size()), y(static_cast<size_t>(dim));
  matvec(g, x, gv.data(), row);
  matvec(u, x, uv.data(), row);
  for (size_t j = 0; j < gv.size(); ++j) {
    float gj = gv[j] + (gb ? gb[j] : 0.0f), uj = uv[j] + (ub ? ub[j] : 0.0f);
    if (clamped) {  // gpt-oss: gate clamped above, up on both sides, sigmoid(alpha * gate), up + 1
      gj = std::min(gj, limit);
      uj = std::max(-limit, std::min(uj, limit));
      gv[j] = gj * (1.0f / (1.0f + std::exp(-alpha * gj))) * (uj + 1.0f);
    } else {
      gv[j] = gj / (1.0f + std::exp(-gj)) * uj;
    }
  }
  matvec(d, gv.data(), y.data(), row);
  for (int64_t c = 0; c < dim; ++c) out[c] += w * (y[static_cast<size_t>(c)] + (db ? db[c] : 0.0f));
}

void moe_ffn_ref(const MoeFfnArgs& a) {
  const bool clamped = a.activation == MoeActivation::SwigluClamped;
  for (int64_t i = 0; i < a.n; ++i) {
    float* o = a.out + i * a.dim;
    std::fill(o, o + a.dim, 0.0f);
    const float* x = a.x + i * a.dim;
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t e = a.ids[i * a.k + j];
      FP_CHECK(e >= 0 && e < a.n_expert, "moe_ffn: expert id ", e, " is outside [0, ", a.n_expert, ")");
      if (!a.is_local(e)) continue;  // another rank's expert (expert parallel)
      ffn_add(a.gate[e], a.up[e], a.down[e], x, a.weights[i * a.k + j], o, a.dim, a.gate_bias ? a.gate_bias + e * a.ff : nullptr,
              a.up_bias ? a.up_bias + e * a.ff : nullptr, a.down_bias ? a.down_bias + e * a.dim : nullptr, clamped,
              a.swiglu_alpha, a.swiglu_limit);
    }
    if (a.shared_gate) ffn_add(*a.shared_gate, *a.shared_up, *a.shared_down, x, a.shared_weight(i), o, a.dim);
  }
}

const bool registered = [] {
  register_kernel(Kernel<MoeRouteArgs>{"ref", Backend::CPU, 0, true, refuse_route, moe_route_ref});
  register_kernel(Kernel<MoeFfnArgs>{"ref", Backend::CPU, 0, true, nullptr, moe_ffn_ref});
  return true;
}();

}  // namespace
}  // namespace fp
