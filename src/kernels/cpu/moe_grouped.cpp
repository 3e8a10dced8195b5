// kernels/cpu/moe_grouped.cpp — the expert FFN grouped by expert: route table -> per expert
// the list of its tokens; each active expert runs once over all its tokens (one batched matmul
// per projection in prefill, a GEMV over only the selected experts in decode), its output
// scattered back with the routing weight. The shared expert runs over the whole batch as one
// more group. The projections go through the matmul op, so the ledger shows their kernels.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

struct Scratch {
  std::vector<float> x, g, u, y;
  std::vector<int32_t> count, start, tok;
  std::vector<float> w;
};

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// y[m, dim] = down · (silu(gate · x) ⊙ (up · x)) for x[m, dim].
void run_ffn(const Tensor& gate, const Tensor& up, const Tensor& down, const float* x, int64_t m, Scratch& s, int64_t dim) {
  const int64_t ff = gate.rows();
  grow(s.g, m * ff);
  grow(s.u, m * ff);
  grow(s.y, m * dim);
  dispatch(MatMulArgs{x, m, &gate, nullptr, s.g.data()});
  dispatch(MatMulArgs{x, m, &up, nullptr, s.u.data()});
  dispatch(SiluMulArgs{s.g.data(), s.u.data(), m, ff, 0, 0, s.g.data()});
  dispatch(MatMulArgs{s.g.data(), m, &down, nullptr, s.y.data()});
}

void moe_ffn_grouped(const MoeFfnArgs& a) {
  static thread_local Scratch s;
  const int64_t E = a.n_expert, dim = a.dim, nk = a.n * a.k;
  // Bucket the (token, weight) pairs by expert, tokens in increasing order within a bucket.
  s.count.assign(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < nk; ++j) {
    FP_CHECK(a.ids[j] >= 0 && a.ids[j] < E, "moe_ffn: expert id ", a.ids[j], " is outside [0, ", E, ")");
    ++s.count[static_cast<size_t>(a.ids[j])];
  }
  s.start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) s.start[static_cast<size_t>(e + 1)] = s.start[static_cast<size_t>(e)] + s.count[static_cast<size_t>(e)];
  s.tok.resize(static_cast<size_t>(nk));
  s.w.resize(static_cast<size_t>(nk));
  std::vector<int32_t> fill(s.start.begin(), s.start.end() - 1);
  for (int64_t j = 0; j < nk; ++j) {
    const auto e = static_cast<size_t>(a.ids[j]);
    s.tok[static_cast<size_t>(fill[e])] = static_cast<int32_t>(j / a.k);
    s.w[static_cast<size_t>(fill[e])] = a.weights[j];
    ++fill[e];
  }

  // The shared expert first: it covers every token, so its output initialises `out`.
  if (a.shared_gate) {
    run_ffn(*a.shared_gate, *a.shared_up, *a.shared_down, a.x, a.n, s, dim);
    std::memcpy(a.out, s.y.data(), static_cast<size_t>(a.n * dim) * 4);
  } else {
    std::fill(a.out, a.out + a.n * dim, 0.0f);
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = s.count[static_cast<size_t>(e)], b = s.start[static_cast<size_t>(e)];
    if (m == 0) continue;
    const float* xe = a.x;
    bool identity = m == a.n;  // every token, in order: no gather
    for (int64_t r = 0; identity && r < m; ++r) identity = s.tok[static_cast<size_t>(b + r)] == r;
    if (!identity) {
      grow(s.x, m * dim);
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(s.x.data() + r * dim, a.x + s.tok[static_cast<size_t>(b + r)] * dim, static_cast<size_t>(dim) * 4);
      xe = s.x.data();
    }
    run_ffn(a.gate[e], a.up[e], a.down[e], xe, m, s, dim);
    for (int64_t r = 0; r < m; ++r) {
      float* o = a.out + s.tok[static_cast<size_t>(b + r)] * dim;
      const float* y = s.y.data() + r * dim;
      const float w = s.w[static_cast<size_t>(b + r)];
      for (int64_t c = 0; c < dim; ++c) o[c] += w * y[c];
    }
  }
}

const bool registered = register_kernel(Kernel<MoeFfnArgs>{"grouped", Backend::CPU, 100, false, nullptr, moe_ffn_grouped});

}  // namespace
}  // namespace fp
