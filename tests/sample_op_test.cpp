// tests/sample_op_test.cpp — the sample op: the reference's rules on hand-made rows, and every
// other kernel (the CPU's partial_sort, the CUDA ones through cuda_ops.h) against the reference
// on random rows of many sizes and settings.
//
// The fast kernels sum probabilities in another order (the CUDA kernel in fixed point), so they
// may disagree with the reference when a cut or the draw falls within rounding of a boundary. Such a row
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
#include "kernels/registry.h"

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

// Random rows: every size with rows of each kind and each of the settings below, seeded.
struct SampleCase {
  int64_t n = 0, d = 0;
  std::vector<float> x;
  std::vector<SampleRow> rows;
  std::vector<int32_t> want;  // the reference's answers
};

std::vector<SampleCase> sample_cases() {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // Greedy; temperature only; top-k small (the CUDA kernel copies those to shared memory), large
  // (the row stays in global memory) and 1; top-p; min-p; all of them (the engine's defaults).
  const std::vector<SampleRow> kinds = {
      settings(0, 0, 1, 0, 0),          settings(1.0f, 0, 1, 0, 0),    settings(0.7f, 40, 1, 0, 0),
      settings(1.3f, 3000, 1, 0, 0),    settings(1.0f, 1, 1, 0, 0),    settings(1.0f, 0, 0.9f, 0, 0),
      settings(0.6f, 0, 0.3f, 0, 0),    settings(1.0f, 0, 1, 0.05f, 0), settings(0.8f, 40, 0.95f, 0.05f, 0),
      settings(1.0f, 2048, 0.95f, 0, 0), settings(1.0f, 2049, 0.5f, 0.1f, 0)};
  std::vector<SampleCase> cases;
  for (int64_t d : {1, 2, 31, 256, 1000, 4099, 32000, 151936}) {
    SampleCase c;
    c.d = d;
    c.n = d >= 32000 ? 6 : 24;
    for (int64_t r = 0; r < c.n; ++r) {
      const auto row = make_row(d, static_cast<int>(r % 5), rng);
      c.x.insert(c.x.end(), row.begin(), row.end());
      SampleRow s = kinds[static_cast<size_t>((r * 7 + d) % static_cast<int64_t>(kinds.size()))];
      s.u = unit(rng);
      c.rows.push_back(s);
    }
    c.want.assign(static_cast<size_t>(c.n), -1);
    sample_ref().run(SampleArgs{c.x.data(), c.n, d, c.rows.data(), c.want.data()});
    cases.push_back(std::move(c));
  }
  return cases;
}

// Checks a kernel's answers against the reference's; returns how many rows were on a boundary.
int expect_matches(const SampleCase& c, const std::vector<int32_t>& got, const std::string& kernel) {
  int on_boundary = 0;
  for (int64_t r = 0; r < c.n; ++r) {
    const auto i = static_cast<size_t>(r);
    if (got[i] == c.want[i]) continue;
    const SampleRow& s = c.rows[i];
    const std::vector<float> row(c.x.begin() + r * c.d, c.x.begin() + (r + 1) * c.d);
    const std::set<int32_t> near = answers_near(row, s);
    const bool boundary = near.size() > 1 && near.count(got[i]);
    on_boundary += boundary;
    EXPECT_TRUE(boundary) << "sample kernel " << kernel << " d=" << c.d << " row " << r << " T=" << s.temperature
                          << " top_k=" << s.top_k << " top_p=" << s.top_p << " min_p=" << s.min_p << " u=" << s.u
                          << ": got " << got[i] << ", the reference " << c.want[i];
  }
  return on_boundary;
}

TEST(BackendOps, SampleFastKernelsAgainstTheReference) {
  int kernels = 0, rows = 0, on_boundary = 0;
  for (const SampleCase& c : sample_cases())
    for (const auto& k : OpRegistry<SampleArgs>::instance().kernels()) {
      if (k.backend != Backend::CPU || k.reference || !test::refusal(k, SampleArgs{c.x.data(), c.n, c.d}).empty()) continue;
      std::vector<int32_t> got(static_cast<size_t>(c.n), -1);
      k.run(SampleArgs{c.x.data(), c.n, c.d, c.rows.data(), got.data()});
      on_boundary += expect_matches(c, got, k.name);
      rows += static_cast<int>(c.n);
      ++kernels;
    }
  EXPECT_GT(kernels, 0) << "no fast CPU kernel of sample";
  EXPECT_LE(on_boundary * 50, rows) << on_boundary << " of " << rows << " rows on a boundary";
}

TEST(CudaOps, SampleAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  int rows_checked = 0, on_boundary = 0;
  for (const SampleCase& c : sample_cases()) {
    DeviceBuffer dx = upload(c.x), drows = upload(c.rows), dout = upload(c.want);
    const SampleArgs a{dx.as<float>(), c.n, c.d, drows.as<SampleRow>(), dout.as<int32_t>()};
    const std::vector<int32_t> poison(c.want.size(), -1);
    for (const auto* k : test::kernels_under_test<SampleArgs>()) {
      if (!test::refusal(*k, a).empty()) continue;
      upload_into(dout, poison);
      const std::string err = test::run_kernel(*k, a);
      EXPECT_EQ(err, "") << k->name;
      if (!err.empty()) continue;
      on_boundary += expect_matches(c, download<int32_t>(dout, c.want.size()), k->name);
      rows_checked += static_cast<int>(c.n);
      ++cov.ran[k->name];
    }
  }
  EXPECT_LE(on_boundary * 50, rows_checked) << on_boundary << " of " << rows_checked << " rows on a boundary";
  cov.expect_ran({"radix_select"});
}

}  // namespace
}  // namespace fp
