// tests/backend_ops_matmul_test.cpp — every matmul kernel against its reference twin over
// weight dtypes and shapes: 1..4 tokens (GEMV path) and more (GEMM path), odd row counts,
// K tails (rows ending inside a 256-value group), large K, biases, FP8 block scales with partial tiles; the _X8 forms (Q8_0_X8, Q4_K_X8,
// Q6_K_X8, Q3_K_X8, Q2_K_X8, Q4_0_X8, Q4_1_X8, Q5_0_X8, Q5_1_X8, IQ4_NL_X8, IQ4_XS_X8, MXFP4_X8: repacked at load) against their reference and
// against the file layout's on the same weights.
#include <gtest/gtest.h>

#include "backend_ops.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/ops.h"

namespace fp {
namespace {

struct MatMulCase {
  DType type;
  int64_t n, out, in;
  bool bias = false;
  bool scaled = false;  // FP8 128x128 block scales
};

// Quantized weights are made from Gaussian values, as real checkpoints are.
struct MatMulData {
  std::vector<uint8_t> w;
  std::vector<float> x, bias, scale;
  Tensor t;
};

MatMulArgs build(const MatMulCase& c, MatMulData& d, std::vector<float>& out) {
  auto wf = test::random_floats(static_cast<size_t>(c.out * c.in), static_cast<uint32_t>(c.out * 31 + c.in));
  int64_t rb = row_bytes(c.type, c.in);
  d.w.assign(static_cast<size_t>(rb * c.out), 0);
  for (int64_t o = 0; o < c.out; ++o) quantize_row(c.type, wf.data() + o * c.in, d.w.data() + o * rb, c.in);
  d.x = test::random_floats(static_cast<size_t>(c.n * c.in), static_cast<uint32_t>(c.n + 7));
  d.bias = test::random_floats(static_cast<size_t>(c.out), 5);
  d.t = Tensor::view(d.w.data(), c.type, {c.out, c.in});
  if (c.scaled) {
    d.scale = test::random_floats(static_cast<size_t>(((c.out + 127) / 128) * ((c.in + 127) / 128)), 9);
    for (auto& s : d.scale) s = std::fabs(s) + 0.1f;
    d.t.block_scale = d.scale.data();
  }
  out.assign(static_cast<size_t>(c.n * c.out), NAN);
  return MatMulArgs{d.x.data(), c.n, &d.t, c.bias ? d.bias.data() : nullptr, out.data()};
}

std::string label(const MatMulCase& c) {
  return std::string(dtype_name(c.type)) + " n=" + std::to_string(c.n) + " out=" + std::to_string(c.out) +
         " in=" + std::to_string(c.in) + (c.bias ? " +bias" : "") + (c.scaled ? " block-scaled" : "");
}

std::vector<MatMulCase> cases() {
  std::vector<MatMulCase> cs;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::Q8_0, DType::Q8_0_X8, DType::Q4_0, DType::Q4_1,
                  DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q4_K_X8, DType::Q5_K, DType::Q6_K,
                  DType::Q6_K_X8, DType::Q4_0_X8, DType::Q4_1_X8, DType::Q5_0_X8, DType::Q5_1_X8, DType::Q3_K_X8,
                  DType::Q2_K_X8, DType::IQ4_NL, DType::IQ4_XS, DType::IQ4_NL_X8, DType::IQ4_XS_X8, DType::MXFP4,
                  DType::MXFP4_X8}) {
    int64_t blk = dtype_info(t).block_elems;
    // The formats whose kernels share the Q4_0/Q4_K/Q6_K (Q4_0_X8) code paths take fewer token counts and
    // row counts (decode, its tail, the interleaved tiles' tail), and so does every format under
    // the sanitizers, which run each case ~5x slower; there the two big cases take a shorter row,
    // and the shared-path formats neither the longest row (8 blocks) nor the many-rows case.
    const bool shared_paths = t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q2_K ||
                              t == DType::Q3_K || t == DType::Q5_K || t == DType::Q4_1_X8 || t == DType::Q5_0_X8 ||
                              t == DType::Q5_1_X8 || t == DType::Q3_K_X8 || t == DType::Q2_K_X8 || t == DType::IQ4_NL ||
                              t == DType::IQ4_XS || t == DType::IQ4_NL_X8 || t == DType::IQ4_XS_X8 || t == DType::MXFP4 ||
                              t == DType::MXFP4_X8;
    const bool short_sweep = shared_paths && test::kSanitized;
    std::vector<int64_t> ins = blk == 1      ? std::vector<int64_t>{8, 13, 64, 300, 1024}
                               : short_sweep ? std::vector<int64_t>{blk, 2 * blk}
                                             : std::vector<int64_t>{blk, 2 * blk, 8 * blk};
    const std::vector<int64_t> ns = shared_paths    ? std::vector<int64_t>{1, 3, 5, 13}
                                    : test::kSanitized ? std::vector<int64_t>{1, 3, 4, 13, 16}
                                                       : std::vector<int64_t>{1, 2, 3, 4, 5, 7, 13, 16};
    const std::vector<int64_t> outs = shared_paths ? std::vector<int64_t>{1, 17} : std::vector<int64_t>{1, 17, 40};
    const int64_t big_in = test::kSanitized ? ins[1] : ins.back();
    for (int64_t n : ns)
      for (int64_t out : outs)
        for (int64_t in : ins) cs.push_back({t, n, out, in, n == 3 || (n == 1 && out == 17)});
    if (!short_sweep) cs.push_back({t, 1, 4099, big_in, false});  // many rows: every thread gets a share
    cs.push_back({t, 64, 130, big_in, true});   // several panels, token tail
    cs.push_back({t, 33, 40, ins.front(), false});  // just past 32 tokens, a partial panel
    cs.push_back({t, 77, 33, ins[1], true});        // a token tail of 5, one row past a panel
    if (dtype_info(t).quantized) cs.push_back({t, 261, 33, ins[1], false});  // past 256: quantized weights on BF16 panels
    if (t == DType::Q4_0_X8 || t == DType::Q5_1_X8 || t == DType::Q4_K_X8 || t == DType::Q6_K_X8) {
      // Rows read in place up to 12 tokens: 3 groups of 4, and a tail.
      cs.push_back({t, 12, 40, ins[1], false});
      cs.push_back({t, 9, 17, ins.back(), true});
    }
    if (t == DType::BF16) cs.push_back({t, 40, 33, 4101, true});  // K past the AMX kernel's 4096-column chunk, odd
    if (t == DType::Q8_0_X8 || t == DType::Q4_K_X8) cs.push_back({t, 300, 33, 4352, true});  // the same, quantized
    // K of 10 groups of 256: the AVX2 4-bit tiles sweep K in blocks of 8 groups and add the
    // second block's sums (not the bias again) into y.
    if (dtype_info(t).quantized) cs.push_back({t, 7, 9, 2560, true});
    // The 32-value file formats' rows may end inside a 256-value group of the interleaved GEMM
    // (its last group zero-padded): one group and a block, 11 groups and 2 blocks (gpt-oss's 2880,
    // past the AVX2 tiles' 8-group K blocks), and three blocks just past the GEMV's 4 tokens.
    if (blk == 32) {
      cs.push_back({t, 9, 17, 288, true});
      cs.push_back({t, 13, 9, 2880, true});
      cs.push_back({t, 5, 3, 96, false});
      cs.push_back({t, 261, 9, 288, false});  // on BF16 panels: a whole group and a block
    }
  }
  for (int64_t n : {1, 3, 9})
    for (int64_t out : {1, 130, 257})
      for (int64_t in : {128, 260, 384}) cs.push_back({DType::F8_E4M3, n, out, in, n == 9, true});
  return cs;
}

TEST(BackendOps, MatMulEveryKernelAgainstItsReference) {
  int checked = 0, bf16_checked = 0, bf16_quantized_checked = 0, amx_checked = 0, amx_quantized_checked = 0;
  for (const auto& c : cases()) {
    MatMulData d;
    std::function<MatMulArgs(std::vector<float>&)> make = [&](std::vector<float>& out) { return build(c, d, out); };
    // Float-like weights are compared with `ref` (f32 activations); quantized weights run
    // integer dot products on 8-bit activations, as `ref_q8act` does; the AVX512-BF16 kernel
    // multiplies BF16 weights by activations rounded to BF16, as `ref_bf16act` does ...
    bool int_act = dtype_info(c.type).quantized;
    const auto bf16_act = [](const Kernel<MatMulArgs>& k) { return k.name == "avx512bf16" || k.name == "amxbf16"; };
    const auto amx = [](const Kernel<MatMulArgs>& k) { return k.name == "amxbf16"; };
    checked += test::check_kernels<MatMulArgs>(label(c), make, int_act ? "ref_q8act" : "ref", 1e-4,
                                               [&](const Kernel<MatMulArgs>& k) { return !bf16_act(k); });
    // ... and F16 or quantized weights beyond 32 / 256 tokens converted and rounded to BF16 the
    // same way (the AMX kernel too: the same products, on tiles).
    if (c.type == DType::BF16 || c.type == DType::F16 || (int_act && c.type != DType::F8_E4M3)) {
      const int n = test::check_kernels<MatMulArgs>(label(c), make, "ref_bf16act", 1e-5,
                                                    [](const Kernel<MatMulArgs>& k) { return k.name == "avx512bf16"; });
      bf16_checked += n;
      if (int_act) bf16_quantized_checked += n;
      const int m = test::check_kernels<MatMulArgs>(label(c), make, "ref_bf16act", 1e-5, amx);
      amx_checked += m;
      if (int_act) amx_quantized_checked += m;
    }
  }
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked, 0);
  }
  if (cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}).empty()) {
    EXPECT_GT(bf16_checked, 0) << "the AVX512-BF16 kernel ran no case";
    EXPECT_GT(bf16_quantized_checked, 0) << "the AVX512-BF16 kernel ran no quantized case";
  }
  if (cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"}).empty()) {
    EXPECT_GT(amx_checked, 0) << "the AMX kernel ran no case";
    EXPECT_GT(amx_quantized_checked, 0) << "the AMX kernel ran no quantized case";
  }
}

// The repacked layouts change nothing but the order of the bytes: every kernel on Q8_0_X8
// (Q4_K_X8, Q6_K_X8, Q4_0_X8 ... Q5_1_X8) weights gives its reference's result on the Q8_0 (Q4_K,
// Q6_K, Q4_0 ... Q5_1) weights they were repacked from (ref_q8act's, or for the AVX512-BF16
// kernel ref_bf16act's).
TEST(BackendOps, RepackedWeightsMatchTheFileLayoutsReference) {
  const Kernel<MatMulArgs>*ref = nullptr, *ref_bf16 = nullptr;
  for (auto& k : OpRegistry<MatMulArgs>::instance().kernels()) {
    if (k.name == "ref_q8act") ref = &k;
    if (k.name == "ref_bf16act") ref_bf16 = &k;
  }
  ASSERT_TRUE(ref && ref_bf16);
  int checked = 0;
  for (const auto& c : cases()) {
    const bool block32 = block32_x8(c.type) != c.type;
    // (MXFP4 rows of any multiple of 32 repack: an MXFP4_X8 row may end in plain blocks.)
    if (((c.type != DType::Q8_0 && !block32) || (c.in % 256 != 0 && c.type != DType::MXFP4)) && c.type != DType::Q4_K && c.type != DType::Q6_K &&
        c.type != DType::Q3_K && c.type != DType::Q2_K && c.type != DType::IQ4_XS)
      continue;
    const DType packed_type = c.type == DType::Q8_0   ? DType::Q8_0_X8
                              : c.type == DType::Q4_K ? DType::Q4_K_X8
                              : c.type == DType::Q6_K ? DType::Q6_K_X8
                              : c.type == DType::Q3_K ? DType::Q3_K_X8
                              : c.type == DType::Q2_K ? DType::Q2_K_X8
                              : c.type == DType::IQ4_XS ? DType::IQ4_XS_X8
                                                      : block32_x8(c.type);
    MatMulData d;
    std::vector<float> want, want_bf16;
    MatMulArgs a = build(c, d, want);
    ref->run(a);
    MatMulData d16;  // the same weights and activations (build is deterministic)
    MatMulArgs a16 = build(c, d16, want_bf16);
    ref_bf16->run(a16);
    std::vector<uint8_t> packed = d.w;
    if (c.type == DType::Q8_0)
      pack_q8_0_x8(reinterpret_cast<const BlockQ8_0*>(d.w.data()), reinterpret_cast<BlockQ8_0x8*>(packed.data()),
                   c.out * c.in / QK8_0X8);
    else if (block32)
      for (int64_t o = 0; o < c.out; ++o) {
        const int64_t rb = row_bytes(c.type, c.in);
        pack_block32_x8_row(c.type, d.w.data() + o * rb, packed.data() + o * rb, c.in);
      }
    else if (c.type == DType::IQ4_XS)
      pack_iq4_xs_x8(reinterpret_cast<const BlockIQ4_XS*>(d.w.data()), reinterpret_cast<BlockIQ4_XSx8*>(packed.data()),
                     c.out * c.in / QK_K);
    else if (c.type == DType::Q2_K)
      pack_q2_k_x8(reinterpret_cast<const BlockQ2_K*>(d.w.data()), reinterpret_cast<BlockQ2_Kx8*>(packed.data()),
                   c.out * c.in / QK_K);
    else if (c.type == DType::Q3_K)
      pack_q3_k_x8(reinterpret_cast<const BlockQ3_K*>(d.w.data()), reinterpret_cast<BlockQ3_Kx8*>(packed.data()),
                   c.out * c.in / QK_K);
    else if (c.type == DType::Q4_K)
      pack_q4_k_x8(reinterpret_cast<const BlockQ4_K*>(d.w.data()), reinterpret_cast<BlockQ4_Kx8*>(packed.data()),
                   c.out * c.in / QK_K);
    else
      pack_q6_k_x8(reinterpret_cast<const BlockQ6_K*>(d.w.data()), reinterpret_cast<BlockQ6_Kx8*>(packed.data()),
                   c.out * c.in / QK_K);
    Tensor pt = Tensor::view(packed.data(), packed_type, {c.out, c.in});
    for (auto& k : OpRegistry<MatMulArgs>::instance().kernels()) {
      if (k.name == "ref" || k.name == "ref_bf16act") continue;  // other activations than 8-bit ones
      const bool bf16 = k.name == "avx512bf16" || k.name == "amxbf16";
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<float> got(want.size(), NAN);
        MatMulArgs b = a;
        b.w = &pt;
        b.y = got.data();
        if (k.refuse && !k.refuse(b).empty()) continue;
        k.run(b);
        EXPECT_LE(test::normalised_error(got, bf16 ? want_bf16 : want), bf16 ? 1e-5 : 1e-4)
            << k.name << " on " << dtype_name(packed_type) << " vs " << (bf16 ? "ref_bf16act" : "ref_q8act") << " on " << label(c)
            << " (threads " << threads << ")";
        ++checked;
      }
    }
    set_num_threads(0);
  }
  EXPECT_GT(checked, 0);
}

// The BF16-activation reference is the f32 one up to the rounding of the activations (about
// 2^-9 relative per element), and rounds as AVX512-BF16 does: ties to even, subnormal inputs
// to zero.
TEST(BackendOps, Bf16ActivationReferenceRoundsTheActivationsOnly) {
  const Kernel<MatMulArgs>*ref = nullptr, *ref_bf16 = nullptr;
  for (auto& k : OpRegistry<MatMulArgs>::instance().kernels()) {
    if (k.name == "ref") ref = &k;
    if (k.name == "ref_bf16act") ref_bf16 = &k;
  }
  ASSERT_TRUE(ref && ref_bf16);
  for (int64_t in : {8, 13, 300, 1024}) {
    MatMulCase c{DType::BF16, 9, 40, in, true};
    MatMulData d;
    std::vector<float> want, got;
    MatMulArgs a = build(c, d, want);
    ref->run(a);
    MatMulArgs b = build(c, d, got);
    ref_bf16->run(b);
    const double e = test::normalised_error(got, want);
    EXPECT_GT(e, 0.0) << "the activations were rounded";
    EXPECT_LT(e, 4e-3) << "in=" << in;
  }
  EXPECT_EQ(f32_to_bf16_daz(1.0f + 1.0f / 256), f32_to_bf16(1.0f));  // a tie: to even
  EXPECT_EQ(f32_to_bf16_daz(1e-39f), 0u);                             // subnormal: zero
  EXPECT_EQ(f32_to_bf16_daz(-1e-39f), 0x8000u);
  EXPECT_NE(f32_to_bf16(1e-39f), 0u);                                 // the plain rounding keeps it
  MatMulCase f32{DType::F32, 9, 4, 8};
  MatMulData d;
  std::vector<float> out;
  EXPECT_NE(ref_bf16->refuse(build(f32, d, out)), "") << "F32 weights are not its to take";
  MatMulCase f16{DType::F16, 9, 4, 8};
  MatMulData d16;
  EXPECT_EQ(ref_bf16->refuse(build(f16, d16, out)), "") << "F16 weights are rounded to BF16 as the kernels pack them";
}

TEST(BackendOps, ZeroTokensWritesNothing) {
  MatMulCase c{DType::F16, 0, 8, 64};
  MatMulData d;
  std::vector<float> out;
  MatMulArgs a = build(c, d, out);
  for (auto& k : OpRegistry<MatMulArgs>::instance().kernels())
    if (k.backend == Backend::CPU && (!k.refuse || k.refuse(a).empty())) k.run(a);
  EXPECT_TRUE(out.empty());
}

// The vectorized activation quantizer gives the scalar quantizer's blocks bit for bit,
// including values that land exactly halfway between two integers and all-zero blocks.
TEST(BackendOps, ActivationQuantizerMatchesScalar) {
  for (int64_t blocks : {1, 2, 7, 64}) {
    auto x = test::random_floats(static_cast<size_t>(blocks * QK8_0), static_cast<uint32_t>(blocks));
    // Block 0: amax 127, so values k + 0.5 scale to exact ties; block 1 (if any): all zero.
    for (int j = 0; j < QK8_0; ++j) x[static_cast<size_t>(j)] = (j == 0 ? 127.0f : static_cast<float>(j % 9) - 4.5f);
    if (blocks > 1)
      for (int j = 0; j < QK8_0; ++j) x[static_cast<size_t>(QK8_0 + j)] = 0.0f;
    std::vector<BlockQ8_0> fast(static_cast<size_t>(blocks)), ref(static_cast<size_t>(blocks));
    quantize_act_q8_0(x.data(), fast.data(), blocks * QK8_0);
    quantize_row_q8_0(x.data(), ref.data(), blocks * QK8_0);
    for (int64_t b = 0; b < blocks; ++b) {
      EXPECT_EQ(fast[static_cast<size_t>(b)].d, ref[static_cast<size_t>(b)].d) << "block " << b;
      for (int j = 0; j < QK8_0; ++j)
        ASSERT_EQ(fast[static_cast<size_t>(b)].qs[j], ref[static_cast<size_t>(b)].qs[j]) << "block " << b << " value " << j;
    }
  }
}

// Activations quantized once (MatMulArgs::xq, as a fused rmsnorm provides them) give every
// kernel exactly the result it gives when it quantizes x itself.
TEST(BackendOps, PreQuantizedActivationsGiveTheSameResult) {
  int compared = 0;
  for (const auto& c : cases()) {
    if (c.type != DType::Q8_0 && c.type != DType::Q4_0 && c.type != DType::Q8_0_X8) continue;
    for (auto& k : OpRegistry<MatMulArgs>::instance().kernels()) {
      if (k.backend != Backend::CPU) continue;
      MatMulData d;
      std::vector<float> plain, fused;
      MatMulArgs a = build(c, d, plain);
      if (k.refuse && !k.refuse(a).empty()) continue;
      k.run(a);
      std::vector<BlockQ8_0> xq(static_cast<size_t>(c.n * c.in / QK8_0));
      for (int64_t i = 0; i < c.n; ++i) quantize_act_q8_0(d.x.data() + i * c.in, xq.data() + i * (c.in / QK8_0), c.in);
      fused.assign(plain.size(), NAN);
      MatMulArgs b = a;
      b.y = fused.data();
      b.xq = xq.data();
      k.run(b);
      for (size_t i = 0; i < plain.size(); ++i)
        ASSERT_EQ(plain[i], fused[i]) << k.name << " " << label(c) << " output " << i;
      ++compared;
    }
  }
  if (test::cpu_has_avx2()) {
    EXPECT_GT(compared, 0);
  }
}

}  // namespace
}  // namespace fp
