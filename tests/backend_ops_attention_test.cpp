// tests/backend_ops_attention_test.cpp — every attention kernel against the reference over
// head dims 8/16/64/96/128 (and v_dim != head_dim), GQA ratios 1/2/4/8, decode (n = 1) from
// kv_len 1 to long contexts (with and without KV splits), prefill from position 0 and after a
// cached prefix (pos[0] > 0), block-boundary lengths (63/64/65), positions beyond kv_len,
// unordered positions, an empty cache and n = 0.
//
// Tolerance 2e-5 (normalised error): the fast kernel scales q before the dot products, sums
// in a different order, uses a polynomial exp (<= 2.3e-7 relative) and normalizes once at the
// end instead of per weight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend_ops.h"
#include "core/cpu_features.h"
#include "kernels/ops.h"

namespace fp {
namespace {

struct AttnCase {
  int64_t n, heads, kv_heads, hd, vd, kv_len;
  int32_t pos0;          // pos[i] = pos0 + i, unless shuffled
  bool shuffled = false;  // positions in a scrambled order with gaps
  float scale = 0;        // 0: 1/sqrt(hd)
};

struct AttnData {
  std::vector<float> q, k, v;
  std::vector<int32_t> pos;
};

AttentionArgs build(const AttnCase& c, AttnData& d, std::vector<float>& out) {
  const int64_t cap = std::max<int64_t>(c.kv_len, 1);
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.heads * 17 + c.kv_heads * 5 + c.hd + c.kv_len * 3);
  d.q = test::random_floats(static_cast<size_t>(c.n * c.heads * c.hd), seed);
  d.k = test::random_floats(static_cast<size_t>(cap * c.kv_heads * c.hd), seed + 1);
  d.v = test::random_floats(static_cast<size_t>(cap * c.kv_heads * c.vd), seed + 2);
  d.pos.resize(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.n; ++i)
    d.pos[static_cast<size_t>(i)] = c.shuffled ? static_cast<int32_t>((i * 37 + 11) % (c.kv_len + 5)) : c.pos0 + static_cast<int32_t>(i);
  out.assign(static_cast<size_t>(c.n * c.heads * c.vd), NAN);
  float scale = c.scale != 0 ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.hd));
  return AttentionArgs{d.q.data(), d.pos.data(), c.n, c.heads, c.kv_heads, c.hd, c.vd, d.k.data(), d.v.data(), c.kv_len,
                       scale, out.data()};
}

std::string label(const AttnCase& c) {
  return "n=" + std::to_string(c.n) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " hd=" + std::to_string(c.hd) + " vd=" + std::to_string(c.vd) + " kv_len=" + std::to_string(c.kv_len) +
         " pos0=" + std::to_string(c.pos0) + (c.shuffled ? " shuffled" : "") +
         (c.scale != 0 ? " scale=" + std::to_string(c.scale) : "");
}

int run_cases(const std::vector<AttnCase>& cases) {
  int checked = 0;
  for (const auto& c : cases) {
    AttnData d;
    std::function<AttentionArgs(std::vector<float>&)> make = [&](std::vector<float>& out) { return build(c, d, out); };
    checked += test::check_kernels<AttentionArgs>(label(c), make, "ref", 2e-5);
  }
  return checked;
}

bool have_avx2() { return cpu_features().missing({"avx2", "fma", "f16c"}).empty(); }

// (heads, kv_heads) for GQA ratios 1, 2, 4, 8.
const std::vector<std::pair<int64_t, int64_t>> kHeadConfigs = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};

TEST(BackendOps, AttentionDecodeEveryKernelAgainstItsReference) {
  std::vector<AttnCase> cs;
  for (int64_t hd : {8, 16, 64, 96, 128})
    for (auto [h, kvh] : kHeadConfigs)
      for (int64_t kv : {1, 2, 7, 63, 64, 65, 200, 1000}) cs.push_back({1, h, kvh, hd, hd, kv, static_cast<int32_t>(kv - 1)});
  // Long contexts: one KV head (split over KV positions), eight (split over heads).
  cs.push_back({1, 8, 1, 128, 128, 4000, 3999});
  cs.push_back({1, 32, 8, 128, 128, 3000, 2999});
  cs.push_back({1, 16, 2, 64, 64, 8192, 8191});
  // A query that sees only part of the cache; a cache shorter than pos + 1.
  cs.push_back({1, 8, 2, 64, 64, 900, 300});
  cs.push_back({1, 8, 2, 64, 64, 100, 500});
  // v_dim != head_dim, and a sharp softmax.
  cs.push_back({1, 8, 2, 64, 32, 333, 332});
  cs.push_back({1, 4, 1, 192, 128, 700, 699});
  cs.push_back({1, 8, 8, 64, 64, 600, 599, false, 1.0f});
  int checked = run_cases(cs);
  if (have_avx2()) {
    EXPECT_GT(checked, 0) << "no non-reference attention kernel ran on an AVX2 CPU";
  }
}

TEST(BackendOps, AttentionPrefillEveryKernelAgainstItsReference) {
  std::vector<AttnCase> cs;
  for (int64_t hd : {8, 16, 64, 96, 128})
    for (auto [h, kvh] : kHeadConfigs)
      for (int64_t n : {2, 5, 17, 64, 65})
        for (int32_t pos0 : {0, 37}) cs.push_back({n, h, kvh, hd, hd, pos0 + n, pos0});
  // Long prefills, from zero and after a cached prefix.
  cs.push_back({300, 4, 4, 64, 64, 300, 0});
  cs.push_back({300, 8, 2, 128, 128, 800, 500});
  cs.push_back({257, 8, 1, 96, 96, 1000, 743});
  cs.push_back({130, 16, 2, 16, 16, 130, 0});
  // The last tokens of a chunk: kv_len beyond the batch (cache already holds later rows too).
  cs.push_back({20, 4, 2, 64, 64, 600, 100});
  // Scrambled positions with gaps; positions beyond kv_len; v_dim != head_dim; sharp softmax.
  cs.push_back({40, 8, 2, 64, 64, 200, 0, true});
  cs.push_back({33, 4, 1, 32, 32, 70, 0, true});
  cs.push_back({24, 8, 2, 64, 32, 300, 250});
  cs.push_back({70, 4, 4, 128, 128, 200, 130, false, 1.0f});
  int checked = run_cases(cs);
  if (have_avx2()) {
    EXPECT_GT(checked, 0) << "no non-reference attention kernel ran on an AVX2 CPU";
  }
}

TEST(BackendOps, AttentionEmptyCacheGivesZerosAndNoTokensWritesNothing) {
  // kv_len 0: no query sees a key; the reference writes zeros.
  std::vector<AttnCase> cs = {{3, 4, 2, 16, 16, 0, 0}, {1, 4, 4, 64, 64, 0, 0}};
  int checked = run_cases(cs);
  if (have_avx2()) {
    EXPECT_GT(checked, 0);
  }
  AttnCase c{0, 4, 2, 64, 64, 10, 0};
  AttnData d;
  std::vector<float> out;
  AttentionArgs a = build(c, d, out);
  for (auto& k : OpRegistry<AttentionArgs>::instance().kernels())
    if (!k.refuse || k.refuse(a).empty()) k.run(a);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace fp
