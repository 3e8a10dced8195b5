// tests/cuda_ops_test.cpp — every CUDA kernel of matmul and of the row-wise / element-wise ops
// against the CPU reference (harness: cuda_ops.h), plus the ledger under DeviceScope(CUDA) and
// the kernels' refusals. Attention is in cuda_ops_attention_test.cpp.
//
// Tolerances (normalised L2 error): 2e-5 where the kernel computes in f32 on exactly decoded
// weights (only the order of the sums differs); cuBLAS on F16 operands (x converted, and
// Q8_0/Q4_K weights dequantized, to F16) 2e-3; on BF16 operands (BF16 and FP8 weights) 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "cuda_ops.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"

namespace fp {
namespace {

using test::Coverage;
using test::download;
using test::l2_error;
using test::random_floats;
using test::upload;
using test::upload_into;

// ---------------------------------------------------------------------------------------------
// matmul

struct MmCase {
  DType type;
  int64_t n, out, in;
  bool bias = false;
  bool scaled = false;    // FP8 128x128 block scales
  bool offset_x = false;  // x starts one float into its buffer (not 16-byte aligned)
  bool offset_w = false;  // the weights start 2 bytes into their buffer
};

std::string label(const MmCase& c) {
  return std::string(dtype_name(c.type)) + " n=" + std::to_string(c.n) + " out=" + std::to_string(c.out) +
         " in=" + std::to_string(c.in) + (c.bias ? " +bias" : "") + (c.scaled ? " block-scaled" : "") +
         (c.offset_x ? " x+4B" : "") + (c.offset_w ? " w+2B" : "");
}

double matmul_tol(const std::string& kernel, DType t) {
  // x quantized to FP8 per token and 128 columns: ~3.6% rms per value (the exact comparison is
  // CudaOps.Fp8BlockGemmMatchesTheReferenceOnItsQuantizedActivations).
  if (kernel == "cublaslt_fp8") return 6e-2;
  if (kernel != "cublas" || t == DType::F32) return 2e-5;
  return t == DType::BF16 || t == DType::F8_E4M3 ? 1e-2 : 2e-3;
}

void check_matmul(const MmCase& c, Coverage& cov) {
  SCOPED_TRACE(label(c));
  const uint32_t seed = static_cast<uint32_t>(c.n * 1009 + c.out * 31 + c.in + static_cast<int>(c.type));
  const int64_t rb = row_bytes(c.type, c.in);
  const auto wf = random_floats(static_cast<size_t>(c.out * c.in), seed);
  std::vector<uint8_t> w(static_cast<size_t>(rb * c.out + 2), 0);
  const size_t woff = c.offset_w ? 2 : 0;
  for (int64_t o = 0; o < c.out; ++o) quantize_row(c.type, wf.data() + o * c.in, w.data() + woff + o * rb, c.in);
  const size_t xoff = c.offset_x ? 1 : 0;
  auto x = random_floats(static_cast<size_t>(c.n * c.in) + xoff, seed + 1);
  const auto bias = random_floats(static_cast<size_t>(c.out), seed + 2);
  std::vector<float> scale;
  if (c.scaled) {
    scale = random_floats(static_cast<size_t>(((c.out + 127) / 128) * ((c.in + 127) / 128)), seed + 3);
    for (auto& s : scale) s = std::fabs(s) + 0.1f;
  }

  // The reference on the host.
  Tensor hw = Tensor::view(w.data() + woff, c.type, {c.out, c.in});
  hw.block_scale = c.scaled ? scale.data() : nullptr;
  std::vector<float> want(static_cast<size_t>(c.n * c.out), NAN);
  const auto* ref = test::find_kernel<MatMulArgs>(Backend::CPU, "ref");
  ASSERT_TRUE(ref);
  ref->run(MatMulArgs{x.data() + xoff, c.n, &hw, c.bias ? bias.data() : nullptr, want.data()});

  DeviceBuffer dw = upload(w), dx = upload(x), db = upload(bias), ds = upload(scale);
  Tensor tw = Tensor::view(dw.as<uint8_t>() + woff, c.type, {c.out, c.in});
  tw.device = test::test_device();
  tw.block_scale = c.scaled ? ds.as<float>() : nullptr;
  const std::vector<float> poison(want.size(), NAN);
  DeviceBuffer dy = upload(poison);
  const MatMulArgs a{dx.as<float>() + xoff, c.n, &tw, c.bias ? db.as<float>() : nullptr, dy.as<float>()};
  for (const auto* k : test::kernels_under_test<MatMulArgs>()) {
    if (!test::refusal(*k, a).empty()) continue;
    upload_into(dy, poison);
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << "kernel " << k->name;
    if (!err.empty()) continue;
    const auto got = download<float>(dy, want.size());
    EXPECT_LE(l2_error(got, want), matmul_tol(k->name, c.type))
        << "kernel " << k->name << ", first unwritten element " << test::first_unwritten(got, want);
    ++cov.ran[k->name];
  }
}

TEST(CudaOps, MatMulEveryKernelAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F8_E4M3}) {
    const int64_t blk = dtype_info(t).block_elems;
    // Float-like: odd K (no 8-wide chunks), K tails, large K; quantized: 1, 2, 8 blocks.
    const std::vector<int64_t> ins = blk == 1 ? std::vector<int64_t>{8, 13, 200, 1000} : std::vector<int64_t>{blk, 2 * blk, 8 * blk};
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 33})
      for (int64_t out : {1, 17, 130})
        for (int64_t in : ins) check_matmul({t, n, out, in, n % 3 == 0}, cov);
    const int64_t big_k = blk == QK_K ? 14336 : 4096;
    check_matmul({t, 1, 4099, ins.back(), true}, cov);   // many rows, a row tail of the 4-row blocks
    check_matmul({t, 1, 64, big_k}, cov);                // large K, decode
    check_matmul({t, 8, 96, big_k, true}, cov);          // large K, the widest GEMV
    check_matmul({t, 64, 257, big_k}, cov);              // large K, GEMM with a row tail
    // gemv_warp's unrolled passes of 128 chunks and a remainder after them, odd rows (a warp's
    // second row past the end), several tokens.
    const int64_t passes_and_tail = blk == 1 ? 1160 : blk == QK_K ? 1280 : 1120;
    check_matmul({t, 3, 33, passes_and_tail, true}, cov);
    check_matmul({t, 1, 7, passes_and_tail}, cov);
    check_matmul({t, 3, 40, ins.back(), false, false, true}, cov);         // unaligned x: GEMV falls back
    check_matmul({t, 3, 40, ins.back(), false, false, false, true}, cov);  // unaligned weights
    check_matmul({t, 20, 40, ins.back(), true, false, true, true}, cov);   // both, GEMM
  }
  // gemv_q8 (Q8_0, in % 256 == 0): steps of 32 blocks and a shorter last step, odd rows (a
  // warp's second row past the end), several tokens; the widest row of a Llama-3-8B decode.
  check_matmul({DType::Q8_0, 3, 33, 1280, true}, cov);
  check_matmul({DType::Q8_0, 1, 7, 768}, cov);
  check_matmul({DType::Q8_0, 8, 131, 14336, true}, cov);
  check_matmul({DType::Q8_0, 5, 9, 256, false, false, false, true}, cov);  // weights 2 bytes in: falls back
  // FP8 with 128x128 block scales: partial tiles in both dimensions, K not a multiple of 8.
  for (int64_t n : {1, 3, 8, 9, 40})
    for (int64_t out : {1, 130, 257})
      for (int64_t in : {128, 260, 384, 1000}) check_matmul({DType::F8_E4M3, n, out, in, n == 9, true}, cov);
  check_matmul({DType::F8_E4M3, 2, 131, 1152, false, true}, cov);  // gemv_warp: passes, a remainder, scales
  // Zero-length: no tokens (nothing written, nothing faults); an empty reduction (y = bias).
  check_matmul({DType::F16, 0, 17, 64}, cov);
  check_matmul({DType::F32, 3, 5, 0, true}, cov);
  check_matmul({DType::F32, 12, 5, 0, true}, cov);
  cov.expect_ran({"gemv", "gemv_warp", "gemv_q8", "cublas", "cuda"});
}

// cuBLASLt's FP8 block-scaled GEMM against the reference run on the activations quantized the
// way the kernel quantizes them (per token and 128 columns, scale amax / 448, round to nearest
// even): only the order of the sums differs, so the bound is tight — and a run that fell back to
// the `cublas` path (exact activations) would miss it by ~3%. Shapes its path takes (K a multiple
// of 512, out of 16), token counts padded or not.
TEST(CudaOps, Fp8BlockGemmMatchesTheReferenceOnItsQuantizedActivations) {
  FP_SKIP_WITHOUT_GPU();
  const auto* lt = test::find_kernel<MatMulArgs>(Backend::CUDA, "cublaslt_fp8");
  ASSERT_TRUE(lt);
  int ran = 0;
  struct Shape {
    int64_t n, out, in;
    bool bias;
  };
  for (const Shape& c : {Shape{9, 256, 512, false}, Shape{16, 128, 1024, true}, Shape{40, 384, 2048, false},
                         Shape{100, 1024, 512, true}, Shape{513, 256, 1536, false}}) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " out=" + std::to_string(c.out) + " in=" + std::to_string(c.in));
    const uint32_t seed = static_cast<uint32_t>(c.n * 31 + c.out + c.in);
    const auto wf = random_floats(static_cast<size_t>(c.out * c.in), seed);
    std::vector<uint8_t> w(static_cast<size_t>(c.out * c.in));
    quantize_row(DType::F8_E4M3, wf.data(), w.data(), c.out * c.in);
    auto scale = random_floats(static_cast<size_t>((c.out / 128 + (c.out % 128 != 0)) * (c.in / 128)), seed + 1);
    for (auto& s : scale) s = std::fabs(s) * 0.01f + 0.001f;
    const auto x = random_floats(static_cast<size_t>(c.n * c.in), seed + 2, 3.0f);
    const auto bias = random_floats(static_cast<size_t>(c.out), seed + 3);
    // x as the kernel sees it: each (token, 128-column block) scaled to amax 448, rounded to E4M3.
    std::vector<float> xq(x.size());
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t k0 = 0; k0 < c.in; k0 += 128) {
        const float* src = x.data() + t * c.in + k0;
        float amax = 0;
        for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(src[j]));
        const float s = amax > 0 ? std::max(amax / 448.0f, 1e-30f) : 1.0f;
        for (int j = 0; j < 128; ++j) xq[static_cast<size_t>(t * c.in + k0 + j)] = fp8e4m3_to_f32(f32_to_fp8e4m3(src[j] / s)) * s;
      }
    Tensor hw = Tensor::view(w.data(), DType::F8_E4M3, {c.out, c.in});
    hw.block_scale = scale.data();
    std::vector<float> want(static_cast<size_t>(c.n * c.out), NAN), loose(want.size(), NAN);
    const auto* ref = test::find_kernel<MatMulArgs>(Backend::CPU, "ref");
    ref->run(MatMulArgs{xq.data(), c.n, &hw, c.bias ? bias.data() : nullptr, want.data()});
    ref->run(MatMulArgs{x.data(), c.n, &hw, c.bias ? bias.data() : nullptr, loose.data()});

    DeviceBuffer dw = upload(w), ds = upload(scale), dx = upload(x), db = upload(bias);
    Tensor tw = Tensor::view(dw.data(), DType::F8_E4M3, {c.out, c.in});
    tw.device = test::test_device();
    tw.block_scale = ds.as<float>();
    const std::vector<float> poison(want.size(), NAN);
    DeviceBuffer dy = upload(poison);
    const MatMulArgs a{dx.as<float>(), c.n, &tw, c.bias ? db.as<float>() : nullptr, dy.as<float>()};
    const std::string why = test::refusal(*lt, a);
    if (!why.empty()) GTEST_SKIP() << "cublaslt_fp8 refuses here: " << why;  // not a Hopper GPU
    EXPECT_EQ(test::run_kernel(*lt, a), "");
    const auto got = download<float>(dy, want.size());
    EXPECT_LE(l2_error(got, want), 2e-3) << "first unwritten element " << test::first_unwritten(got, want);
    EXPECT_LE(l2_error(got, loose), 6e-2);
    ++ran;
  }
  EXPECT_EQ(ran, 5);
}

// ---------------------------------------------------------------------------------------------
// row-wise and element-wise ops. Each runs the reference on host copies and every CUDA kernel on
// device copies, comparing the named output.

// Runs every kernel under test on `a` (device pointers), with `reset` restoring the device
// inputs/outputs before each run and `fetch` downloading the output; compares with want.
template <class Args>
void check_each(const std::string& what, const Args& a, const std::function<void()>& reset,
                const std::function<std::vector<float>()>& fetch, const std::vector<float>& want, double tol, Coverage& cov) {
  for (const auto* k : test::kernels_under_test<Args>()) {
    if (!test::refusal(*k, a).empty()) continue;
    reset();
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << Args::kName << " kernel " << k->name << " on " << what;
    if (!err.empty()) continue;
    const auto got = fetch();
    EXPECT_LE(l2_error(got, want), tol) << Args::kName << " kernel " << k->name << " on " << what
                                        << ", first unwritten element " << test::first_unwritten(got, want);
    ++cov.ran[k->name];
  }
}

TEST(CudaOps, EmbeddingEveryTableDtype) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F8_E4M3})
    for (int64_t dim : {32, 64, 96, 256, 4096})
      for (int64_t n : {1, 7, 33})
      for (float scale : {1.0f, 48.0f}) {  // 48: Gemma's sqrt(2304)
        if (dim % dtype_info(t).block_elems != 0) continue;
        const int64_t vocab = 50, rb = row_bytes(t, dim);
        const auto tf = random_floats(static_cast<size_t>(vocab * dim), static_cast<uint32_t>(dim + n));
        std::vector<uint8_t> table(static_cast<size_t>(vocab * rb));
        for (int64_t r = 0; r < vocab; ++r) quantize_row(t, tf.data() + r * dim, table.data() + r * rb, dim);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 17 + 3) % vocab);
        ids[0] = static_cast<int32_t>(vocab - 1);
        Tensor ht = Tensor::view(table.data(), t, {vocab, dim});
        std::vector<float> want(static_cast<size_t>(n * dim), NAN);
        test::find_kernel<EmbeddingArgs>(Backend::CPU, "ref")->run(EmbeddingArgs{&ht, ids.data(), n, want.data(), scale});
        DeviceBuffer dt = upload(table), di = upload(ids), dout = upload(want);
        Tensor tt = Tensor::view(dt.data(), t, {vocab, dim});
        tt.device = test::test_device();
        const EmbeddingArgs a{&tt, di.as<int32_t>(), n, dout.as<float>(), scale};
        const std::vector<float> poison(want.size(), NAN);
        check_each<EmbeddingArgs>(std::string(dtype_name(t)) + " dim=" + std::to_string(dim) + " n=" + std::to_string(n) +
                                      " scale=" + std::to_string(scale), a,
                                  [&] { upload_into(dout, poison); }, [&] { return download<float>(dout, want.size()); }, want,
                                  1e-6, cov);
      }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, RmsNormRowsOfEverySize) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {1, 3, 17})
    for (int64_t d : {1, 7, 64, 1000, 4096, 5120})
      for (bool in_place : {false, true}) {
        const auto x = random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 7 + d), 2.0f);
        auto w = random_floats(static_cast<size_t>(d), static_cast<uint32_t>(d + 1));
        std::vector<float> want(x.size(), NAN);
        const float eps = d == 7 ? 1e-6f : 1e-5f;
        test::find_kernel<RmsNormArgs>(Backend::CPU, "ref")->run(RmsNormArgs{x.data(), w.data(), n, d, eps, want.data()});
        DeviceBuffer dx = upload(x), dw = upload(w), dout = upload(want);
        const RmsNormArgs a{dx.as<float>(), dw.as<float>(), n, d, eps, in_place ? dx.as<float>() : dout.as<float>()};
        const std::vector<float> poison(want.size(), NAN);
        check_each<RmsNormArgs>("n=" + std::to_string(n) + " d=" + std::to_string(d) + (in_place ? " in place" : ""), a,
                                [&] {
                                  upload_into(dx, x);
                                  upload_into(dout, poison);
                                },
                                [&] { return download<float>(in_place ? dx : dout, want.size()); }, want, 1e-5, cov);
      }
  // The residual fused in, aliased as the model runs it (sum over x, out over add): the sum
  // exactly x + add, the output the reference's norm of it.
  for (int64_t n : {1, 3, 17})
    for (int64_t d : {7, 1000, 4096}) {
      const auto x = random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 5 + d), 2.0f);
      const auto r = random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 9 + d), 2.0f);
      auto w = random_floats(static_cast<size_t>(d), static_cast<uint32_t>(d + 5));
      std::vector<float> sum(x.size()), want(x.size(), NAN);
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + r[i];
      test::find_kernel<RmsNormArgs>(Backend::CPU, "ref")->run(RmsNormArgs{sum.data(), w.data(), n, d, 1e-5f, want.data()});
      DeviceBuffer dx = upload(x), dr = upload(r), dw = upload(w);
      RmsNormArgs a{dx.as<float>(), dw.as<float>(), n, d, 1e-5f, dr.as<float>()};
      a.add = dr.as<float>();
      a.sum = dx.as<float>();
      check_each<RmsNormArgs>("residual n=" + std::to_string(n) + " d=" + std::to_string(d), a,
                              [&] {
                                upload_into(dx, x);
                                upload_into(dr, r);
                              },
                              [&] {
                                EXPECT_EQ(download<float>(dx, sum.size()), sum) << "the sum x + add, n=" << n << " d=" << d;
                                return download<float>(dr, want.size());
                              },
                              want, 1e-5, cov);
    }
  // Strided rows in place (DeepSeek's latent c inside [c | k_pe]): the values past d untouched.
  for (int64_t n : {1, 5})
    for (int64_t d : {7, 512}) {
      const int64_t stride = d + 64;
      const auto x = random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n + d), 2.0f);
      auto w = random_floats(static_cast<size_t>(d), static_cast<uint32_t>(d + 3));
      std::vector<float> want = x;
      RmsNormArgs ra{want.data(), w.data(), n, d, 1e-6f, want.data()};
      ra.stride = stride;
      test::find_kernel<RmsNormArgs>(Backend::CPU, "ref")->run(ra);
      DeviceBuffer dx = upload(x), dw = upload(w);
      RmsNormArgs a{dx.as<float>(), dw.as<float>(), n, d, 1e-6f, dx.as<float>()};
      a.stride = stride;
      check_each<RmsNormArgs>("strided n=" + std::to_string(n) + " d=" + std::to_string(d), a, [&] { upload_into(dx, x); },
                              [&] { return download<float>(dx, want.size()); }, want, 1e-5, cov);
    }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, RopeBothStylesPartialRotationAndStrides) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (RopeStyle style : {RopeStyle::Adjacent, RopeStyle::NeoX})
    for (int64_t n : {1, 5, 33})
      for (auto [heads, hd] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {4, 64}, {32, 128}, {6, 96}})
        for (bool partial : {false, true})
          for (int64_t gap : {0, 16}) {
            const int64_t rot = partial ? hd / 2 : hd, stride = heads * hd + gap;
            const uint32_t seed = static_cast<uint32_t>(n * 13 + heads * 7 + hd + gap + partial);
            const auto x = random_floats(static_cast<size_t>(n * stride), seed);
            std::vector<int32_t> pos(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>((i * 977 + 5) % 8000);
            std::vector<float> inv(static_cast<size_t>(rot / 2));
            for (int64_t i = 0; i < rot / 2; ++i)
              inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(rot));
            const float mscale = gap ? 1.2f : 1.0f;
            std::vector<float> want = x;  // in place; the gaps and the unrotated tail stay as they are
            RopeArgs h{want.data(), pos.data(), n, heads, hd, rot, stride, inv.data(), mscale, style};
            test::find_kernel<RopeArgs>(Backend::CPU, "ref")->run(h);
            DeviceBuffer dx = upload(x), dp = upload(pos), di = upload(inv);
            RopeArgs a = h;
            a.x = dx.as<float>();
            a.pos = dp.as<int32_t>();
            a.inv_freq = di.as<float>();
            check_each<RopeArgs>(std::string(style == RopeStyle::NeoX ? "neox" : "adjacent") + " n=" + std::to_string(n) +
                                     " heads=" + std::to_string(heads) + " hd=" + std::to_string(hd) +
                                     " rot=" + std::to_string(rot) + " stride=" + std::to_string(stride),
                                 a, [&] { upload_into(dx, x); }, [&] { return download<float>(dx, x.size()); }, want, 1e-5, cov);
          }
  cov.expect_ran({"cuda"});
}

// silu_mul and gelu_mul (the same fields) over row counts, widths and interleaved rows.
template <class Args>
void check_glu_with_row_strides() {
  Coverage cov;
  for (int64_t n : {1, 7, 64})
    for (int64_t d : {1, 13, 4096, 14336})
      for (bool fused : {false, true}) {  // fused: gate and up interleaved per row, [n, 2d]
        const auto gu = random_floats(static_cast<size_t>(n * 2 * d), static_cast<uint32_t>(n + d), 3.0f);
        const int64_t stride = fused ? 2 * d : 0;
        const float* hg = gu.data();
        const float* hu = fused ? gu.data() + d : gu.data() + n * d;
        std::vector<float> want(static_cast<size_t>(n * d), NAN);
        test::find_kernel<Args>(Backend::CPU, "ref")->run(Args{hg, hu, n, d, stride, stride, want.data()});
        DeviceBuffer dgu = upload(gu), dout = upload(want);
        const float* g = dgu.as<float>();
        const Args a{g, fused ? g + d : g + n * d, n, d, stride, stride, dout.as<float>()};
        const std::vector<float> poison(want.size(), NAN);
        check_each<Args>("n=" + std::to_string(n) + " d=" + std::to_string(d) + (fused ? " fused" : ""), a,
                         [&] { upload_into(dout, poison); }, [&] { return download<float>(dout, want.size()); }, want, 5e-6,
                         cov);
      }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, SiluMulWithRowStrides) {
  FP_SKIP_WITHOUT_GPU();
  check_glu_with_row_strides<SiluMulArgs>();
}

TEST(CudaOps, GeluMulWithRowStrides) {
  FP_SKIP_WITHOUT_GPU();
  check_glu_with_row_strides<GeluMulArgs>();
}

// Gemma 2's final-logit soft-capping over a vocabulary's width and values far past the cap.
TEST(CudaOps, SoftcapAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {1, 255, 256000})
    for (float cap : {1.0f, 30.0f}) {
      const auto x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + 7), 40.0f);
      std::vector<float> want = x;
      test::find_kernel<SoftcapArgs>(Backend::CPU, "ref")->run(SoftcapArgs{want.data(), n, cap});
      DeviceBuffer dx = upload(x);
      const SoftcapArgs a{dx.as<float>(), n, cap};
      check_each<SoftcapArgs>("n=" + std::to_string(n) + " cap=" + std::to_string(cap), a, [&] { upload_into(dx, x); },
                              [&] { return download<float>(dx, x.size()); }, want, 1e-6, cov);
    }
  cov.expect_ran({"cuda"});
}

// The BF16 copies a device step hands from RMSNorm and SiLU-and-multiply to the GEMMs after them
// (RmsNormArgs / SiluMulArgs::bf16 -> MatMulArgs::xb): each copy is exactly the kernel's own F32
// output rounded, and a matmul given x as BF16 gives what it gives converting x itself.
TEST(CudaOps, Bf16CopiesFeedTheGemmsAsTheirOwnConversion) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {1, 9, 40})
    for (int64_t d : {7, 4096})
      for (bool residual : {false, true}) {
        const int64_t stride = d + 3;  // strided rows; the copy's rows are packed
        const auto x = random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n + d), 2.0f);
        const auto r = random_floats(static_cast<size_t>(n * stride), static_cast<uint32_t>(n * 3 + d), 2.0f);
        const auto w = random_floats(static_cast<size_t>(d), static_cast<uint32_t>(d + 2));
        DeviceBuffer dx = upload(x), dr = upload(r), dw = upload(w), dout = upload(x), dsum = upload(x);
        DeviceBuffer db = upload(std::vector<uint16_t>(static_cast<size_t>(n * d), 0xffff));
        RmsNormArgs a{dx.as<float>(), dw.as<float>(), n, d, 1e-5f, dout.as<float>()};
        a.stride = stride;
        if (residual) a.add = dr.as<float>(), a.sum = dsum.as<float>();
        a.bf16 = db.as<uint16_t>();
        for (const auto* k : test::kernels_under_test<RmsNormArgs>()) {
          if (!test::refusal(*k, a).empty()) continue;
          ASSERT_EQ(test::run_kernel(*k, a), "") << k->name;
          const auto out = download<float>(dout, x.size());
          const auto b = download<uint16_t>(db, static_cast<size_t>(n * d));
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < d; ++j)
              ASSERT_EQ(b[static_cast<size_t>(i * d + j)], f32_to_bf16(out[static_cast<size_t>(i * stride + j)]))
                  << k->name << " rmsnorm n=" << n << " d=" << d << (residual ? " +residual" : "") << " at " << i << "," << j;
          ++cov.ran[k->name];
        }
      }
  for (int64_t n : {1, 9, 64})
    for (int64_t d : {13, 14336}) {
      const auto gu = random_floats(static_cast<size_t>(n * 2 * d), static_cast<uint32_t>(n + d), 3.0f);
      DeviceBuffer dgu = upload(gu), dout = upload(std::vector<float>(static_cast<size_t>(n * d), NAN));
      DeviceBuffer db = upload(std::vector<uint16_t>(static_cast<size_t>(n * d), 0xffff));
      const float* g = dgu.as<float>();
      SiluMulArgs a{g, g + d, n, d, 2 * d, 2 * d, dout.as<float>()};  // gate and up side by side per row
      a.bf16 = db.as<uint16_t>();
      for (const auto* k : test::kernels_under_test<SiluMulArgs>()) {
        if (!test::refusal(*k, a).empty()) continue;
        ASSERT_EQ(test::run_kernel(*k, a), "") << k->name;
        const auto out = download<float>(dout, static_cast<size_t>(n * d));
        const auto b = download<uint16_t>(db, out.size());
        for (size_t e = 0; e < out.size(); ++e)
          ASSERT_EQ(b[e], f32_to_bf16(out[e])) << k->name << " silu_mul n=" << n << " d=" << d << " at " << e;
        ++cov.ran[k->name];
      }
    }
  // BF16 weights, GEMM sizes: the same output with x given as BF16 as with x converted by the
  // kernel, and the reference's within the BF16 tolerance.
  for (int64_t n : {9, 64, 300})
    for (int64_t in : {64, 4096}) {
      const int64_t out = 257;
      const auto wf = random_floats(static_cast<size_t>(out * in), static_cast<uint32_t>(n + in));
      std::vector<uint8_t> w(static_cast<size_t>(out * in * 2));
      quantize_row(DType::BF16, wf.data(), w.data(), out * in);
      const auto x = random_floats(static_cast<size_t>(n * in), static_cast<uint32_t>(n + in + 1));
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
      Tensor hw = Tensor::view(w.data(), DType::BF16, {out, in});
      std::vector<float> want(static_cast<size_t>(n * out), NAN);
      test::find_kernel<MatMulArgs>(Backend::CPU, "ref")->run(MatMulArgs{x.data(), n, &hw, nullptr, want.data()});
      DeviceBuffer dw = upload(w), dx = upload(x), dxb = upload(xb), dy = upload(want);
      Tensor tw = Tensor::view(dw.as<uint8_t>(), DType::BF16, {out, in});
      tw.device = test::test_device();
      MatMulArgs a{dx.as<float>(), n, &tw, nullptr, dy.as<float>()};
      for (const auto* k : test::kernels_under_test<MatMulArgs>()) {
        if (!test::refusal(*k, a).empty()) continue;
        const std::string label = k->name + " n=" + std::to_string(n) + " in=" + std::to_string(in);
        a.xb = nullptr;
        ASSERT_EQ(test::run_kernel(*k, a), "") << label;
        const auto converted = download<float>(dy, want.size());
        a.xb = dxb.as<uint16_t>();
        upload_into(dy, std::vector<float>(want.size(), NAN));
        ASSERT_EQ(test::run_kernel(*k, a), "") << label;
        const auto given = download<float>(dy, want.size());
        EXPECT_LE(l2_error(given, converted), 1e-6) << label;
        EXPECT_LE(l2_error(given, want), matmul_tol(k->name, DType::BF16)) << label;
        ++cov.ran[k->name];
      }
    }
  cov.expect_ran({"cuda", "cublas"});
}

TEST(CudaOps, AddAndItsAliases) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, (int64_t{1} << 20) + 3})
    for (int alias : {0, 1, 2}) {  // out is a fresh buffer, a, or b
      const auto x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n));
      const auto y = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + 1));
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] + y[static_cast<size_t>(i)];
      DeviceBuffer da = upload(x), dbb = upload(y), dout = upload(want);
      float* out = alias == 0 ? dout.as<float>() : alias == 1 ? da.as<float>() : dbb.as<float>();
      const AddArgs a{da.as<float>(), dbb.as<float>(), n, out};
      const std::vector<float> poison(want.size(), NAN);
      check_each<AddArgs>("n=" + std::to_string(n) + " alias=" + std::to_string(alias), a,
                          [&] {
                            upload_into(da, x);
                            upload_into(dbb, y);
                            upload_into(dout, poison);
                          },
                          [&] { return download<float>(alias == 0 ? dout : alias == 1 ? da : dbb, want.size()); }, want, 0.0,
                          cov);
    }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, SoftmaxRowsUpToVocabularyWidth) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {1, 5})
    for (int64_t d : {1, 2, 31, 1000, 32000, 151936}) {
      const auto x = random_floats(static_cast<size_t>(n * d), static_cast<uint32_t>(n * 3 + d), 4.0f);
      std::vector<float> want = x;
      test::find_kernel<SoftmaxArgs>(Backend::CPU, "ref")->run(SoftmaxArgs{want.data(), n, d});
      DeviceBuffer dx = upload(x);
      const SoftmaxArgs a{dx.as<float>(), n, d};
      check_each<SoftmaxArgs>("n=" + std::to_string(n) + " d=" + std::to_string(d), a, [&] { upload_into(dx, x); },
                              [&] { return download<float>(dx, x.size()); }, want, 1e-4, cov);
    }
  cov.expect_ran({"cuda"});
}

// The next step's tokens from the ids the step before sampled (async scheduling): positions
// fed from a row take its id, the others keep theirs; bit-exact.
TEST(CudaOps, TokenFeedTakesTheNamedRows) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {0, 1, 7, 256, 257, 5000}) {
    std::mt19937 rng(static_cast<uint32_t>(n + 3));
    const int64_t rows = std::max<int64_t>(n / 2, 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n)), from(static_cast<size_t>(n)), ids(static_cast<size_t>(rows));
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 150000);
    for (auto& r : from) r = rng() % 3 == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(rows));
    for (auto& v : ids) v = static_cast<int32_t>(rng() % 150000);
    auto want = tokens;
    test::find_kernel<TokenFeedArgs>(Backend::CPU, "ref")->run(TokenFeedArgs{want.data(), from.data(), ids.data(), n});
    DeviceBuffer dt = upload(tokens), df = upload(from), di = upload(ids);
    const TokenFeedArgs a{dt.as<int32_t>(), df.as<int32_t>(), di.as<int32_t>(), n};
    for (const auto* k : test::kernels_under_test<TokenFeedArgs>()) {
      if (!test::refusal(*k, a).empty()) continue;
      upload_into(dt, tokens);
      const std::string err = test::run_kernel(*k, a);
      EXPECT_EQ(err, "") << k->name;
      if (!err.empty()) continue;
      EXPECT_EQ(download<int32_t>(dt, tokens.size()), want) << "token_feed kernel " << k->name << " n=" << n;
      ++cov.ran[k->name];
    }
  }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, ArgmaxFirstOnTiesAndNaNs) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  struct Rows {
    int64_t n, d;
    int special;  // 0 random, 1 all equal, 2 the maximum twice, 3 NaN inside, 4 NaN first
  };
  std::vector<Rows> cases;
  for (int64_t n : {1, 3, 8})
    for (int64_t d : {1, 2, 255, 256, 257, 32000, 151936}) cases.push_back({n, d, 0});
  for (int sp : {1, 2, 3, 4}) cases.push_back({2, 1000, sp});
  for (const auto& c : cases) {
    auto x = random_floats(static_cast<size_t>(c.n * c.d), static_cast<uint32_t>(c.n * 11 + c.d + c.special));
    for (int64_t r = 0; r < c.n; ++r) {
      float* row = x.data() + r * c.d;
      if (c.special == 1) std::fill(row, row + c.d, 0.5f);
      if (c.special == 2) row[100] = row[700] = 50.0f;
      if (c.special == 3) row[300] = NAN, row[301] = 60.0f;
      if (c.special == 4) row[0] = NAN;
    }
    std::vector<int32_t> want(static_cast<size_t>(c.n), -1);
    test::find_kernel<ArgmaxArgs>(Backend::CPU, "ref")->run(ArgmaxArgs{x.data(), c.n, c.d, want.data()});
    DeviceBuffer dx = upload(x), dout = upload(want);
    const ArgmaxArgs a{dx.as<float>(), c.n, c.d, dout.as<int32_t>()};
    const std::vector<int32_t> poison(want.size(), -1);
    for (const auto* k : test::kernels_under_test<ArgmaxArgs>()) {
      if (!test::refusal(*k, a).empty()) continue;
      upload_into(dout, poison);
      const std::string err = test::run_kernel(*k, a);
      EXPECT_EQ(err, "") << k->name;
      if (!err.empty()) continue;
      EXPECT_EQ(download<int32_t>(dout, want.size()), want)
          << "argmax kernel " << k->name << " n=" << c.n << " d=" << c.d << " special=" << c.special;
      ++cov.ran[k->name];
    }
  }
  cov.expect_ran({"cuda"});
}

TEST(CudaOps, KvWriteBitExactIntoEveryPoolDtype) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 5, 64})
      for (auto [kw, vw] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {1024, 1024}, {192, 128}, {576, 0}}) {
        const int64_t slots_total = 3 * n + 7, eb = dtype_info(t).block_bytes;
        auto k = random_floats(static_cast<size_t>(n * kw), static_cast<uint32_t>(n + kw), 2.0f);
        auto v = random_floats(static_cast<size_t>(n * std::max<int64_t>(vw, 1)), static_cast<uint32_t>(n + vw + 1), 2.0f);
        k[0] = 70000.0f;  // beyond F16's range: inf on both sides
        std::vector<int64_t> slots(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = (i * 5 + 2) % slots_total;  // distinct: 5 and 3n+7 coprime for these n
        std::vector<uint8_t> kpool(static_cast<size_t>(slots_total * kw * eb)), vpool(static_cast<size_t>(slots_total * vw * eb) + 1);
        for (size_t i = 0; i < kpool.size(); ++i) kpool[i] = static_cast<uint8_t>(i * 37 + 11);
        for (size_t i = 0; i < vpool.size(); ++i) vpool[i] = static_cast<uint8_t>(i * 53 + 5);
        std::vector<uint8_t> want_k = kpool, want_v = vpool;
        test::find_kernel<KvWriteArgs>(Backend::CPU, "ref")
            ->run(KvWriteArgs{want_k.data(), want_v.data(), t, kw, vw, slots.data(), n, k.data(), vw ? v.data() : nullptr});
        DeviceBuffer dk = upload(kpool), dv = upload(vpool), ds = upload(slots), dkr = upload(k), dvr = upload(v);
        const KvWriteArgs a{dk.data(), dv.data(), t, kw, vw, ds.as<int64_t>(), n, dkr.as<float>(), vw ? dvr.as<float>() : nullptr};
        for (const auto* kern : test::kernels_under_test<KvWriteArgs>()) {
          if (!test::refusal(*kern, a).empty()) continue;
          upload_into(dk, kpool);
          upload_into(dv, vpool);
          const std::string err = test::run_kernel(*kern, a);
          EXPECT_EQ(err, "") << kern->name;
          if (!err.empty()) continue;
          EXPECT_TRUE(download<uint8_t>(dk, kpool.size()) == want_k)
              << "kv_write " << kern->name << " K pool differs: " << dtype_name(t) << " n=" << n << " width=" << kw;
          EXPECT_TRUE(download<uint8_t>(dv, vpool.size()) == want_v)
              << "kv_write " << kern->name << " V pool differs: " << dtype_name(t) << " n=" << n << " width=" << vw;
          ++cov.ran[kern->name];
        }
      }
  cov.expect_ran({"cuda"});
}

// Stored rows between slots and packed rows, both ways, with and without a row map: widths
// whose rows are 16-byte words, 4-byte, and 2-byte (odd F16 widths), MLA's K-only row, and a
// packed buffer at an odd 2-byte offset (the kernel's narrower words).
TEST(CudaOps, KvMoveBitExactBothWays) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {0, 1, 5, 64})
      for (auto [kw, vw] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {7, 5}, {192, 128}, {576, 0}})
        for (bool into_pool : {false, true})
          for (bool mapped : {false, true})
            for (size_t offset : {size_t{0}, size_t{2}}) {
              const int64_t eb = dtype_info(t).block_bytes, kb = kw * eb, vb = vw * eb, slots_total = 3 * n + 7;
              const int64_t packed_rows = n + 3;
              std::vector<int64_t> slots(static_cast<size_t>(n));
              std::vector<int32_t> rows(static_cast<size_t>(std::max<int64_t>(n, 1)));
              for (int64_t i = 0; i < n; ++i) {
                slots[static_cast<size_t>(i)] = (i * 5 + 2) % slots_total;  // distinct, as above
                rows[static_cast<size_t>(i)] = static_cast<int32_t>((n - 1 - i + 2) % packed_rows);  // reversed, shifted
              }
              std::vector<uint8_t> kpool(static_cast<size_t>(slots_total * kb)), vpool(static_cast<size_t>(slots_total * vb) + 1),
                  packed(offset + static_cast<size_t>(packed_rows * (kb + vb)));
              for (size_t i = 0; i < kpool.size(); ++i) kpool[i] = static_cast<uint8_t>(i * 37 + 11);
              for (size_t i = 0; i < vpool.size(); ++i) vpool[i] = static_cast<uint8_t>(i * 53 + 5);
              for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i * 29 + 3);
              std::vector<uint8_t> want_k = kpool, want_v = vpool, want_p = packed;
              const int32_t* host_rows = mapped ? rows.data() : nullptr;
              test::find_kernel<KvMoveArgs>(Backend::CPU, "ref")
                  ->run(KvMoveArgs{want_k.data(), want_v.data(), kb, vb, slots.data(), host_rows, n, want_p.data() + offset,
                                   into_pool});
              DeviceBuffer dk = upload(kpool), dv = upload(vpool), dp = upload(packed), ds = upload(slots), dr = upload(rows);
              const KvMoveArgs a{dk.data(), dv.data(),      kb, vb, ds.as<int64_t>(), mapped ? dr.as<int32_t>() : nullptr,
                                 n,         dp.as<uint8_t>() + offset, into_pool};
              for (const auto* kern : test::kernels_under_test<KvMoveArgs>()) {
                if (!test::refusal(*kern, a).empty()) continue;
                upload_into(dk, kpool);
                upload_into(dv, vpool);
                upload_into(dp, packed);
                const std::string err = test::run_kernel(*kern, a);
                EXPECT_EQ(err, "") << kern->name;
                if (!err.empty()) continue;
                const std::string what = std::string("kv_move ") + kern->name + " " + dtype_name(t) + " n=" + std::to_string(n) +
                                         " widths=" + std::to_string(kw) + "/" + std::to_string(vw) +
                                         (into_pool ? " unpack" : " pack") + (mapped ? " mapped" : "") +
                                         " offset=" + std::to_string(offset);
                EXPECT_TRUE(download<uint8_t>(dk, kpool.size()) == want_k) << what << ": K pool differs";
                EXPECT_TRUE(download<uint8_t>(dv, vpool.size()) == want_v) << what << ": V pool differs";
                EXPECT_TRUE(download<uint8_t>(dp, packed.size()) == want_p) << what << ": packed rows differ";
                ++cov.ran[kern->name];
              }
            }
  cov.expect_ran({"cuda"});
}

// ---------------------------------------------------------------------------------------------
// dispatch, the ledger and refusals

TEST(CudaOps, LedgerRecordsTheCudaBackendAndItsKernels) {
  FP_SKIP_WITHOUT_GPU();
  if (test::cuda_tests_on_cpu()) GTEST_SKIP() << "dispatches CUDA kernels";
  Ledger::global().reset();
  const int64_t in = 256, out = 64;
  const auto wf = random_floats(static_cast<size_t>(in * out), 1);
  std::vector<uint16_t> w(wf.size());
  quantize_row(DType::BF16, wf.data(), w.data(), static_cast<int64_t>(wf.size()));
  const auto x = random_floats(static_cast<size_t>(16 * in), 2);
  DeviceBuffer dw = upload(w), dx = upload(x), dy(Device::CUDA, 16 * out * sizeof(float));
  Tensor tw = Tensor::view(dw.data(), DType::BF16, {out, in});
  tw.device = Device::CUDA;
  {
    DeviceScope scope(Device::CUDA);
    dispatch(MatMulArgs{dx.as<float>(), 1, &tw, nullptr, dy.as<float>()});
    dispatch(MatMulArgs{dx.as<float>(), 16, &tw, nullptr, dy.as<float>()});
    dispatch(AddArgs{dy.as<float>(), dy.as<float>(), 16 * out, dy.as<float>()});
    device_memory(Device::CUDA).synchronize();
  }
  std::map<std::string, std::string> kernel_of;
  for (const auto& e : Ledger::global().snapshot()) {
    EXPECT_EQ(e.backend, "cuda") << e.op << " " << e.shape_class;
    EXPECT_EQ(e.shape_class.rfind("cuda: ", 0), 0u) << e.shape_class;
    EXPECT_FALSE(e.fallback()) << e.op << " " << e.shape_class;
    kernel_of[e.op + " " + e.shape_class] = e.kernel;
  }
  EXPECT_EQ(kernel_of["matmul cuda: w=BF16 gemv"], "gemv");
  EXPECT_EQ(kernel_of["matmul cuda: w=BF16 gemm32"], "cublas");
  EXPECT_EQ(kernel_of["add cuda: f32"], "cuda");
  // A call no CUDA kernel takes fails with every refusal's reason (and never runs a CPU kernel).
  RmsNormArgs rn{dx.as<float>(), dx.as<float>(), 1, in, 1e-5f, dy.as<float>()};
  rn.q8 = reinterpret_cast<BlockQ8_0*>(dy.data());
  DeviceScope scope(Device::CUDA);
  try {
    dispatch(rn);
    ADD_FAILURE() << "rmsnorm with a Q8_0 output ran on the GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda: a fused Q8_0 output"), std::string::npos) << e.what();
  }
}

// Through the registry, where one decision is cached per shape class: F32 matrices 64, 172 and
// again 64 values wide at one token, as stories260K's attention and FFN rows alternate. The GEMV
// reads whole 8-value chunks and refuses 172; that refusal must not be cached for 64 nor the
// GEMV's acceptance for 172 (on the H200 it was: the FFN's last 4 columns were dropped).
TEST(CudaOps, MatMulRowsOfOddWidthNeverMeetTheGemvsCachedDecision) {
  const auto cls = [](int64_t in) {
    std::vector<float> f(static_cast<size_t>(4 * in));
    Tensor w = Tensor::view(f.data(), DType::F32, {4, in});
    return MatMulArgs{f.data(), 1, &w, nullptr, f.data()}.shape_class();
  };
  EXPECT_NE(cls(64), cls(172));
  EXPECT_EQ(cls(64), cls(4096));
  FP_SKIP_WITHOUT_GPU();
  if (test::cuda_tests_on_cpu()) GTEST_SKIP() << "skipped: the registry's CUDA kernels need a GPU";
  for (int64_t in : {64, 172, 64}) {
    SCOPED_TRACE("in=" + std::to_string(in));
    const int64_t out = 40;
    const auto wf = random_floats(static_cast<size_t>(out * in), static_cast<uint32_t>(in));
    const auto x = random_floats(static_cast<size_t>(in), static_cast<uint32_t>(in + 1));
    Tensor hw = Tensor::view(wf.data(), DType::F32, {out, in});
    std::vector<float> want(static_cast<size_t>(out));
    test::find_kernel<MatMulArgs>(Backend::CPU, "ref")->run(MatMulArgs{x.data(), 1, &hw, nullptr, want.data()});
    DeviceBuffer dw = upload(wf), dx = upload(x), dy = upload(std::vector<float>(want.size(), NAN));
    Tensor tw = Tensor::view(dw.data(), DType::F32, {out, in});
    tw.device = Device::CUDA;
    {
      DeviceScope scope(Device::CUDA);
      dispatch(MatMulArgs{dx.as<float>(), 1, &tw, nullptr, dy.as<float>()});
      device_memory(Device::CUDA).synchronize();
    }
    EXPECT_LE(l2_error(download<float>(dy, want.size()), want), 2e-5);
  }
}

// No launches: each CUDA kernel's refuse() on calls outside what it supports names the reason
// (without a GPU: that every one refuses with the reason there is none).
TEST(CudaOps, RefusalsCarryReasons) {
  const std::string no_gpu = device_unavailable(Device::CUDA);
  if (!test::find_kernel<MatMulArgs>(Backend::CUDA, "cuda")) GTEST_SKIP() << "skipped: no GPU (" << no_gpu << ")";
  auto why = [](const auto* k, const auto& args) { return k ? test::refusal(*k, args) : std::string("<not registered>"); };
  std::vector<float> f(1024);
  if (!no_gpu.empty()) {
    // Without a GPU every CUDA kernel refuses first, with the reason (so nothing ever launches).
    Tensor w = Tensor::view(f.data(), DType::F32, {4, 256});
    const MatMulArgs mm{f.data(), 1, &w, nullptr, f.data()};
    for (const auto& k : OpRegistry<MatMulArgs>::instance().kernels()) {
      if (k.backend == Backend::CUDA) {
        EXPECT_EQ(why(&k, mm), no_gpu) << k.name;
      }
    }
    AttentionArgs at{};
    at.n = at.n_seqs = 1;
    at.n_heads = at.n_kv_heads = 1;
    at.head_dim = at.v_dim = 64;
    for (const auto& k : OpRegistry<AttentionArgs>::instance().kernels()) {
      if (k.backend == Backend::CUDA) {
        EXPECT_EQ(why(&k, at), no_gpu) << k.name;
      }
    }
    GTEST_SKIP() << "skipped: no GPU (" << no_gpu << "); checked that the CUDA kernels refuse with that reason";
  }
  // Q5_K: a GGUF type no CUDA kernel reads (Q6_K, once the example here, is read by all three now).
  std::vector<uint8_t> q5(static_cast<size_t>(row_bytes(DType::Q5_K, 256)) * 4);
  Tensor w5 = Tensor::view(q5.data(), DType::Q5_K, {4, 256});
  MatMulArgs mm{f.data(), 1, &w5, nullptr, f.data()};
  for (const char* name : {"gemv", "cublas", "cuda"})
    EXPECT_NE(why(test::find_kernel<MatMulArgs>(Backend::CUDA, name), mm).find("Q5_K"), std::string::npos) << name;
  Tensor w16 = Tensor::view(f.data(), DType::F16, {4, 256});
  mm.w = &w16;
  mm.n = 9;
  EXPECT_NE(why(test::find_kernel<MatMulArgs>(Backend::CUDA, "gemv"), mm).find("n=9"), std::string::npos);
  EXPECT_EQ(why(test::find_kernel<MatMulArgs>(Backend::CUDA, "cublas"), mm), "");
  mm.n = 8;
  EXPECT_EQ(why(test::find_kernel<MatMulArgs>(Backend::CUDA, "gemv"), mm), "");
  Tensor w13 = Tensor::view(f.data(), DType::F16, {4, 13});
  mm.w = &w13;
  EXPECT_NE(why(test::find_kernel<MatMulArgs>(Backend::CUDA, "gemv"), mm).find("multiple of 8"), std::string::npos);

  AttentionArgs at{};
  at.n = 3;
  at.n_seqs = 1;
  at.n_heads = 8;
  at.n_kv_heads = 2;
  at.head_dim = at.v_dim = 128;
  at.page_size = 16;
  at.kv_dtype = DType::F16;
  const auto* split = test::find_kernel<AttentionArgs>(Backend::CUDA, "split_kv");
  const auto* tiled = test::find_kernel<AttentionArgs>(Backend::CUDA, "tiled");
  EXPECT_NE(why(split, at).find("prefill"), std::string::npos) << why(split, at);
  EXPECT_EQ(why(tiled, at), "");
  at.n = 1;
  EXPECT_EQ(why(split, at), "");
  at.kv_dtype = DType::F8_E4M3;
  for (const char* name : {"split_kv", "tiled", "cuda"})
    EXPECT_NE(why(test::find_kernel<AttentionArgs>(Backend::CUDA, name), at).find("KV cache dtype F8_E4M3"), std::string::npos)
        << name;
  at.kv_dtype = DType::BF16;
  at.head_dim = at.v_dim = 512;
  for (const char* name : {"split_kv", "tiled", "cuda"})
    EXPECT_NE(why(test::find_kernel<AttentionArgs>(Backend::CUDA, name), at).find("512"), std::string::npos) << name;
  at.head_dim = at.v_dim = 64;
  at.n_kv_heads = 3;
  for (const char* name : {"split_kv", "tiled", "cuda"})
    EXPECT_NE(why(test::find_kernel<AttentionArgs>(Backend::CUDA, name), at), "") << name;

  RmsNormArgs rn{f.data(), f.data(), 1, 64, 1e-5f, f.data()};
  rn.q8 = reinterpret_cast<BlockQ8_0*>(q5.data());
  EXPECT_NE(why(test::find_kernel<RmsNormArgs>(Backend::CUDA, "cuda"), rn), "");
  Tensor e4 = Tensor::view(q5.data(), DType::Q5_K, {4, 256});
  EmbeddingArgs em{&e4, nullptr, 1, f.data()};
  EXPECT_NE(why(test::find_kernel<EmbeddingArgs>(Backend::CUDA, "cuda"), em).find("Q5_K"), std::string::npos);
  KvWriteArgs kv{};
  kv.dtype = DType::Q8_0;
  EXPECT_NE(why(test::find_kernel<KvWriteArgs>(Backend::CUDA, "cuda"), kv).find("Q8_0"), std::string::npos);
}

}  // namespace
}  // namespace fp
