// kernels/cpu/moe_grouped.cpp — the expert FFN grouped by expert: route table -> per expert
// the list of its tokens; each active expert runs once over all its tokens (one batched matmul
// per projection in prefill, a GEMV over only the selected experts in decode), its output
// scattered back with the routing weight. The shared expert runs over the whole batch as one
// more group. The projections go through the matmul op, so the ledger shows their kernels.
// "gemv" (decode, <= 4 tokens, float-like or Q8_0 weights) runs all selected experts' rows in
// two parallel regions instead.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/moe_gemv.h"
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

// ------------------------------------------------------------------ decode: all experts at once
// A few tokens: every selected expert's gate and up rows of every token in one parallel region,
// then every down projection in a second (the shared expert is one more job per token), instead
// of 3 matmul calls per expert (each a thread wake-up).
void moe_ffn_gemv(const MoeFfnArgs& a) {
  static thread_local std::vector<float> g, u, y;
  struct Group {
    int64_t i;
    const Tensor *gate, *up, *down;
    float w;
  };
  std::vector<Group> groups;
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t e = a.ids[i * a.k + j];
      FP_CHECK(e >= 0 && e < a.n_expert, "moe_ffn: expert id ", e, " is outside [0, ", a.n_expert, ")");
      groups.push_back({i, &a.gate[e], &a.up[e], &a.down[e], a.weights[i * a.k + j]});
    }
    if (a.shared_gate) groups.push_back({i, a.shared_gate, a.shared_up, a.shared_down, 1.0f});
  }
  std::vector<int64_t> off(groups.size() + 1, 0);  // hidden offsets
  for (size_t q = 0; q < groups.size(); ++q) off[q + 1] = off[q] + groups[q].gate->rows();
  grow(g, off.back());
  grow(u, off.back());
  grow(y, static_cast<int64_t>(groups.size()) * a.dim);
  std::vector<moe_gemv::Job> jobs;
  for (size_t q = 0; q < groups.size(); ++q) {
    const float* x = a.x + groups[q].i * a.dim;
    jobs.push_back({groups[q].gate, x, g.data() + off[q]});
    jobs.push_back({groups[q].up, x, u.data() + off[q]});
  }
  moe_gemv::run(jobs);
  dispatch(SiluMulArgs{g.data(), u.data(), 1, off.back(), 0, 0, g.data()});
  jobs.clear();
  for (size_t q = 0; q < groups.size(); ++q) jobs.push_back({groups[q].down, g.data() + off[q], y.data() + static_cast<int64_t>(q) * a.dim});
  moe_gemv::run(jobs);
  std::fill(a.out, a.out + a.n * a.dim, 0.0f);
  for (size_t q = 0; q < groups.size(); ++q) {
    float* o = a.out + groups[q].i * a.dim;
    const float* yq = y.data() + static_cast<int64_t>(q) * a.dim;
    for (int64_t c = 0; c < a.dim; ++c) o[c] += groups[q].w * yq[c];
  }
}

std::string refuse_gemv(const MoeFfnArgs& a) {
  if (a.n > 4) return "more than 4 tokens: the grouped batched matmuls are faster";
  if (std::string m = cpu_features().missing({"avx2", "fma", "f16c"}); !m.empty()) return m;
  for (int64_t e = 0; e < a.n_expert; ++e)
    for (const Tensor* t : {&a.gate[e], &a.up[e], &a.down[e]})
      if (std::string why = moe_gemv::refuse(*t); !why.empty()) return "expert " + std::to_string(e) + ": " + why;
  if (a.shared_gate)
    for (const Tensor* t : {a.shared_gate, a.shared_up, a.shared_down})
      if (std::string why = moe_gemv::refuse(*t); !why.empty()) return "shared expert: " + why;
  return {};
}

const bool registered = [] {
  register_kernel(Kernel<MoeFfnArgs>{"grouped", Backend::CPU, 100, false, nullptr, moe_ffn_grouped});
  register_kernel(Kernel<MoeFfnArgs>{"gemv", Backend::CPU, 110, false, refuse_gemv, moe_ffn_gemv});
  return true;
}();

}  // namespace
}  // namespace fp
