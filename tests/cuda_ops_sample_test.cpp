// tests/cuda_ops_sample_test.cpp — the sample op: the reference's rules on hand-made rows (CPU),
// and every CUDA kernel against the reference on random rows (harness: cuda_ops.h).
//
// The CUDA kernel sums probabilities in fixed point where the reference sums floats in double,
// so the two may disagree when a cut or the draw falls within rounding of a boundary. Such a row
// is recognised with the reference alone: the reference is run again with the draw and top-p /
// min-p moved by 1e-6 either way, and a row whose answer moves is "on a boundary", where the
// device may give any of those answers. Every other row must match exactly, and boundary rows
// must be rare (they are counted and bounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "cuda_ops.h"
#include "kernels/ops.h"

namespace fp {
namespace {

using test::Coverage;
using test::download;
using test::upload;
using test::upload_into;

const Kernel<SampleArgs>& sample_ref() {
  const auto* k = test::find_kernel<SampleArgs>(Backend::CPU, "ref");
  if (!k) throw std::runtime_error("no reference kernel for sample");
  return *k;
}

int32_t ref_one(const std::vector<float>& row, const SampleRow& s) {
  int32_t id = -1;
  sample_ref().run(SampleArgs{row.data(), 1, static_cast<int64_t>(row.size()), &s, &id});
  return id;
}

SampleRow settings(float t, int32_t k, float p, float min_p, double u) {
  SampleRow s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.u = u;
  return s;
}

TEST(SampleOp, GreedyTakesTheFirstLargestAndNaNNeverWins) {
  EXPECT_EQ(ref_one({1, 3, 3, 2}, settings(0, 0, 1, 0, 0.9)), 1);
  EXPECT_EQ(ref_one({NAN, 1, 2, NAN}, settings(0, 0, 1, 0, 0.5)), 2);
  EXPECT_EQ(ref_one({-0.0f, 0.0f}, settings(0, 0, 1, 0, 0.5)), 0);  // -0 == 0: the lower id
  // A row whose largest logit is +inf (or only NaNs / -inf) takes the first largest.
  EXPECT_EQ(ref_one({1, INFINITY, INFINITY}, settings(1, 0, 1, 0, 0.9)), 1);
  EXPECT_EQ(ref_one({NAN, NAN}, settings(1, 0, 1, 0, 0.9)), 0);
}

TEST(SampleOp, TheDrawWalksTheSortedMass) {
  // Probabilities 0.5, 0.3, 0.2 for ids 2, 0, 1 at temperature 1.
  const std::vector<float> row = {std::log(0.3f), std::log(0.2f), std::log(0.5f)};
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0, 0.0)), 2);
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0, 0.49)), 2);
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0, 0.51)), 0);
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0, 0.79)), 0);
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0, 0.81)), 1);
  // top-k 2 renormalises over 0.5 and 0.3: u = 0.7 -> 0.56 of 0.8, past 0.5: id 0.
  EXPECT_EQ(ref_one(row, settings(1, 2, 1, 0, 0.7)), 0);
  EXPECT_EQ(ref_one(row, settings(1, 1, 1, 0, 0.99)), 2);
  // top-p 0.45 keeps id 2 alone (its mass 0.5 reaches it); 0.6 keeps ids 2 and 0.
  EXPECT_EQ(ref_one(row, settings(1, 0, 0.45f, 0, 0.99)), 2);
  EXPECT_EQ(ref_one(row, settings(1, 0, 0.6f, 0, 0.99)), 0);
  // min-p 0.5 drops id 1 (0.2 < 0.25): u = 0.99 -> the last kept, id 0.
  EXPECT_EQ(ref_one(row, settings(1, 0, 1, 0.5f, 0.99)), 0);
  // Equal logits go by id: four equal tokens, u = 0.3 -> the second (id 1).
  EXPECT_EQ(ref_one({0, 0, 0, 0}, settings(1, 0, 1, 0, 0.3)), 1);
}

// Random rows of several kinds; kind picks the logits' shape.
std::vector<float> make_row(int64_t d, int kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, kind == 1 ? 6.0f : 1.5f);
  std::vector<float> row(static_cast<size_t>(d));
  for (auto& v : row) v = normal(rng);
  if (kind == 2)  // coarse values: many ties
    for (auto& v : row) v = std::round(v * 2.0f) / 2.0f;
  if (kind == 3 && d > 4) {  // NaNs, -0, -inf
    row[1] = NAN;
    row[2] = -0.0f;
    row[3] = -INFINITY;
  }
  if (kind == 4) std::fill(row.begin(), row.end(), 0.25f);  // all equal
  return row;
}

// The answers the reference gives with the draw and the cuts moved by 1e-6 either way.
std::set<int32_t> answers_near(const std::vector<float>& row, const SampleRow& s) {
  std::set<int32_t> out;
  for (double du : {-1e-6, 0.0, 1e-6})
    for (float dp : {-1e-6f, 0.0f, 1e-6f}) {
      SampleRow m = s;
      m.u = std::clamp(s.u + du, 0.0, std::nextafter(1.0, 0.0));
      if (m.top_p < 1.0f) m.top_p = s.top_p + dp;
      if (m.min_p > 0.0f) m.min_p = s.min_p + dp;
      out.insert(ref_one(row, m));
    }
  return out;
}

TEST(CudaOps, SampleAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int rows_checked = 0, on_boundary = 0;
  // Settings: greedy; temperature only; top-k small (copied to shared memory), large (the row
  // stays in global memory) and 1; top-p; min-p; all of them together (the engine's defaults).
  const std::vector<SampleRow> kinds = {
      settings(0, 0, 1, 0, 0),          settings(1.0f, 0, 1, 0, 0),    settings(0.7f, 40, 1, 0, 0),
      settings(1.3f, 3000, 1, 0, 0),    settings(1.0f, 1, 1, 0, 0),    settings(1.0f, 0, 0.9f, 0, 0),
      settings(0.6f, 0, 0.3f, 0, 0),    settings(1.0f, 0, 1, 0.05f, 0), settings(0.8f, 40, 0.95f, 0.05f, 0),
      settings(1.0f, 2048, 0.95f, 0, 0), settings(1.0f, 2049, 0.5f, 0.1f, 0)};
  for (int64_t d : {1, 2, 31, 256, 1000, 4099, 32000, 151936}) {
    const int64_t n = d >= 32000 ? 6 : 24;
    std::vector<float> x;
    std::vector<SampleRow> rows;
    for (int64_t r = 0; r < n; ++r) {
      const auto row = make_row(d, static_cast<int>(r % 5), rng);
      x.insert(x.end(), row.begin(), row.end());
      SampleRow s = kinds[static_cast<size_t>((r * 7 + d) % static_cast<int64_t>(kinds.size()))];
      s.u = unit(rng);
      rows.push_back(s);
    }
    std::vector<int32_t> want(static_cast<size_t>(n), -1);
    sample_ref().run(SampleArgs{x.data(), n, d, rows.data(), want.data()});
    DeviceBuffer dx = upload(x), drows = upload(rows), dout = upload(want);
    const SampleArgs a{dx.as<float>(), n, d, drows.as<SampleRow>(), dout.as<int32_t>()};
    const std::vector<int32_t> poison(want.size(), -1);
    for (const auto* k : test::kernels_under_test<SampleArgs>()) {
      if (!test::refusal(*k, a).empty()) continue;
      upload_into(dout, poison);
      const std::string err = test::run_kernel(*k, a);
      EXPECT_EQ(err, "") << k->name;
      if (!err.empty()) continue;
      const auto got = download<int32_t>(dout, want.size());
      for (int64_t r = 0; r < n; ++r) {
        const auto i = static_cast<size_t>(r);
        const SampleRow& s = rows[i];
        ++rows_checked;
        if (got[i] == want[i]) continue;
        const std::vector<float> row(x.begin() + r * d, x.begin() + (r + 1) * d);
        const std::set<int32_t> near = answers_near(row, s);
        const bool boundary = near.size() > 1 && near.count(got[i]);
        on_boundary += boundary;
        EXPECT_TRUE(boundary) << "sample kernel " << k->name << " d=" << d << " row " << r << " T=" << s.temperature
                              << " top_k=" << s.top_k << " top_p=" << s.top_p << " min_p=" << s.min_p << " u=" << s.u
                              << ": got " << got[i] << ", the reference " << want[i];
      }
      ++cov.ran[k->name];
    }
  }
  EXPECT_LE(on_boundary * 50, rows_checked) << on_boundary << " of " << rows_checked << " rows on a boundary";
  cov.expect_ran({"radix_select"});
}

}  // namespace
}  // namespace fp
