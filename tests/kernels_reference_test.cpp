// tests/kernels_reference_test.cpp — the reference kernels against independent float64
// computations written here, over many shapes (odd sizes, tails, zero-length).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

// Runs the op's reference kernel itself, whatever faster kernel dispatch would pick.
template <class Args>
void run_ref(const Args& a, const std::string& name = "ref") {
  for (auto& k : OpRegistry<Args>::instance().kernels())
    if (k.name == name) return k.run(a);
  FAIL() << "no kernel " << name << " for " << Args::kName;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Asserts max|a-b| <= tol * max(1, max|b|).
void expect_close(const std::vector<float>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double mx = 1, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  EXPECT_LE(err, tol * mx) << what;
}

class MatMulRef : public ::testing::TestWithParam<DType> {};

TEST_P(MatMulRef, MatchesFloat64OnDequantizedWeights) {
  DType t = GetParam();
  int64_t blk = dtype_info(t).block_elems;
  for (int64_t n : {0, 1, 3, 17}) {
    for (int64_t out : {1, 5, 33}) {
      for (int64_t in : {blk, 2 * blk, blk == 1 ? 7 : 3 * blk}) {
        auto wf = randn(static_cast<size_t>(out * in), static_cast<uint32_t>(n * 100 + out * 10 + in));
        std::vector<uint8_t> wq(static_cast<size_t>(row_bytes(t, in) * out));
        for (int64_t o = 0; o < out; ++o) quantize_row(t, wf.data() + o * in, wq.data() + o * row_bytes(t, in), in);
        Tensor w = Tensor::view(wq.data(), t, {out, in});
        auto x = randn(static_cast<size_t>(n * in), 7);
        auto bias = randn(static_cast<size_t>(out), 8);
        std::vector<float> y(static_cast<size_t>(n * out), NAN);
        run_ref(MatMulArgs{x.data(), n, &w, bias.data(), y.data()});
        // Oracle: dequantize each row independently, dot in double.
        std::vector<double> ref(static_cast<size_t>(n * out));
        std::vector<float> row(static_cast<size_t>(in));
        for (int64_t o = 0; o < out; ++o) {
          dequantize_row(t, wq.data() + o * row_bytes(t, in), row.data(), in);
          for (int64_t i = 0; i < n; ++i) {
            double s = bias[static_cast<size_t>(o)];
            for (int64_t c = 0; c < in; ++c) s += static_cast<double>(x[static_cast<size_t>(i * in + c)]) * row[static_cast<size_t>(c)];
            ref[static_cast<size_t>(i * out + o)] = s;
          }
        }
        expect_close(y, ref, 1e-5, std::string(dtype_name(t)) + " n=" + std::to_string(n) + " out=" + std::to_string(out) + " in=" + std::to_string(in));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatMulRef,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::Q8_0, DType::Q4_0,
                                           DType::Q4_K, DType::Q6_K),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(MatMulRef, Fp8BlockScalesApplyPerTile) {
  // 130 x 260 weights: tiles of 128x128 with partial tiles at the edges.
  int64_t out = 130, in = 260, sr = 2, sc = 3;
  auto wf = randn(static_cast<size_t>(out * in), 3);
  std::vector<float> scale = {0.5f, 2.0f, 1.5f, 0.25f, 4.0f, 1.0f};
  std::vector<uint8_t> q(static_cast<size_t>(out * in));
  for (size_t i = 0; i < q.size(); ++i) q[i] = f32_to_fp8e4m3(wf[i]);
  Tensor w = Tensor::view(q.data(), DType::F8_E4M3, {out, in});
  w.block_scale = scale.data();
  auto x = randn(static_cast<size_t>(in), 4);
  std::vector<float> y(static_cast<size_t>(out));
  run_ref(MatMulArgs{x.data(), 1, &w, nullptr, y.data()});
  std::vector<double> ref(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (int64_t c = 0; c < in; ++c)
      s += static_cast<double>(fp8e4m3_to_f32(q[static_cast<size_t>(o * in + c)])) * scale[static_cast<size_t>((o / 128) * sc + c / 128)] * x[static_cast<size_t>(c)];
    ref[static_cast<size_t>(o)] = s;
  }
  (void)sr;
  expect_close(y, ref, 1e-5, "fp8 block scaled");
}

TEST(MatMulRef, Q8ActivationKernelMatchesIntegerOracle) {
  // ref_q8act: x rounded to 8 bits (Q8_0 blocks for the 32-value formats, Q8_K for the
  // K-quants), then the dequantized weights dotted with it. The oracle dots the same rounded
  // activations with the dequantizer's weights (checked against llama.cpp's in quant_golden_test)
  // in float64, so it checks the reference's integer arithmetic: offsets, minimums, scales.
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K}) {
    const bool k_quant = dtype_info(t).block_elems == QK_K;
    int64_t out = 9, in = k_quant ? 512 : 96, n = 3;
    auto wf = randn(static_cast<size_t>(out * in), 11);
    std::vector<uint8_t> wq(static_cast<size_t>(row_bytes(t, in) * out));
    for (int64_t o = 0; o < out; ++o) quantize_row(t, wf.data() + o * in, wq.data() + o * row_bytes(t, in), in);
    Tensor w = Tensor::view(wq.data(), t, {out, in});
    auto x = randn(static_cast<size_t>(n * in), 12);
    std::vector<float> y(static_cast<size_t>(n * out));
    run_ref(MatMulArgs{x.data(), n, &w, nullptr, y.data()}, "ref_q8act");
    std::vector<double> ref(y.size());
    std::vector<float> wrow(static_cast<size_t>(in)), xrow(static_cast<size_t>(in));
    std::vector<uint8_t> xq(static_cast<size_t>(row_bytes(DType::Q8_0, in)));
    std::vector<BlockQ8_K> xk(static_cast<size_t>(in / QK_K));
    for (int64_t i = 0; i < n; ++i) {
      if (k_quant) {
        quantize_act_q8_k(x.data() + i * in, xk.data(), in);
        for (int64_t c = 0; c < in; ++c) xrow[static_cast<size_t>(c)] = xk[static_cast<size_t>(c / QK_K)].d * xk[static_cast<size_t>(c / QK_K)].qs[c % QK_K];
      } else {
        quantize_row(DType::Q8_0, x.data() + i * in, xq.data(), in);
        dequantize_row(DType::Q8_0, xq.data(), xrow.data(), in);
      }
      for (int64_t o = 0; o < out; ++o) {
        dequantize_row(t, wq.data() + o * row_bytes(t, in), wrow.data(), in);
        double s = 0;
        for (int64_t c = 0; c < in; ++c) s += static_cast<double>(wrow[static_cast<size_t>(c)]) * xrow[static_cast<size_t>(c)];
        ref[static_cast<size_t>(i * out + o)] = s;
      }
    }
    expect_close(y, ref, 1e-5, dtype_name(t));
  }
}

TEST(ElementwiseRef, RmsNormSiluAddSoftmaxArgmax) {
  for (int64_t n : {0, 1, 4}) {
    for (int64_t d : {1, 7, 64, 129}) {
      auto x = randn(static_cast<size_t>(n * d), 21), w = randn(static_cast<size_t>(d), 22), u = randn(static_cast<size_t>(n * d), 23);
      std::vector<float> y(x.size());
      run_ref(RmsNormArgs{x.data(), w.data(), n, d, 1e-5f, y.data()});
      std::vector<double> ref(x.size());
      for (int64_t i = 0; i < n; ++i) {
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[static_cast<size_t>(i * d + j)]) * x[static_cast<size_t>(i * d + j)];
        double inv = 1 / std::sqrt(ss / static_cast<double>(d) + 1e-5);
        for (int64_t j = 0; j < d; ++j) ref[static_cast<size_t>(i * d + j)] = x[static_cast<size_t>(i * d + j)] * inv * w[static_cast<size_t>(j)];
      }
      expect_close(y, ref, 1e-5, "rmsnorm");

      run_ref(SiluMulArgs{x.data(), u.data(), n, d, 0, 0, y.data()});
      for (size_t i = 0; i < x.size(); ++i) ref[i] = x[i] / (1 + std::exp(-static_cast<double>(x[i]))) * u[i];
      expect_close(y, ref, 1e-5, "silu_mul");

      run_ref(AddArgs{x.data(), u.data(), n * d, y.data()});
      for (size_t i = 0; i < x.size(); ++i) ref[i] = static_cast<double>(x[i]) + u[i];
      expect_close(y, ref, 1e-6, "add");

      y = x;
      run_ref(SoftmaxArgs{y.data(), n, d});
      for (int64_t i = 0; i < n; ++i) {
        double mx = -1e300, s = 0;
        for (int64_t j = 0; j < d; ++j) mx = std::max<double>(mx, x[static_cast<size_t>(i * d + j)]);
        for (int64_t j = 0; j < d; ++j) s += std::exp(x[static_cast<size_t>(i * d + j)] - mx);
        for (int64_t j = 0; j < d; ++j) ref[static_cast<size_t>(i * d + j)] = std::exp(x[static_cast<size_t>(i * d + j)] - mx) / s;
      }
      expect_close(y, ref, 1e-6, "softmax");

      std::vector<int32_t> am(static_cast<size_t>(n), -1);
      run_ref(ArgmaxArgs{x.data(), n, d, am.data()});
      for (int64_t i = 0; i < n; ++i) {
        int64_t best = 0;
        for (int64_t j = 0; j < d; ++j)
          if (x[static_cast<size_t>(i * d + j)] > x[static_cast<size_t>(i * d + best)]) best = j;
        EXPECT_EQ(am[static_cast<size_t>(i)], best);
      }
    }
  }
}

TEST(RopeRef, AdjacentAndNeoXRotateTheRightPairs) {
  for (RopeStyle style : {RopeStyle::Adjacent, RopeStyle::NeoX}) {
    for (int64_t rot : {8, 16}) {
      int64_t n = 5, heads = 3, hd = 16, stride = heads * hd;
      auto x = randn(static_cast<size_t>(n * stride), 31);
      std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
      std::vector<float> inv(static_cast<size_t>(rot / 2));
      for (int64_t i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * i / rot));
      auto y = x;
      run_ref(RopeArgs{y.data(), pos.data(), n, heads, hd, rot, stride, inv.data(), 1.0f, style});
      std::vector<double> ref(x.begin(), x.end());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < rot / 2; ++i) {
            int64_t a = style == RopeStyle::Adjacent ? 2 * i : i, b = style == RopeStyle::Adjacent ? 2 * i + 1 : i + rot / 2;
            size_t base = static_cast<size_t>(t * stride + h * hd);
            double ang = pos[static_cast<size_t>(t)] * static_cast<double>(inv[static_cast<size_t>(i)]);
            double x0 = x[base + static_cast<size_t>(a)], x1 = x[base + static_cast<size_t>(b)];
            ref[base + static_cast<size_t>(a)] = x0 * std::cos(ang) - x1 * std::sin(ang);
            ref[base + static_cast<size_t>(b)] = x0 * std::sin(ang) + x1 * std::cos(ang);
          }
      expect_close(y, ref, 2e-4, "rope");  // float angles at position 4095
    }
  }
}

TEST(AttentionRef, CausalGqaMatchesFloat64) {
  for (int64_t kv_heads : {1, 2, 4}) {
    for (int64_t n : {1, 6}) {
      int64_t heads = 4, hd = 8, vd = 8, start = 3, len = start + n;
      auto q = randn(static_cast<size_t>(n * heads * hd), 41);
      auto k = randn(static_cast<size_t>(len * kv_heads * hd), 42);
      auto v = randn(static_cast<size_t>(len * kv_heads * vd), 43);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(start + i);
      std::vector<float> out(static_cast<size_t>(n * heads * vd));
      float scale = 0.35f;
      // One sequence, page size 1 with the identity block table: slot t holds position t.
      std::vector<int32_t> seq_indptr{0, static_cast<int32_t>(n)}, page_indptr{0, static_cast<int32_t>(len)}, pages, kv{static_cast<int32_t>(len)};
      for (int64_t t = 0; t < len; ++t) pages.push_back(static_cast<int32_t>(t));
      AttentionArgs a{};
      a.q = q.data();
      a.pos = pos.data();
      a.n = n;
      a.n_seqs = 1;
      a.seq_indptr = seq_indptr.data();
      a.n_heads = heads;
      a.n_kv_heads = kv_heads;
      a.head_dim = hd;
      a.v_dim = vd;
      a.k_pool = k.data();
      a.v_pool = v.data();
      a.k_stride = kv_heads * hd;
      a.v_stride = kv_heads * vd;
      a.page_size = 1;
      a.page_indptr = page_indptr.data();
      a.page_ids = pages.data();
      a.kv_len = kv.data();
      a.scale = scale;
      a.out = out.data();
      run_ref(a);
      std::vector<double> ref(out.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < heads; ++h) {
          int64_t kvh = h / (heads / kv_heads);
          std::vector<double> s;
          for (int64_t t = 0; t <= pos[static_cast<size_t>(i)]; ++t) {
            double d = 0;
            for (int64_t j = 0; j < hd; ++j) d += static_cast<double>(q[static_cast<size_t>((i * heads + h) * hd + j)]) * k[static_cast<size_t>((t * kv_heads + kvh) * hd + j)];
            s.push_back(d * scale);
          }
          double mx = *std::max_element(s.begin(), s.end()), sum = 0;
          for (auto& e : s) sum += (e = std::exp(e - mx));
          for (int64_t j = 0; j < vd; ++j) {
            double o = 0;
            for (size_t t = 0; t < s.size(); ++t) o += s[t] / sum * v[static_cast<size_t>((static_cast<int64_t>(t) * kv_heads + kvh) * vd + j)];
            ref[static_cast<size_t>((i * heads + h) * vd + j)] = o;
          }
        }
      expect_close(out, ref, 1e-5, "attention kv_heads=" + std::to_string(kv_heads));
    }
  }
}

TEST(EmbeddingRef, LooksUpRowsAndRejectsBadIds) {
  auto table = randn(10 * 64, 51);
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(DType::Q8_0, 64) * 10));
  for (int r = 0; r < 10; ++r) quantize_row(DType::Q8_0, table.data() + r * 64, q.data() + r * row_bytes(DType::Q8_0, 64), 64);
  Tensor t = Tensor::view(q.data(), DType::Q8_0, {10, 64});
  std::vector<int32_t> ids = {3, 0, 9};
  std::vector<float> out(3 * 64), row(64);
  run_ref(EmbeddingArgs{&t, ids.data(), 3, out.data()});
  for (int i = 0; i < 3; ++i) {
    dequantize_row(DType::Q8_0, q.data() + ids[static_cast<size_t>(i)] * row_bytes(DType::Q8_0, 64), row.data(), 64);
    for (int j = 0; j < 64; ++j) EXPECT_EQ(out[static_cast<size_t>(i * 64 + j)], row[static_cast<size_t>(j)]);
  }
  int32_t bad = 10;
  EXPECT_THROW(run_ref(EmbeddingArgs{&t, &bad, 1, out.data()}), Error);
}

}  // namespace
}  // namespace fp
