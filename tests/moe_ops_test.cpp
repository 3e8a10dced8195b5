// tests/moe_ops_test.cpp — the MoE and MLA ops: routing semantics on hand-made cases, and every
// kernel of moe_ffn and mla_attention against its reference (tests/backend_ops.h harness).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "backend_ops.h"
#include "core/cpu_features.h"
#include "kernels/cpu/moe_gemv.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"
#include "model/repack.h"

namespace fp {
namespace {

using test::check_kernels;
using test::normalised_error;
using test::random_floats;

// A weight [rows, cols] of `type` from random floats (sd 1/sqrt(cols)), kept alive by the caller.
struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> f32;  // the dequantized values
  Tensor t;
  Weight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
    f32 = random_floats(static_cast<size_t>(rows * cols), seed, 1.0f / std::sqrt(static_cast<float>(cols)));
    const int64_t rb = row_bytes(type, cols);
    bytes.resize(static_cast<size_t>(rb * rows));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, f32.data() + r * cols, bytes.data() + r * rb, cols);
      dequantize_row(type, bytes.data() + r * rb, f32.data() + r * cols, cols);
    }
    t = Tensor::view(bytes.data(), type, {rows, cols});
  }
};

std::vector<int32_t> route(MoeRouteArgs a, const std::vector<float>& logits, std::vector<float>* w = nullptr) {
  std::vector<int32_t> ids(static_cast<size_t>(a.n * a.k));
  std::vector<float> ws(ids.size());
  a.logits = logits.data();
  a.ids = ids.data();
  a.weights = ws.data();
  dispatch(a);
  if (w) *w = ws;
  return ids;
}

TEST(MoeRoute, SoftmaxTopKNormalised) {
  MoeRouteArgs a;
  a.n = 1;
  a.n_expert = 4;
  a.k = 2;
  std::vector<float> l = {0.0f, 2.0f, 1.0f, -1.0f}, w;
  EXPECT_EQ(route(a, l, &w), (std::vector<int32_t>{1, 2}));
  const float z = 1 + std::exp(2.0f) + std::exp(1.0f) + std::exp(-1.0f);
  EXPECT_NEAR(w[0], std::exp(2.0f) / z, 1e-6);
  a.norm_topk = true;
  route(a, l, &w);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6);
  EXPECT_NEAR(w[0], std::exp(2.0f) / (std::exp(2.0f) + std::exp(1.0f)), 1e-6);
}

TEST(MoeRoute, SigmoidBiasSelectsButDoesNotWeight) {
  MoeRouteArgs a;
  a.n = 1;
  a.n_expert = 4;
  a.k = 1;
  a.scoring = MoeScoring::Sigmoid;
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 5.0f}, l = {0.0f, 2.0f, 1.0f, -1.0f}, w;
  a.bias = bias.data();
  a.scale = 2.5f;
  EXPECT_EQ(route(a, l, &w), (std::vector<int32_t>{3}));
  EXPECT_NEAR(w[0], 2.5f / (1 + std::exp(1.0f)), 1e-6);  // sigmoid(-1) * scale, bias not included
}

TEST(MoeRoute, GroupLimited) {
  // 4 groups of 2. V3 (top-2 sum): group 0 {0.9, 0.0}=0.9 loses to group 1 {0.5, 0.5}=1.0.
  MoeRouteArgs a;
  a.n = 1;
  a.n_expert = 8;
  a.k = 2;
  a.scoring = MoeScoring::Sigmoid;
  a.n_group = 4;
  a.topk_group = 1;
  auto logit = [](float p) { return std::log(p / (1 - p)); };
  std::vector<float> l = {logit(0.9f), logit(0.001f), logit(0.5f), logit(0.5f), logit(0.1f), logit(0.1f), logit(0.2f), logit(0.2f)};
  a.group_score = MoeGroupScore::Top2Sum;
  a.masked = -std::numeric_limits<float>::infinity();
  auto ids = route(a, l);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
  // V2 (group max): group 0 wins; its second slot goes to expert 1, the masked ones scoring 0 after it.
  a.group_score = MoeGroupScore::Max;
  a.masked = 0.0f;
  ids = route(a, l);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
}

TEST(MoeRoute, RefusesMoreExpertsThanThereAre) {
  MoeRouteArgs a;
  a.n = 1;
  a.n_expert = 4;
  a.k = 5;
  std::vector<float> l(4, 0.0f);
  EXPECT_THROW(route(a, l), Error);
}

// moe_ffn arguments for n tokens of x routed by ids / w (k per token) over E experts of width ff;
// the caller sets the expert tables, the shared expert, the range and the output.
MoeFfnArgs routed(const std::vector<float>& x, int64_t n, int64_t dim, const std::vector<int32_t>& ids,
                  const std::vector<float>& w, int64_t k, int64_t E, int64_t ff) {
  MoeFfnArgs a;
  a.x = x.data();
  a.n = n;
  a.dim = dim;
  a.ids = ids.data();
  a.weights = w.data();
  a.k = k;
  a.n_expert = E;
  a.ff = ff;
  return a;
}

struct MoeCase {
  DType type;
  int64_t n;
  bool shared;
};

TEST(BackendOps, MoeFfnKernelsMatchReference) {
  const int64_t dim = 64, ff = 32, E = 6, k = 2;
  int checked = 0;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
    std::vector<Weight> gate, up, down;
    for (int64_t e = 0; e < E; ++e) {
      gate.emplace_back(type, ff, dim, static_cast<uint32_t>(100 + e));
      up.emplace_back(type, ff, dim, static_cast<uint32_t>(200 + e));
      down.emplace_back(type, dim, ff, static_cast<uint32_t>(300 + e));
    }
    Weight sg(type, 2 * ff, dim, 401), su(type, 2 * ff, dim, 402), sd(type, dim, 2 * ff, 403);
    std::vector<Tensor> g, u, d;
    for (int64_t e = 0; e < E; ++e) g.push_back(gate[static_cast<size_t>(e)].t), u.push_back(up[static_cast<size_t>(e)].t), d.push_back(down[static_cast<size_t>(e)].t);
    // Expert parallel: this rank holds experts [begin, end) only; the others are empty views
    // (reading one would fail), and the output is the partial sum of the local selections.
    std::vector<Tensor> g_local = g, u_local = u, d_local = d;
    for (int64_t e = 0; e < E; ++e)
      if (e < 2 || e >= 5) g_local[static_cast<size_t>(e)] = u_local[static_cast<size_t>(e)] = d_local[static_cast<size_t>(e)] = Tensor{};
    for (int64_t n : {1, 2, 3, 4, 17})  // 2..4: the decode GEMV, experts shared between tokens
    for (bool local : {false, true}) {
      // 0: no shared expert, 1: weight 1, 2: weight sigmoid(logit) per token (Qwen2-MoE)
      for (int shared : {0, 1, 2}) {
        const auto sh_logits = random_floats(static_cast<size_t>(n), 9, 3.0f);
        auto x = random_floats(static_cast<size_t>(n * dim), 7);
        std::vector<int32_t> ids(static_cast<size_t>(n * k));
        std::vector<float> w(ids.size());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < k; ++j) {
            ids[static_cast<size_t>(i * k + j)] = static_cast<int32_t>((i * 5 + j * 2 + (i % 3)) % E);
            w[static_cast<size_t>(i * k + j)] = 0.3f + 0.2f * static_cast<float>(j);
          }
        auto make = [&](std::vector<float>& out) {
          out.assign(static_cast<size_t>(n * dim), NAN);
          MoeFfnArgs a = routed(x, n, dim, ids, w, k, E, ff);
          a.gate = local ? g_local.data() : g.data();
          a.up = local ? u_local.data() : u.data();
          a.down = local ? d_local.data() : d.data();
          if (local) a.expert_begin = 2, a.expert_end = 5;
          if (shared) a.shared_gate = &sg.t, a.shared_up = &su.t, a.shared_down = &sd.t, a.shared_ff = 2 * ff;
          if (shared == 2) a.shared_logits = sh_logits.data();
          a.out = out.data();
          return a;
        };
        // Q8_0: the matmul kernels round activations to 8 bits, the reference does not; BF16 on
        // a CPU with AVX512-BF16: its matmul rounds them to BF16.
        const bool bf16_act = type == DType::BF16 &&
                              cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}).empty();
        const double tol = type == DType::Q8_0 ? 3e-2 : bf16_act ? 1e-2 : 1e-4;
        checked += check_kernels<MoeFfnArgs>(std::string(dtype_name(type)) + " n=" + std::to_string(n) +
                                                 (shared == 2 ? " +gated shared" : shared ? " +shared" : "") +
                                                 (local ? " experts 2..4" : ""),
                                             make, "ref", tol);
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// gpt-oss's experts: biases on the three projections and the clamped SwiGLU (limit 1, so that
// both clamps bite), or biases under the plain SwiGLU; F32, BF16 and MXFP4 weights (MXFP4's
// kernels round the activations to 8 bits: 3e-2), decode (the GEMV) and prefill (grouped), the
// shared expert (no biases) and an expert-parallel range.
TEST(BackendOps, MoeFfnGptOssExpertsMatchReference) {
  const int64_t dim = 64, ff = 32, E = 5, k = 2;
  std::map<std::string, int> ran;
  for (DType type : {DType::F32, DType::BF16, DType::MXFP4}) {
    std::vector<Weight> gate, up, down;
    for (int64_t e = 0; e < E; ++e) {
      gate.emplace_back(type, ff, dim, static_cast<uint32_t>(500 + e));
      up.emplace_back(type, ff, dim, static_cast<uint32_t>(600 + e));
      down.emplace_back(type, dim, ff, static_cast<uint32_t>(700 + e));
    }
    Weight sg(type, ff, dim, 801), su(type, ff, dim, 802), sd(type, dim, ff, 803);
    std::vector<Tensor> g, u, d;
    for (int64_t e = 0; e < E; ++e) g.push_back(gate[static_cast<size_t>(e)].t), u.push_back(up[static_cast<size_t>(e)].t), d.push_back(down[static_cast<size_t>(e)].t);
    const auto gb = random_floats(static_cast<size_t>(E * ff), 11, 0.5f), ub = random_floats(static_cast<size_t>(E * ff), 12, 0.5f);
    const auto db = random_floats(static_cast<size_t>(E * dim), 13, 0.5f);
    for (int64_t n : {1, 3, 4, 17})
      for (bool clamped : {true, false})
        for (bool shared : {false, true})
          for (bool local : {false, true}) {
            auto x = random_floats(static_cast<size_t>(n * dim), 17);
            std::vector<int32_t> ids(static_cast<size_t>(n * k));
            std::vector<float> w(ids.size());
            for (int64_t i = 0; i < n; ++i)
              for (int64_t j = 0; j < k; ++j) {
                ids[static_cast<size_t>(i * k + j)] = static_cast<int32_t>((i * 3 + j * 2) % E);
                w[static_cast<size_t>(i * k + j)] = 0.6f - 0.2f * static_cast<float>(j);
              }
            auto make = [&](std::vector<float>& out) {
              out.assign(static_cast<size_t>(n * dim), NAN);
              MoeFfnArgs a = routed(x, n, dim, ids, w, k, E, ff);
              a.gate = g.data();
              a.up = u.data();
              a.down = d.data();
              a.gate_bias = gb.data();
              a.up_bias = ub.data();
              a.down_bias = db.data();
              if (clamped) a.activation = MoeActivation::SwigluClamped, a.swiglu_alpha = 1.702f, a.swiglu_limit = 1.0f;
              if (local) a.expert_begin = 1, a.expert_end = 4;
              if (shared) a.shared_gate = &sg.t, a.shared_up = &su.t, a.shared_down = &sd.t, a.shared_ff = ff;
              a.out = out.data();
              return a;
            };
            const bool bf16_act = type == DType::BF16 &&
                                  cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}).empty();
            const double tol = type == DType::MXFP4 ? 3e-2 : bf16_act ? 1e-2 : 1e-4;
            const std::string label = std::string(dtype_name(type)) + " n=" + std::to_string(n) + (clamped ? " clamped" : " silu") +
                                      (shared ? " +shared" : "") + (local ? " experts 1..3" : "");
            for (const char* name : {"grouped", "gemv"})
              ran[name] += check_kernels<MoeFfnArgs>(label, make, "ref", tol,
                                                     [name](const Kernel<MoeFfnArgs>& kk) { return kk.name == name; });
          }
  }
  EXPECT_GT(ran["grouped"], 0);
  if (cpu_features().missing({"avx2", "fma", "f16c"}).empty()) {
    EXPECT_GT(ran["gemv"], 0) << "the decode GEMV took the F32 / BF16 cases";
  }
}

// Qwen2-MoE's gated shared expert, by definition on the reference: with shared_logits the output
// is the routed sum plus sigmoid(logit_i) times the shared expert's output of weight 1.
TEST(MoeOps, GatedSharedExpertIsSigmoidWeighted) {
  const int64_t dim = 32, ff = 16, E = 4, k = 2, n = 5;
  std::vector<Weight> gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate.emplace_back(DType::F32, ff, dim, static_cast<uint32_t>(900 + e));
    up.emplace_back(DType::F32, ff, dim, static_cast<uint32_t>(910 + e));
    down.emplace_back(DType::F32, dim, ff, static_cast<uint32_t>(920 + e));
  }
  Weight sg(DType::F32, 24, dim, 931), su(DType::F32, 24, dim, 932), sd(DType::F32, dim, 24, 933);
  std::vector<Tensor> g, u, d;
  for (int64_t e = 0; e < E; ++e) g.push_back(gate[static_cast<size_t>(e)].t), u.push_back(up[static_cast<size_t>(e)].t), d.push_back(down[static_cast<size_t>(e)].t);
  const auto x = random_floats(static_cast<size_t>(n * dim), 21);
  const std::vector<float> logits = {-4.0f, -0.5f, 0.0f, 1.5f, 6.0f};
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 3 + 1) % E), w[i] = 0.25f + 0.1f * static_cast<float>(i % 3);
  auto run = [&](int shared) {
    std::vector<float> out(static_cast<size_t>(n * dim), NAN);
    MoeFfnArgs a = routed(x, n, dim, ids, w, k, E, ff);
    a.gate = g.data(), a.up = u.data(), a.down = d.data();
    if (shared) a.shared_gate = &sg.t, a.shared_up = &su.t, a.shared_down = &sd.t, a.shared_ff = 24;
    if (shared == 2) a.shared_logits = logits.data();
    a.out = out.data();
    for (auto& kk : OpRegistry<MoeFfnArgs>::instance().kernels())
      if (kk.name == "ref") kk.run(a);
    return out;
  };
  const auto none = run(0), plain = run(1), gated = run(2);
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-logits[static_cast<size_t>(i)]));
    for (int64_t c = 0; c < dim; ++c) {
      const auto at = static_cast<size_t>(i * dim + c);
      EXPECT_NEAR(gated[at], none[at] + s * (plain[at] - none[at]), 1e-5) << "token " << i << " column " << c;
    }
  }
}

// The clamped SwiGLU itself: the gate clamped above only, up on both sides, then
// gate * sigmoid(alpha * gate) * (up + 1).
TEST(MoeOps, ClampedSwigluIsTheDefinition) {
  MoeFfnArgs a;
  a.activation = MoeActivation::SwigluClamped;
  a.swiglu_alpha = 1.702f;
  a.swiglu_limit = 7.0f;
  std::vector<float> g = {-20.0f, -1.0f, 0.0f, 0.5f, 6.9f, 9.0f, 3.0f, 2.0f};
  const std::vector<float> u = {0.0f, 0.5f, 1.0f, -8.0f, 100.0f, 1.0f, -0.5f, -9.0f};
  const std::vector<float> in = g;
  moe_gated_activation(a, g.data(), u.data(), static_cast<int64_t>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double gc = std::min<double>(in[i], 7.0), uc = std::clamp<double>(u[i], -7.0, 7.0);
    EXPECT_NEAR(g[i], gc / (1.0 + std::exp(-1.702 * gc)) * (uc + 1.0), 1e-5) << "gate " << in[i] << " up " << u[i];
  }
}

// The decode GEMVs run the jobs on one weight together (each row dotted with all their x while
// it is in L1): every job's output equals what it gives run alone, bit for bit, for every weight
// form, with and without the integer kernels' rounding of x, jobs of one weight far apart in the
// list and weights of several blocks.
TEST(MoeGemv, JobsOnOneWeightGiveWhatEachGivesAlone) {
  const int64_t rows = 40, cols = 256;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q8_0_X8}) {
    std::vector<Weight> ws;
    for (uint32_t i = 0; i < 3; ++i) ws.emplace_back(type == DType::Q8_0_X8 ? DType::Q8_0 : type, rows, cols, 900 + i);
    if (type == DType::Q8_0_X8) {
      for (Weight& w : ws) ASSERT_TRUE(repack_in_place(w.t));
    }
    if (!moe_gemv::refuse(ws[0].t).empty()) {
      std::printf("skipped %s: %s\n", dtype_name(type), moe_gemv::refuse(ws[0].t).c_str());
      continue;
    }
    std::vector<std::vector<float>> xs;
    for (uint32_t i = 0; i < 5; ++i) xs.push_back(random_floats(static_cast<size_t>(cols), 950 + i));
    // Weight of each job: 0 three times, 1 twice, 2 once, interleaved; x 0..4 (x 1 twice).
    const int wi[] = {0, 1, 0, 2, 1, 0}, xi[] = {0, 1, 2, 3, 1, 4};
    for (bool rounded : {false, true}) {
      std::vector<std::vector<float>> together(6, std::vector<float>(rows, NAN)), alone = together;
      std::vector<moe_gemv::Job> jobs;
      for (int j = 0; j < 6; ++j) jobs.push_back({&ws[static_cast<size_t>(wi[j])].t, xs[static_cast<size_t>(xi[j])].data(), together[static_cast<size_t>(j)].data()});
      moe_gemv::run(jobs, 16, rounded);
      for (int j = 0; j < 6; ++j) {
        moe_gemv::Job one = jobs[static_cast<size_t>(j)];
        one.y = alone[static_cast<size_t>(j)].data();
        moe_gemv::run({one}, 16, rounded);
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(together[static_cast<size_t>(j)][static_cast<size_t>(r)], alone[static_cast<size_t>(j)][static_cast<size_t>(r)])
              << dtype_name(type) << (rounded ? " rounded x" : "") << ": job " << j << " row " << r;
      }
    }
  }
}

// Q8_0 experts repacked at load (Q8_0_X8, rows of 256-value groups), routed and shared: every
// kernel that takes them against the reference; with VNNI the decode GEMV reads them in place.
TEST(BackendOps, MoeFfnKernelsReadRepackedQ8_0Experts) {
  const int64_t dim = 256, ff = 256, E = 4, k = 2;
  std::vector<Weight> gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate.emplace_back(DType::Q8_0, ff, dim, static_cast<uint32_t>(500 + e));
    up.emplace_back(DType::Q8_0, ff, dim, static_cast<uint32_t>(600 + e));
    down.emplace_back(DType::Q8_0, dim, ff, static_cast<uint32_t>(700 + e));
  }
  Weight sg(DType::Q8_0, ff, dim, 801), su(DType::Q8_0, ff, dim, 802), sd(DType::Q8_0, dim, ff, 803);
  std::vector<Tensor> g, u, d;
  for (int64_t e = 0; e < E; ++e) {
    for (Weight* w : {&gate[static_cast<size_t>(e)], &up[static_cast<size_t>(e)], &down[static_cast<size_t>(e)]})
      ASSERT_TRUE(repack_in_place(w->t));
    g.push_back(gate[static_cast<size_t>(e)].t), u.push_back(up[static_cast<size_t>(e)].t), d.push_back(down[static_cast<size_t>(e)].t);
  }
  for (Weight* w : {&sg, &su, &sd}) ASSERT_TRUE(repack_in_place(w->t));
  int gemv_ran = 0;
  for (int64_t n : {1, 3, 9}) {
    auto x = random_floats(static_cast<size_t>(n * dim), 9);
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> w(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) ids[j] = static_cast<int32_t>((j * 3 + j / 2) % E), w[j] = 0.25f + 0.1f * static_cast<float>(j % 2);
    auto make = [&](std::vector<float>& out) {
      out.assign(static_cast<size_t>(n * dim), NAN);
      MoeFfnArgs a = routed(x, n, dim, ids, w, k, E, ff);
      a.gate = g.data(), a.up = u.data(), a.down = d.data();
      a.shared_gate = &sg.t, a.shared_up = &su.t, a.shared_down = &sd.t, a.shared_ff = ff;
      a.out = out.data();
      return a;
    };
    // 8-bit activations against the reference's f32 ones.
    check_kernels<MoeFfnArgs>("Q8_0_X8 n=" + std::to_string(n), make, "ref", 3e-2);
    gemv_ran += check_kernels<MoeFfnArgs>("Q8_0_X8 n=" + std::to_string(n), make, "ref", 3e-2,
                                          [](const Kernel<MoeFfnArgs>& kk) { return kk.name == "gemv"; });
  }
  const bool vnni = cpu_features().missing({"avx512f", "avx512vl", "avx512bw", "avx512_vnni"}).empty() ||
                    cpu_features().missing({"avx_vnni"}).empty();
  if (vnni) {
    EXPECT_GT(gemv_ran, 0) << "the decode GEMV read the repacked experts";
  }
}

// Expert parallel as the model uses it: the ranks' partial outputs (experts split into 1, 2 or 3
// ranges, the shared expert's width split across the ranks) add up to the whole FFN, with every
// kernel the dispatcher picks (gemv for 2 tokens, grouped for 9).
TEST(MoeOps, ExpertRangesAddUpToTheWholeFfn) {
  const int64_t dim = 48, ff = 32, E = 7, k = 3;
  std::vector<Weight> gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate.emplace_back(DType::F32, ff, dim, static_cast<uint32_t>(10 + e));
    up.emplace_back(DType::F32, ff, dim, static_cast<uint32_t>(20 + e));
    down.emplace_back(DType::F32, dim, ff, static_cast<uint32_t>(30 + e));
  }
  Weight sg(DType::F32, 2 * ff, dim, 41), su(DType::F32, 2 * ff, dim, 42), sd(DType::F32, dim, 2 * ff, 43);
  for (int64_t n : {2, 9}) {
    auto x = random_floats(static_cast<size_t>(n * dim), 5);
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> w(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      ids[j] = static_cast<int32_t>((j * 3 + j / 3) % E);
      w[j] = 0.2f + 0.1f * static_cast<float>(j % 3);
    }
    auto run = [&](int64_t begin, int64_t end, int64_t sh_begin, int64_t sh_len) {
      std::vector<Tensor> g(static_cast<size_t>(E)), u(g.size()), d(g.size());
      for (int64_t e = begin; e < end; ++e) {
        g[static_cast<size_t>(e)] = gate[static_cast<size_t>(e)].t;
        u[static_cast<size_t>(e)] = up[static_cast<size_t>(e)].t;
        d[static_cast<size_t>(e)] = down[static_cast<size_t>(e)].t;
      }
      // This rank's slice of the shared expert: rows of gate/up, the same columns of down.
      std::vector<float> dcols(static_cast<size_t>(dim * sh_len));
      const float* dsrc = static_cast<const float*>(sd.t.data);
      for (int64_t r = 0; r < dim; ++r)
        for (int64_t c = 0; c < sh_len; ++c) dcols[static_cast<size_t>(r * sh_len + c)] = dsrc[r * 2 * ff + sh_begin + c];
      Tensor sgv = Tensor::view(sg.t.row_ptr(sh_begin), DType::F32, {sh_len, dim});
      Tensor suv = Tensor::view(su.t.row_ptr(sh_begin), DType::F32, {sh_len, dim});
      Tensor sdv = Tensor::view(dcols.data(), DType::F32, {dim, sh_len});
      std::vector<float> out(static_cast<size_t>(n * dim), NAN);
      MoeFfnArgs a = routed(x, n, dim, ids, w, k, E, ff);
      a.gate = g.data();
      a.up = u.data();
      a.down = d.data();
      a.shared_gate = &sgv, a.shared_up = &suv, a.shared_down = &sdv, a.shared_ff = sh_len;
      a.expert_begin = begin;
      a.expert_end = end;
      a.out = out.data();
      dispatch(a);
      return out;
    };
    const std::vector<float> whole = run(0, E, 0, 2 * ff);
    for (int ranks : {2, 3}) {
      std::vector<float> sum(whole.size(), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        const int64_t b = E * r / ranks, e = E * (r + 1) / ranks;
        const int64_t sb = 2 * ff * r / ranks, se = 2 * ff * (r + 1) / ranks;
        const std::vector<float> part = run(b, e, sb, se - sb);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      EXPECT_LE(normalised_error(sum, whole), 1e-5) << "n=" << n << " ranks=" << ranks;
    }
  }
}

// MLA: two sequences in a paged latent pool (page 4), prefill chunks and single-token decode,
// with the latent pool in F32, F16 and BF16 (the reference reads the same pool).
TEST(BackendOps, MlaAttentionKernelsMatchReference) {
  const int64_t H = 4, nope = 16, vd = 16, page = 4;
  int checked = 0;
  // (weight type, kv_lora, rope); the last has widths that are not multiples of 8 (the fast
  // kernels' scalar tails).
  struct Cfg {
    DType type;
    int64_t L, rope;
  };
  for (const Cfg& cfg : {Cfg{DType::F32, 32, 8}, Cfg{DType::F16, 32, 8}, Cfg{DType::F32, 36, 4}}) {
    const DType type = cfg.type;
    const int64_t L = cfg.L, rope = cfg.rope, qd = nope + rope, lw = L + rope;
    std::vector<Weight> wk, wv;
    std::vector<std::vector<float>> wkt_f(static_cast<size_t>(H));
    std::vector<Tensor> twk, twkt, twv;
    for (int64_t h = 0; h < H; ++h) {
      wk.emplace_back(type, nope, L, static_cast<uint32_t>(10 + h));
      wv.emplace_back(type, vd, L, static_cast<uint32_t>(20 + h));
    }
    for (int64_t h = 0; h < H; ++h) {
      auto& t = wkt_f[static_cast<size_t>(h)];
      t.resize(static_cast<size_t>(L * nope));
      for (int64_t j = 0; j < nope; ++j)
        for (int64_t c = 0; c < L; ++c) t[static_cast<size_t>(c * nope + j)] = wk[static_cast<size_t>(h)].f32[static_cast<size_t>(j * L + c)];
      twk.push_back(wk[static_cast<size_t>(h)].t);
      twv.push_back(wv[static_cast<size_t>(h)].t);
      twkt.push_back(Tensor::view(t.data(), DType::F32, {L, nope}));
    }
    auto pool = random_floats(static_cast<size_t>(8 * page * lw), 3);  // 8 pages
    std::vector<uint16_t> pool16(pool.size());
    const std::vector<int32_t> page_ids = {5, 2, 7, 0, 1, 3};          // seq 0: 5,2,7; seq 1: 0,1,3
    const std::vector<int32_t> page_indptr = {0, 3, 6};
    struct Shape {
      std::vector<int32_t> seq_indptr, pos, kv_len;
    };
    for (DType kv : {DType::F32, DType::F16, DType::BF16}) {
      for (const Shape& sh : {Shape{{0, 5, 8}, {5, 6, 7, 8, 9, 0, 1, 2}, {10, 3}},    // prefill chunk + fresh prompt
                              Shape{{0, 1, 2}, {11, 6}, {12, 7}}}) {                    // decode
        if (kv != DType::F32) quantize_row(kv, pool.data(), pool16.data(), static_cast<int64_t>(pool.size()));
        const int64_t n = sh.seq_indptr.back();
        auto q = random_floats(static_cast<size_t>(n * H * qd), 4);
        auto make = [&](std::vector<float>& out) {
          out.assign(static_cast<size_t>(n * H * vd), NAN);
          MlaAttentionArgs a;
          a.q = q.data();
          a.pos = sh.pos.data();
          a.n = n;
          a.n_seqs = 2;
          a.seq_indptr = sh.seq_indptr.data();
          a.n_heads = H;
          a.nope = nope;
          a.rope = rope;
          a.v_dim = vd;
          a.kv_lora = L;
          a.latent_pool = kv == DType::F32 ? static_cast<const void*>(pool.data()) : pool16.data();
          a.kv_dtype = kv;
          a.latent_stride = lw;
          a.page_size = page;
          a.page_indptr = page_indptr.data();
          a.page_ids = page_ids.data();
          a.kv_len = sh.kv_len.data();
          a.wk = twk.data();
          a.wk_t = twkt.data();
          a.wv = twv.data();
          a.scale = 1.0f / std::sqrt(static_cast<float>(qd));
          a.out = out.data();
          return a;
        };
        checked += check_kernels<MlaAttentionArgs>(std::string(dtype_name(type)) + " L=" + std::to_string(L) + " rope=" +
                                                       std::to_string(rope) + " kv=" + dtype_name(kv) +
                                                       (n == 2 ? " decode" : " prefill"),
                                                   make, "ref", type == DType::F32 ? 1e-5 : 1e-3);
      }
    }
  }
  EXPECT_GE(checked, 18);  // expanded on prefill, absorbed on both, at 1 and 2 threads, for 3 KV dtypes
}

}  // namespace
}  // namespace fp
