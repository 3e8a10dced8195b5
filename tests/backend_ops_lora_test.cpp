// tests/backend_ops_lora_test.cpp — the lora op (kernels/ops.h): every CPU kernel against the
// reference on random inputs, over one to three parts of odd ranks and widths (tails of the
// 8-row blocks and 8-value vectors), 0 to 37 rows, matrices of F32, F16 and BF16, a scale per
// part, at 1 and 2 threads; the rows of y that the op adds to start random, so a skipped row keeps
// a wrong value.
#include <gtest/gtest.h>

#include "backend_ops.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace fp {
namespace {

struct LoraCase {
  int64_t n, in;
  std::vector<std::pair<int64_t, int64_t>> parts;  // (rank, out)
};

TEST(BackendOps, LoraKernelsMatchReference) {
  const std::vector<LoraCase> cases = {
      {1, 64, {{16, 64}}},          {1, 2048, {{16, 512}, {16, 512}}}, {3, 100, {{5, 33}, {7, 9}, {1, 1}}},
      {8, 33, {{8, 70}, {3, 17}}},  {9, 7, {{2, 5}}},                  {37, 96, {{4, 96}, {4, 32}, {9, 40}}},
      {0, 64, {{4, 64}}},           {2, 1, {{1, 3}}},                  {17, 257, {{13, 129}}},
  };
  int checked = 0;
  for (const DType dtype : {DType::F32, DType::F16, DType::BF16})
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const LoraCase& c = cases[ci];
      // Inputs drawn once per case (the same for every kernel); `make` copies them into fresh args.
      std::vector<std::vector<uint8_t>> as, bs;
      std::vector<float> scales;
      int64_t out_total = 0, width = 0;
      auto stored = [dtype](const std::vector<float>& v) { return quantize_to_bytes(dtype, v.data(), static_cast<int64_t>(v.size())); };
      for (size_t p = 0; p < c.parts.size(); ++p) {
        const auto [rank, out] = c.parts[p];
        as.push_back(stored(test::random_floats(static_cast<size_t>(rank * c.in), static_cast<uint32_t>(100 * ci + p))));
        bs.push_back(stored(test::random_floats(static_cast<size_t>(rank * out), static_cast<uint32_t>(100 * ci + p + 50))));
        scales.push_back(0.25f + 0.75f * static_cast<float>(p));
        out_total += c.n * out;
        width += rank;
      }
      const auto x = test::random_floats(static_cast<size_t>(c.n * c.in), static_cast<uint32_t>(ci + 7));
      const auto y0 = test::random_floats(static_cast<size_t>(out_total), static_cast<uint32_t>(ci + 9));
      std::vector<Tensor> ta(c.parts.size()), tb(c.parts.size());
      for (size_t p = 0; p < c.parts.size(); ++p) {
        ta[p] = Tensor::view(as[p].data(), dtype, {c.parts[p].first, c.in});
        tb[p] = Tensor::view(bs[p].data(), dtype, {c.parts[p].first, c.parts[p].second});  // B^T [rank, out]
      }
      std::vector<float> low;
      auto make = [&](std::vector<float>& y) {
        y = y0;
        low.assign(static_cast<size_t>(std::max<int64_t>(1, c.n * width)), std::nanf(""));
        LoraArgs a;
        a.x = x.data();
        a.n = c.n;
        a.low = low.data();
        int64_t at = 0;
        for (size_t p = 0; p < c.parts.size(); ++p) {
          a.parts[a.n_parts++] = {&ta[p], &tb[p], y.data() + at, scales[p]};
          at += c.n * c.parts[p].second;
        }
        return a;
      };
      checked += test::check_kernels<LoraArgs>(std::string(dtype_name(dtype)) + " case " + std::to_string(ci), make, "ref", 1e-5);
    }
  if (test::cpu_has_avx2()) {
    EXPECT_GE(checked, 2 * 3 * static_cast<int>(cases.size()));  // avx2 at 1 and 2 threads, each dtype
  }
}

}  // namespace
}  // namespace fp
