// kernels/cpu/moe_grouped.cpp — the expert FFN grouped by expert: route table -> per expert
// the list of its tokens; each active expert runs once over all its tokens (one batched matmul
// per projection in prefill, a GEMV over only the selected experts in decode), its output
// scattered back with the routing weight. The shared expert runs over the whole batch as one
// more group, concurrently with the routed ones when the experts are spread over the threads.
// The projections go through the matmul op, so the ledger shows their kernels.
// "gemv" (decode, <= 4 tokens, float-like or Q8_0 weights) runs all selected experts' rows in
// two parallel regions instead. Both take gpt-oss's expert biases and clamped SwiGLU.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/moe_gemv.h"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

struct Scratch {
  cpu::AlignedVector<float> x, g, u, y;  // cache-line aligned: the AMX tiles store into them
};

void grow(cpu::AlignedVector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// y[m, dim] = down · (silu(gate · x) ⊙ (up · x)) for x[m, dim]; with expert e's biases and
// activation (gpt-oss) when `a` has them and e >= 0 (the shared expert passes e = -1).
void run_ffn(const MoeFfnArgs& a, int64_t e, const Tensor& gate, const Tensor& up, const Tensor& down, const float* x, int64_t m,
             Scratch& s, float* y) {
  const int64_t ff = gate.rows();
  grow(s.g, m * ff);
  grow(s.u, m * ff);
  const bool plain = e < 0 || a.plain_swiglu();
  auto at = [e](const float* b, int64_t width) { return b ? b + e * width : nullptr; };
  dispatch(MatMulArgs{x, m, &gate, plain ? nullptr : at(a.gate_bias, a.ff), s.g.data()});
  dispatch(MatMulArgs{x, m, &up, plain ? nullptr : at(a.up_bias, a.ff), s.u.data()});
  if (plain || a.activation == MoeActivation::Silu) dispatch(SiluMulArgs{s.g.data(), s.u.data(), m, ff, 0, 0, s.g.data()});
  else moe_gated_activation(a, s.g.data(), s.u.data(), m * ff);
  dispatch(MatMulArgs{s.g.data(), m, &down, plain ? nullptr : at(a.down_bias, a.dim), y});
}

// The work of one forward: (token, expert) pairs bucketed by expert, tokens in increasing order
// within a bucket; slot[j] is where pair j's output row lands (-1: another rank's expert).
struct Buckets {
  std::vector<int32_t> count, start, tok, slot;
};

void bucket(const MoeFfnArgs& a, Buckets& b) {
  const int64_t E = a.n_expert, nk = a.n * a.k;
  b.count.assign(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < nk; ++j) {
    FP_CHECK(a.ids[j] >= 0 && a.ids[j] < E, "moe_ffn: expert id ", a.ids[j], " is outside [0, ", E, ")");
    if (a.is_local(a.ids[j])) ++b.count[static_cast<size_t>(a.ids[j])];
  }
  b.start.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) b.start[static_cast<size_t>(e + 1)] = b.start[static_cast<size_t>(e)] + b.count[static_cast<size_t>(e)];
  b.tok.resize(static_cast<size_t>(nk));
  b.slot.resize(static_cast<size_t>(nk));
  std::vector<int32_t> fill(b.start.begin(), b.start.end() - 1);
  for (int64_t j = 0; j < nk; ++j) {
    const auto e = static_cast<size_t>(a.ids[j]);
    if (!a.is_local(a.ids[j])) {
      b.slot[static_cast<size_t>(j)] = -1;
      continue;
    }
    b.tok[static_cast<size_t>(fill[e])] = static_cast<int32_t>(j / a.k);
    b.slot[static_cast<size_t>(j)] = fill[e]++;
  }
}

// Each active expert (and the shared expert, over every token) is one work item: gather its
// tokens, run its FFN as batched matmuls, write its rows to ys. Items go to threads whole,
// biggest first, when there are enough of them to keep every thread busy; the shared expert then
// runs concurrently with the routed ones, and a forward issues two parallel regions per layer
// instead of three per expert. With few items, each item's matmuls split rows across threads.
void moe_ffn_grouped(const MoeFfnArgs& a) {
  // Per calling thread; the lambdas below run on pool threads too, so they use these references
  // (a thread_local named inside them would be that thread's own, empty, instance).
  static thread_local Buckets tl_buckets;
  static thread_local cpu::AlignedVector<float> tl_rows;
  Buckets& bk = tl_buckets;
  cpu::AlignedVector<float>& ys = tl_rows;
  const int64_t E = a.n_expert, dim = a.dim, nk = a.n * a.k;
  bucket(a, bk);
  grow(ys, (nk + (a.shared_gate ? a.n : 0)) * dim);
  float* shared_y = ys.data() + nk * dim;

  std::vector<int64_t> items;  // expert ids; E stands for the shared expert
  for (int64_t e = 0; e < E; ++e)
    if (bk.count[static_cast<size_t>(e)] > 0) items.push_back(e);
  if (a.shared_gate) items.push_back(E);
  auto rows_of = [&](int64_t e) { return e == E ? a.n : static_cast<int64_t>(bk.count[static_cast<size_t>(e)]); };
  std::stable_sort(items.begin(), items.end(), [&](int64_t p, int64_t q) { return rows_of(p) > rows_of(q); });

  auto run_item = [&](int64_t e) {
    static thread_local Scratch s;
    if (e == E) return run_ffn(a, -1, *a.shared_gate, *a.shared_up, *a.shared_down, a.x, a.n, s, shared_y);
    const int64_t m = bk.count[static_cast<size_t>(e)], b = bk.start[static_cast<size_t>(e)];
    const float* xe = a.x;
    bool identity = m == a.n;  // every token, in order: no gather
    for (int64_t r = 0; identity && r < m; ++r) identity = bk.tok[static_cast<size_t>(b + r)] == r;
    if (!identity) {
      grow(s.x, m * dim);
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(s.x.data() + r * dim, a.x + bk.tok[static_cast<size_t>(b + r)] * dim, static_cast<size_t>(dim) * 4);
      xe = s.x.data();
    }
    run_ffn(a, e, a.gate[e], a.up[e], a.down[e], xe, m, s, ys.data() + b * dim);
  };

  ThreadPool& pool = thread_pool();
  const auto n_items = static_cast<int64_t>(items.size());
  if (pool.size() > 1 && n_items >= 2 * pool.size()) {
    std::atomic<int64_t> next{0};
    pool.parallel_for(pool.size(), 1, [&](int64_t, int64_t) {
      for (int64_t i; (i = next.fetch_add(1)) < n_items;) run_item(items[static_cast<size_t>(i)]);
    });
  } else {
    for (int64_t e : items) run_item(e);
  }

  // out[t] = shared(t) + sum_j w_j * expert_j(t), in the same order whatever ran where.
  pool.parallel_for(a.n, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = a.out + t * dim;
      if (a.shared_gate) {  // weight 1, or Qwen2-MoE's sigmoid gate
        const float ws = a.shared_weight(t);
        for (int64_t c = 0; c < dim; ++c) o[c] = ws * shared_y[t * dim + c];
      } else {
        std::fill(o, o + dim, 0.0f);
      }
      for (int64_t j = 0; j < a.k; ++j) {
        const int32_t slot = bk.slot[static_cast<size_t>(t * a.k + j)];
        if (slot < 0) continue;  // another rank's expert
        const float w = a.weights[t * a.k + j];
        const float* y = ys.data() + static_cast<int64_t>(slot) * dim;
        for (int64_t c = 0; c < dim; ++c) o[c] += w * y[c];
      }
    }
  });
}

// ------------------------------------------------------------------ decode: all experts at once
// A few tokens: every selected expert's gate and up rows of every token in one parallel region,
// then every down projection in a second (the shared expert is one more job per token), instead
// of 3 matmul calls per expert (each a thread wake-up).
void moe_ffn_gemv(const MoeFfnArgs& a) {
  static thread_local cpu::AlignedVector<float> g, u, y;
  struct Group {
    int64_t i;
    const Tensor *gate, *up, *down;
    float w;
    int64_t e;  // expert id, -1 for the shared expert (no biases)
  };
  std::vector<Group> groups;
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t e = a.ids[i * a.k + j];
      FP_CHECK(e >= 0 && e < a.n_expert, "moe_ffn: expert id ", e, " is outside [0, ", a.n_expert, ")");
      if (a.is_local(e)) groups.push_back({i, &a.gate[e], &a.up[e], &a.down[e], a.weights[i * a.k + j], e});
    }
    if (a.shared_gate) groups.push_back({i, a.shared_gate, a.shared_up, a.shared_down, a.shared_weight(i), -1});
  }
  if (groups.empty()) {  // every selection is another rank's and there is no shared expert here
    std::fill(a.out, a.out + a.n * a.dim, 0.0f);
    return;
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
  moe_gemv::run(jobs, 16, /*rounded_x=*/true);
  if (a.plain_swiglu()) {
    dispatch(SiluMulArgs{g.data(), u.data(), 1, off.back(), 0, 0, g.data()});
  } else {  // gpt-oss: the routed experts' biases and activation; the shared expert's plain SwiGLU
    for (size_t q = 0; q < groups.size(); ++q) {
      float *gq = g.data() + off[q], *uq = u.data() + off[q];
      const int64_t ff = off[q + 1] - off[q], e = groups[q].e;
      if (e < 0) {
        dispatch(SiluMulArgs{gq, uq, 1, ff, 0, 0, gq});
        continue;
      }
      for (int64_t c = 0; c < ff; ++c) {
        if (a.gate_bias) gq[c] += a.gate_bias[e * a.ff + c];
        if (a.up_bias) uq[c] += a.up_bias[e * a.ff + c];
      }
      moe_gated_activation(a, gq, uq, ff);
    }
  }
  jobs.clear();
  for (size_t q = 0; q < groups.size(); ++q) jobs.push_back({groups[q].down, g.data() + off[q], y.data() + static_cast<int64_t>(q) * a.dim});
  moe_gemv::run(jobs, 16, /*rounded_x=*/true);
  std::fill(a.out, a.out + a.n * a.dim, 0.0f);
  for (size_t q = 0; q < groups.size(); ++q) {
    float* o = a.out + groups[q].i * a.dim;
    const float* yq = y.data() + static_cast<int64_t>(q) * a.dim;
    const float* db = a.down_bias && groups[q].e >= 0 ? a.down_bias + groups[q].e * a.dim : nullptr;
    if (db)
      for (int64_t c = 0; c < a.dim; ++c) o[c] += groups[q].w * (yq[c] + db[c]);
    else
      for (int64_t c = 0; c < a.dim; ++c) o[c] += groups[q].w * yq[c];
  }
}

std::string refuse_gemv(const MoeFfnArgs& a) {
  if (a.n > 4) return "more than 4 tokens: the grouped batched matmuls are faster";
  static const std::string m = cpu_features().missing({"avx2", "fma", "f16c"});  // fixed for the process
  if (!m.empty()) return m;
  for (int64_t e = a.expert_begin; e < a.local_end(); ++e)
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
