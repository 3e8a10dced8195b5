// tests/backend_ops_elementwise_test.cpp — every rmsnorm, add, silu_mul, gelu_mul, softcap, softmax, rope, argmax
// and kv_write kernel against its reference twin over odd sizes, tails (d not a multiple of 8),
// n = 0 and 1, large d, aliased outputs and sizes big enough to split over threads. Also the
// accuracy of the vectorized exp the AVX2 kernels use.
//
// Tolerances (normalised error, backend_ops.h): add 0 (bit-exact); rmsnorm 1e-5 (sums of
// squares in 8 lanes vs one); rope 1e-5 (FMA vs separate multiply-add); silu_mul and softmax
// 1e-5 (polynomial exp, <= 2.3e-7 relative, plus reordered sums); softcap 1e-6 (tanh through
// that exp); argmax and kv_write exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend_ops.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {


// Fails when the CPU has AVX2 but no fast kernel was checked (it refused silently).
void expect_fast_kernel_ran(int checked, const char* op) {
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked, 0) << "no non-reference " << op << " kernel ran on an AVX2 CPU";
  }
}

// ---------------------------------------------------------------- rmsnorm
TEST(BackendOps, RmsNormEveryKernelAgainstItsReference) {
  int checked = 0;
  for (int64_t n : {0, 1, 2, 7, 64})
    for (int64_t d : {1, 3, 7, 8, 9, 31, 64, 100, 288, 4096, 8192})
      for (bool alias : {false, true}) {
        if (n * d > (1 << 20)) continue;
        std::vector<float> x, w;
        std::function<RmsNormArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
          x = test::random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 1000 + d));
          w = test::random_floats(static_cast<size_t>(d), 3);
          if (alias) {
            out = x;
            return RmsNormArgs{out.data(), w.data(), n, d, 1e-5f, out.data()};
          }
          out.assign(static_cast<size_t>(n * d), NAN);
          return RmsNormArgs{x.data(), w.data(), n, d, 1e-6f, out.data()};
        };
        std::string label = "n=" + std::to_string(n) + " d=" + std::to_string(d) + (alias ? " in-place" : "");
        checked += test::check_kernels<RmsNormArgs>(label, make, "ref", 1e-5);
      }
  expect_fast_kernel_ran(checked, "rmsnorm");
}

// Rows `stride` floats apart, normalised in place over their first d values (DeepSeek's latent c
// inside [c | k_pe]): the values past d stay as they were (the whole buffer is compared).
TEST(BackendOps, RmsNormStridedRowsInPlace) {
  int checked = 0;
  for (int64_t n : {1, 3, 8})
    for (int64_t d : {7, 32, 512})
      for (int64_t extra : {1, 64}) {
        const int64_t stride = d + extra;
        std::vector<float> w;
        std::function<RmsNormArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
          out = test::random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n * 100 + d + extra));
          w = test::random_floats(static_cast<size_t>(d), 5);
          RmsNormArgs a{out.data(), w.data(), n, d, 1e-6f, out.data()};
          a.stride = stride;
          return a;
        };
        checked += test::check_kernels<RmsNormArgs>("n=" + std::to_string(n) + " d=" + std::to_string(d) + " stride=" +
                                                        std::to_string(stride),
                                                    make, "ref", 1e-5);
      }
  expect_fast_kernel_ran(checked, "rmsnorm");
}

// The residual fused in (x += add; out = norm(x)): every CPU kernel's sum is exactly x + add and
// its output is the reference's norm of that sum, with the buffers apart or aliased as the model
// uses them (sum over x, out over add), strided rows, Q8_0 output too, and tails.
TEST(BackendOps, RmsNormWithResidualAddsThenNormalises) {
  const Kernel<RmsNormArgs>* ref = nullptr;
  for (auto& k : OpRegistry<RmsNormArgs>::instance().kernels())
    if (k.backend == Backend::CPU && k.name == "ref") ref = &k;
  ASSERT_TRUE(ref);
  int fast = 0;
  for (auto& k : OpRegistry<RmsNormArgs>::instance().kernels()) {
    if (k.backend != Backend::CPU) continue;
    for (int64_t n : {0, 1, 3, 17})
      for (int64_t d : {1, 7, 32, 100, 4096})
        for (int64_t extra : {0, 5})
          for (bool alias : {false, true})
            for (bool q8 : {false, true}) {
              if (q8 && d % QK8_0 != 0) continue;
              const int64_t stride = d + extra, len = std::max<int64_t>(n * stride, 1);
              const auto x = test::random_floats(static_cast<size_t>(len), static_cast<uint32_t>(n * 7 + d + extra));
              const auto add = test::random_floats(static_cast<size_t>(len), static_cast<uint32_t>(n * 11 + d + 1));
              const auto w = test::random_floats(static_cast<size_t>(d), 9);
              // Expected: the sum, then the reference on it as plain rows.
              std::vector<float> want_sum = x, want_out(static_cast<size_t>(len), NAN);
              for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < d; ++j) want_sum[static_cast<size_t>(i * stride + j)] += add[static_cast<size_t>(i * stride + j)];
              if (alias) want_out = add;  // the values past d of each row stay as they were
              RmsNormArgs plain{want_sum.data(), w.data(), n, d, 1e-5f, want_out.data()};
              plain.stride = extra ? stride : 0;
              ref->run(plain);

              std::vector<float> xs = x, adds = add, sums(static_cast<size_t>(len), NAN), outs(static_cast<size_t>(len), NAN);
              std::vector<BlockQ8_0> qb(static_cast<size_t>(n * std::max<int64_t>(d / QK8_0, 1)));
              RmsNormArgs a{xs.data(), w.data(), n, d, 1e-5f, alias ? adds.data() : outs.data()};
              a.stride = extra ? stride : 0;
              a.add = adds.data();
              a.sum = alias ? xs.data() : sums.data();
              if (q8) a.q8 = qb.data();
              if (k.refuse && !k.refuse(a).empty()) continue;
              k.run(a);
              const std::string label = k.name + " n=" + std::to_string(n) + " d=" + std::to_string(d) + " stride=" +
                                        std::to_string(stride) + (alias ? " aliased" : "") + (q8 ? " +q8" : "");
              const std::vector<float>& got_sum = alias ? xs : sums;
              const std::vector<float>& got_out = alias ? adds : outs;
              for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < d; ++j) {
                  const auto e = static_cast<size_t>(i * stride + j);
                  ASSERT_EQ(got_sum[e], want_sum[e]) << label << " sum at " << i << "," << j;
                }
              std::vector<float> got_rows, want_rows;
              for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < d; ++j) {
                  got_rows.push_back(got_out[static_cast<size_t>(i * stride + j)]);
                  want_rows.push_back(want_out[static_cast<size_t>(i * stride + j)]);
                }
              EXPECT_LE(test::normalised_error(got_rows, want_rows), 1e-5) << label;
              if (alias && extra) {  // past d: the add buffer's own values, untouched
                for (int64_t i = 0; i < n; ++i) {
                  EXPECT_EQ(adds[static_cast<size_t>(i * stride + d)], add[static_cast<size_t>(i * stride + d)]) << label;
                }
              }
              fast += k.name != "ref";
            }
  }
  expect_fast_kernel_ran(fast, "rmsnorm with a residual");
}

// The fused form: every kernel's Q8_0 rows are exactly the quantization of its own f32 output
// (which is unchanged by asking for them), in place or not; rows not a multiple of 32 are refused.
TEST(BackendOps, RmsNormWithQ8OutputQuantizesItsOwnRows) {
  int fast = 0;
  for (auto& k : OpRegistry<RmsNormArgs>::instance().kernels())
    if (k.backend == Backend::CPU)
    for (int64_t n : {1, 3, 17})
      for (int64_t d : {32, 64, 2048})
        for (bool alias : {false, true}) {
          auto x = test::random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 31 + d));
          auto w = test::random_floats(static_cast<size_t>(d), 5);
          std::vector<float> plain = x, fused = x;
          RmsNormArgs a{alias ? plain.data() : x.data(), w.data(), n, d, 1e-5f, plain.data()};
          if (k.refuse && !k.refuse(a).empty()) continue;
          k.run(a);
          std::vector<BlockQ8_0> q(static_cast<size_t>(n * d / QK8_0)), expect(q.size());
          RmsNormArgs b{alias ? fused.data() : x.data(), w.data(), n, d, 1e-5f, fused.data()};
          b.q8 = q.data();
          k.run(b);
          ASSERT_EQ(plain, fused) << k.name << " n=" << n << " d=" << d;
          quantize_row_q8_0(fused.data(), expect.data(), n * d);
          for (size_t i = 0; i < q.size(); ++i) {
            ASSERT_EQ(q[i].d, expect[i].d) << k.name << " block " << i;
            ASSERT_EQ(0, std::memcmp(q[i].qs, expect[i].qs, sizeof q[i].qs)) << k.name << " block " << i;
          }
          if (k.name != "ref") ++fast;
        }
  expect_fast_kernel_ran(fast, "rmsnorm +q8_0");
  std::vector<float> x(40, 1.0f), w(40, 1.0f), y(40);
  std::vector<BlockQ8_0> q(2);
  RmsNormArgs bad{x.data(), w.data(), 1, 40, 1e-5f, y.data()};
  bad.q8 = q.data();
  EXPECT_THROW(dispatch(bad), Error);
}

// The BF16 copies (RmsNormArgs / SiluMulArgs::bf16, what a device's BF16 GEMMs read): packed
// rows that are exactly the kernel's own F32 output rounded to nearest even, the F32 output
// unchanged by asking for them. Strided and residual norms, strided gate/up.
TEST(BackendOps, Bf16CopiesAreTheOutputRounded) {
  int fast = 0;
  for (auto& k : OpRegistry<RmsNormArgs>::instance().kernels()) {
    if (k.backend != Backend::CPU) continue;
    for (int64_t n : {1, 3, 17})
      for (int64_t d : {7, 64, 4096})
        for (int64_t extra : {0, 5})
          for (bool residual : {false, true}) {
            const int64_t stride = d + extra;
            const auto x = test::random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n + d + extra), 3.0f);
            const auto add = test::random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n * 3 + d));
            const auto w = test::random_floats(static_cast<size_t>(d), 4);
            std::vector<float> plain_out(x.size(), NAN), out(x.size(), NAN), sum1(x.size()), sum2(x.size());
            std::vector<uint16_t> b(static_cast<size_t>(n * d), 0xffff);
            RmsNormArgs a{x.data(), w.data(), n, d, 1e-5f, plain_out.data()};
            a.stride = extra ? stride : 0;
            if (residual) a.add = add.data(), a.sum = sum1.data();
            if (k.refuse && !k.refuse(a).empty()) continue;
            k.run(a);
            a.out = out.data();
            if (residual) a.sum = sum2.data();
            a.bf16 = b.data();
            k.run(a);
            const std::string label = k.name + " n=" + std::to_string(n) + " d=" + std::to_string(d) + " stride=" +
                                      std::to_string(stride) + (residual ? " +residual" : "");
            for (int64_t i = 0; i < n; ++i)
              for (int64_t j = 0; j < d; ++j) {
                const auto e = static_cast<size_t>(i * stride + j);
                ASSERT_EQ(out[e], plain_out[e]) << label;
                ASSERT_EQ(b[static_cast<size_t>(i * d + j)], f32_to_bf16(out[e])) << label << " at " << i << "," << j;
              }
            fast += k.name != "ref";
          }
  }
  expect_fast_kernel_ran(fast, "rmsnorm +bf16");
  fast = 0;
  for (auto& k : OpRegistry<SiluMulArgs>::instance().kernels()) {
    if (k.backend != Backend::CPU) continue;
    for (int64_t n : {1, 4, 9})
      for (int64_t d : {5, 100, 14336})
        for (bool strided : {false, true}) {
          const int64_t gs = strided ? 2 * d : d;
          const auto g = test::random_floats(static_cast<size_t>(n * gs), static_cast<uint32_t>(n + d), 4.0f);
          const auto u = test::random_floats(static_cast<size_t>(n * gs), static_cast<uint32_t>(n + d + 1));
          std::vector<float> plain_out(static_cast<size_t>(n * d), NAN), out(plain_out.size(), NAN);
          std::vector<uint16_t> b(plain_out.size(), 0xffff);
          SiluMulArgs a{g.data(), u.data(), n, d, strided ? gs : 0, strided ? gs : 0, plain_out.data()};
          if (k.refuse && !k.refuse(a).empty()) continue;
          k.run(a);
          a.out = out.data();
          a.bf16 = b.data();
          k.run(a);
          ASSERT_EQ(out, plain_out) << k.name << " n=" << n << " d=" << d;
          for (size_t e = 0; e < out.size(); ++e) ASSERT_EQ(b[e], f32_to_bf16(out[e])) << k.name << " n=" << n << " d=" << d << " at " << e;
          fast += k.name != "ref";
        }
  }
  expect_fast_kernel_ran(fast, "silu_mul +bf16");
}

// ---------------------------------------------------------------- add
TEST(BackendOps, AddEveryKernelAgainstItsReference) {
  int checked = 0;
  for (int64_t n : {0, 1, 7, 8, 9, 33, 1000, 65537, 1 << 20})
    for (int alias : {0, 1, 2}) {  // out separate, out == a, out == b
      std::vector<float> a, b;
      std::function<AddArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
        a = test::random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + 1));
        b = test::random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + 2));
        if (alias == 0) {
          out.assign(static_cast<size_t>(n), NAN);
          return AddArgs{a.data(), b.data(), n, out.data()};
        }
        out = alias == 1 ? a : b;
        return alias == 1 ? AddArgs{out.data(), b.data(), n, out.data()} : AddArgs{a.data(), out.data(), n, out.data()};
      };
      checked += test::check_kernels<AddArgs>("n=" + std::to_string(n) + " alias=" + std::to_string(alias), make, "ref", 0.0);
    }
  expect_fast_kernel_ran(checked, "add");
}

// ---------------------------------------------------------------- silu_mul, gelu_mul
// The gated activations (SiluMulArgs and GeluMulArgs have the same fields): every kernel of the
// op against its reference over row counts, odd widths, strides and in place.
template <class Args>
int check_glu_kernels() {
  struct Case {
    int64_t n, d, gate_stride, up_stride;
    bool in_place;
  };
  std::vector<Case> cases;
  for (int64_t n : {0, 1, 3, 16})
    for (int64_t d : {1, 5, 8, 13, 64, 100, 768, 4097}) {
      cases.push_back({n, d, 0, 0, false});
      cases.push_back({n, d, 0, 0, true});
      cases.push_back({n, d, 2 * d, 2 * d, false});  // gate and up interleaved in one [n, 2d] buffer
    }
  cases.push_back({1, 14336, 0, 0, true});  // decode-sized hidden layer: split into column chunks
  cases.push_back({64, 1408, 0, 0, true});
  int checked = 0;
  for (const Case& c : cases) {
    std::vector<float> g, u;
    std::function<Args(std::vector<float>&)> make = [&](std::vector<float>& out) {
      int64_t gs = c.gate_stride ? c.gate_stride : c.d, us = c.up_stride ? c.up_stride : c.d;
      g = test::random_floats(static_cast<size_t>(c.n * gs), static_cast<uint32_t>(c.d), 4.0f);
      u = test::random_floats(static_cast<size_t>(c.n * us), static_cast<uint32_t>(c.d + 1));
      if (!g.empty()) g[0] = 95.0f;                     // e^-g underflows
      if (g.size() > 1) g[1] = -95.0f;                   // e^-g overflows in the reference
      if (g.size() > 2) g[g.size() - 1] = -20.0f;
      if (g.size() > 3) g[2] = 0.0f;
      if (c.in_place) {
        out = g;
        return Args{out.data(), u.data(), c.n, c.d, 0, c.up_stride, out.data()};
      }
      out.assign(static_cast<size_t>(c.n * c.d), NAN);
      return Args{g.data(), u.data(), c.n, c.d, c.gate_stride, c.up_stride, out.data()};
    };
    std::string label = "n=" + std::to_string(c.n) + " d=" + std::to_string(c.d) + " strides=" + std::to_string(c.gate_stride) +
                        "," + std::to_string(c.up_stride) + (c.in_place ? " in-place" : "");
    checked += test::check_kernels<Args>(label, make, "ref", 1e-5);
  }
  return checked;
}

TEST(BackendOps, SiluMulEveryKernelAgainstItsReference) { expect_fast_kernel_ran(check_glu_kernels<SiluMulArgs>(), "silu_mul"); }

// Gemma's GeGLU: the tanh form of GELU (transformers' gelu_pytorch_tanh).
TEST(BackendOps, GeluMulEveryKernelAgainstItsReference) {
  expect_fast_kernel_ran(check_glu_kernels<GeluMulArgs>(), "gelu_mul");
  // The reference itself at known points: gelu_tanh(0) = 0, (1) = 0.841192, (-1) = -0.158808, (3) = 2.996363.
  const std::vector<float> g = {0.0f, 1.0f, -1.0f, 3.0f}, u = {1.0f, 1.0f, 1.0f, 2.0f};
  std::vector<float> out(4);
  for (auto& k : OpRegistry<GeluMulArgs>::instance().kernels())
    if (k.name == "ref") k.run(GeluMulArgs{g.data(), u.data(), 1, 4, 0, 0, out.data()});
  EXPECT_NEAR(out[0], 0.0f, 1e-7f);
  EXPECT_NEAR(out[1], 0.841192f, 1e-5f);
  EXPECT_NEAR(out[2], -0.158808f, 1e-5f);
  EXPECT_NEAR(out[3], 2 * 2.996363f, 1e-5f);
}

// ---------------------------------------------------------------- softcap
// Gemma 2's logit soft-capping over odd lengths, tails, sizes split over threads, caps from 1 to
// 50 and values from far inside the cap to far past it (both saturated ends, exp8's clamp).
TEST(BackendOps, SoftcapEveryKernelAgainstItsReference) {
  int checked = 0;
  for (int64_t n : {0, 1, 7, 8, 9, 100, 256000, 300001})
    for (float cap : {1.0f, 30.0f, 50.0f})
      for (float sd : {0.5f, 40.0f, 2000.0f}) {
        std::function<SoftcapArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
          out = test::random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n * 3 + static_cast<int64_t>(sd)), sd);
          if (n > 2) out[1] = 0.0f;
          return SoftcapArgs{out.data(), n, cap};
        };
        std::string label = "n=" + std::to_string(n) + " cap=" + std::to_string(cap) + " sd=" + std::to_string(sd);
        checked += test::check_kernels<SoftcapArgs>(label, make, "ref", 1e-6);
      }
  expect_fast_kernel_ran(checked, "softcap");
  // The reference at known points: 30 tanh(x / 30) for x = 0, 30, -60, 1e6.
  std::vector<float> x = {0.0f, 30.0f, -60.0f, 1e6f};
  for (auto& k : OpRegistry<SoftcapArgs>::instance().kernels())
    if (k.name == "ref") k.run(SoftcapArgs{x.data(), 4, 30.0f});
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_NEAR(x[1], 22.847825f, 1e-5f);
  EXPECT_NEAR(x[2], -28.920827f, 1e-5f);
  EXPECT_EQ(x[3], 30.0f);
}

// Each fast kernel's values stay within the cap (a logit never exceeds it) and keep their sign.
TEST(BackendOps, SoftcapFastKernelsStayWithinTheCap) {
  std::vector<float> x = test::random_floats(1000, 11, 1e4f);
  for (auto& k : OpRegistry<SoftcapArgs>::instance().kernels()) {
    if (k.reference || k.backend != Backend::CPU || (k.refuse && !k.refuse(SoftcapArgs{x.data(), 1000, 5.0f}).empty())) continue;
    std::vector<float> y = x;
    k.run(SoftcapArgs{y.data(), 1000, 5.0f});
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_LE(std::fabs(y[i]), 5.0f) << k.name << " at " << x[i];
      EXPECT_TRUE(y[i] == 0 || std::signbit(y[i]) == std::signbit(x[i])) << k.name << " at " << x[i];
    }
  }
}

// ---------------------------------------------------------------- softmax
TEST(BackendOps, SoftmaxEveryKernelAgainstItsReference) {
  int checked = 0;
  for (int64_t n : {0, 1, 3, 40})
    for (int64_t d : {1, 2, 7, 8, 9, 17, 64, 1000, 32000})
      for (float sd : {1.0f, 30.0f}) {
        if (n * d > (1 << 21)) continue;
        std::function<SoftmaxArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
          out = test::random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 7 + d), sd);
          for (size_t i = 3; i < out.size(); i += 11) out[i] = -std::numeric_limits<float>::infinity();  // masked
          return SoftmaxArgs{out.data(), n, d};
        };
        std::string label = "n=" + std::to_string(n) + " d=" + std::to_string(d) + " sd=" + std::to_string(sd);
        checked += test::check_kernels<SoftmaxArgs>(label, make, "ref", 1e-5);
      }
  expect_fast_kernel_ran(checked, "softmax");
}

// ---------------------------------------------------------------- rope
TEST(BackendOps, RopeEveryKernelAgainstItsReference) {
  struct Case {
    int64_t n, heads, head_dim, rot_dim, extra_stride;
    int32_t pos0;
  };
  std::vector<Case> cases;
  for (int64_t hd : {8, 16, 64, 96, 128})
    for (int64_t rot : {hd, hd / 2, int64_t{2}, int64_t{6}})
      for (int64_t n : {1, 5, 300})
        for (int64_t heads : {1, 4, 32}) {
          if (rot > hd || n * heads * hd > (1 << 21)) continue;
          cases.push_back({n, heads, hd, rot, heads == 4 ? 24 : 0, n == 5 ? 100000 : 17});
        }
  int checked = 0;
  for (const Case& c : cases)
    for (RopeStyle style : {RopeStyle::Adjacent, RopeStyle::NeoX})
      for (float mscale : {1.0f, 1.25f}) {
        std::vector<int32_t> pos;
        std::vector<float> inv_freq;
        std::function<RopeArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
          int64_t stride = c.heads * c.head_dim + c.extra_stride;
          out = test::random_floats(static_cast<size_t>(c.n * stride), static_cast<uint32_t>(c.n + c.head_dim));
          pos.resize(static_cast<size_t>(c.n));
          for (int64_t i = 0; i < c.n; ++i) pos[static_cast<size_t>(i)] = c.pos0 + static_cast<int32_t>(i * 3 % 7 + i);
          inv_freq.resize(static_cast<size_t>(c.rot_dim / 2));
          for (int64_t i = 0; i < c.rot_dim / 2; ++i)
            inv_freq[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.rot_dim));
          return RopeArgs{out.data(), pos.data(), c.n, c.heads, c.head_dim, c.rot_dim, stride, inv_freq.data(), mscale, style};
        };
        std::string label = std::string(style == RopeStyle::NeoX ? "neox" : "adjacent") + " n=" + std::to_string(c.n) +
                            " heads=" + std::to_string(c.heads) + " hd=" + std::to_string(c.head_dim) +
                            " rot=" + std::to_string(c.rot_dim) + " stride+" + std::to_string(c.extra_stride) +
                            " mscale=" + std::to_string(mscale);
        checked += test::check_kernels<RopeArgs>(label, make, "ref", 1e-5);
      }
  expect_fast_kernel_ran(checked, "rope");
}

// ---------------------------------------------------------------- argmax
// Integer outputs: compared exactly, including ties (first index wins), -inf rows and NaNs.
TEST(BackendOps, ArgmaxEveryKernelAgainstItsReference) {
  const auto& kernels = OpRegistry<ArgmaxArgs>::instance().kernels();
  const Kernel<ArgmaxArgs>* ref = nullptr;
  for (auto& k : kernels)
    if (k.name == "ref") ref = &k;
  ASSERT_TRUE(ref);
  int checked = 0;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t d : {1, 2, 7, 8, 9, 31, 32, 33, 100, 1000, 32000, 128256})
    for (int variant = 0; variant < 6; ++variant) {
      int64_t n = variant == 0 ? 1 : 9;
      auto x = test::random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(d * 10 + variant));
      for (int64_t r = 0; r < n; ++r) {
        float* row = x.data() + r * d;
        int64_t a = (r * 7919) % d, b = (r * 104729 + 13) % d;
        if (variant == 1) row[a] = row[b] = 50.0f;  // tie: the first index must win
        if (variant == 2) std::fill(row, row + d, -inf);
        if (variant == 3) row[a] = NAN;  // NaN never wins (at index 0 it is never beaten)
        if (variant == 4) std::fill(row, row + d, 1.0f);
        if (variant == 5) row[b] = inf;
      }
      std::vector<int32_t> want(static_cast<size_t>(n), -1);
      ref->run(ArgmaxArgs{x.data(), n, d, want.data()});
      for (auto& k : kernels) {
        if (k.reference || k.backend != Backend::CPU) continue;
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          std::vector<int32_t> got(static_cast<size_t>(n), -1);
          ArgmaxArgs args{x.data(), n, d, got.data()};
          if (k.refuse && !k.refuse(args).empty()) continue;
          k.run(args);
          EXPECT_EQ(got, want) << "argmax kernel " << k.name << " d=" << d << " variant " << variant << " threads " << threads;
          ++checked;
        }
      }
    }
  // Many rows: split over threads.
  auto x = test::random_floats(64 * 4096, 11);
  std::vector<int32_t> want(64);
  ref->run(ArgmaxArgs{x.data(), 64, 4096, want.data()});
  for (auto& k : kernels) {
    if (k.reference || k.backend != Backend::CPU || (k.refuse && !k.refuse(ArgmaxArgs{x.data(), 64, 4096, nullptr}).empty()))
      continue;
    std::vector<int32_t> got(64, -1);
    k.run(ArgmaxArgs{x.data(), 64, 4096, got.data()});
    EXPECT_EQ(got, want) << k.name << " 64 rows";
  }
  set_num_threads(0);
  expect_fast_kernel_ran(checked, "argmax");
}

// ---------------------------------------------------------------- kv_write
// Bytes compared exactly: the pool after every CPU kernel equals the pool after the reference,
// for each pool dtype, widths with and without an 8-wide tail, a latent cache with no V (MLA),
// slots scattered over a pool whose other bytes must stay untouched, and the values where
// rounding is delicate: F16's overflow to inf, its largest finite, subnormals of both types,
// negative zero, ties to even, infinities and a (canonical) NaN.
TEST(BackendOps, KvWriteEveryKernelBitExactAgainstItsReference) {
  const auto& kernels = OpRegistry<KvWriteArgs>::instance().kernels();
  const Kernel<KvWriteArgs>* ref = nullptr;
  for (auto& k : kernels)
    if (k.name == "ref") ref = &k;
  ASSERT_TRUE(ref);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {70000.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 6.0e-8f, 3.0e-8f, -2.9e-8f, 1.0e-40f,
                            -0.0f, 1.00048828125f /* F16 tie */, 1.0039062f /* near a BF16 tie */, inf, -inf,
                            std::numeric_limits<float>::quiet_NaN(), 5.9604645e-8f, 1.1754944e-38f, -3.4e38f};
  int checked = 0;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {0, 1, 5, 64, 300})
      for (auto [kw, vw] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {1024, 1024}, {192, 128}, {576, 0}, {13, 7}}) {
        const int64_t slots_total = 3 * n + 7, eb = dtype_info(t).block_bytes;
        auto k = test::random_floats(static_cast<size_t>(std::max<int64_t>(n * kw, 1)), static_cast<uint32_t>(n + kw), 2.0f);
        auto v = test::random_floats(static_cast<size_t>(std::max<int64_t>(n * vw, 1)), static_cast<uint32_t>(n + vw + 1), 2.0f);
        if (n > 0)
          for (size_t i = 0; i < std::size(specials); ++i) {
            k[(i * 7) % k.size()] = specials[i];
            v[(i * 5 + 3) % v.size()] = specials[i];
          }
        std::vector<int64_t> slots(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = (i * 5 + 2) % slots_total;  // distinct
        std::vector<uint8_t> kpool(static_cast<size_t>(slots_total * kw * eb)), vpool(static_cast<size_t>(slots_total * vw * eb) + 1);
        for (size_t i = 0; i < kpool.size(); ++i) kpool[i] = static_cast<uint8_t>(i * 37 + 11);
        for (size_t i = 0; i < vpool.size(); ++i) vpool[i] = static_cast<uint8_t>(i * 53 + 5);
        std::vector<uint8_t> want_k = kpool, want_v = vpool;
        ref->run(KvWriteArgs{want_k.data(), want_v.data(), t, kw, vw, slots.data(), n, k.data(), vw ? v.data() : nullptr});
        for (auto& kern : kernels) {
          if (kern.reference || kern.backend != Backend::CPU) continue;
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            std::vector<uint8_t> got_k = kpool, got_v = vpool;
            const KvWriteArgs a{got_k.data(), got_v.data(), t, kw, vw, slots.data(), n, k.data(), vw ? v.data() : nullptr};
            if (kern.refuse && !kern.refuse(a).empty()) continue;
            kern.run(a);
            EXPECT_TRUE(got_k == want_k) << "kv_write " << kern.name << " K pool differs: " << dtype_name(t) << " n=" << n
                                         << " width=" << kw << " threads " << threads;
            EXPECT_TRUE(got_v == want_v) << "kv_write " << kern.name << " V pool differs: " << dtype_name(t) << " n=" << n
                                         << " width=" << vw << " threads " << threads;
            ++checked;
          }
        }
      }
  set_num_threads(0);
  expect_fast_kernel_ran(checked, "kv_write");
}

// ---------------------------------------------------------------- the vectorized exp
FP_AVX2 void exp8_many(const float* x, float* y, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, avx2::exp8(_mm256_loadu_ps(x + i)));
}

TEST(BackendOps, VectorExpRelativeErrorAndRange) {
  if (!test::cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA";
  std::vector<float> x, y;
  for (double v = -87.3; v <= 88.0; v += 1.37e-4) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.3465f, -0.3466f}) x.push_back(v);
  while (x.size() % 8) x.push_back(0.0f);
  y.resize(x.size());
  exp8_many(x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double e = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - e) / e);
  }
  EXPECT_LE(worst, 5e-7) << "max relative error of exp8 over [-87.3, 88]";
  // Edges: -inf and deep underflow give 0, +inf saturates (finite), NaN stays NaN.
  std::vector<float> e = {-std::numeric_limits<float>::infinity(), -100.0f, -87.5f, 100.0f,
                          std::numeric_limits<float>::infinity(), NAN, 0.0f, 1.0f};
  std::vector<float> r(8);
  exp8_many(e.data(), r.data(), 8);
  EXPECT_EQ(r[0], 0.0f);
  EXPECT_EQ(r[1], 0.0f);
  EXPECT_EQ(r[2], 0.0f);
  EXPECT_TRUE(std::isfinite(r[3]) && r[3] > 1e38f);
  EXPECT_TRUE(std::isfinite(r[4]) && r[4] > 1e38f);
  EXPECT_TRUE(std::isnan(r[5]));
  EXPECT_EQ(r[6], 1.0f);
  EXPECT_NEAR(r[7], 2.718281828f, 1e-6f);
}

}  // namespace
}  // namespace fp
