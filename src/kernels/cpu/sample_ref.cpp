// kernels/cpu/sample_ref.cpp — the sample op's reference (the only CPU kernel; the engine's
// Sampler calls it after the penalties): sort the candidates, cut by top-k, softmax with the
// temperature, cut by top-p and min-p, then walk the running mass to the row's draw. Plain on
// purpose: the CUDA kernel (kernels/cuda/sample.cu) reaches the same token without sorting and is
// checked against this one.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

// A NaN logit counts as -inf, and -0 as 0 (so equal logits are ordered by id alone).
float canonical(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l == 0.0f ? 0.0f : l; }

int32_t sample_row(const float* x, int64_t d, const SampleRow& p, std::vector<std::pair<float, int32_t>>& cand) {
  int64_t best = 0;
  for (int64_t j = 1; j < d; ++j)
    if (canonical(x[j]) > canonical(x[best])) best = j;
  const float mx = canonical(x[best]);
  if (!(p.temperature > 0.0f) || !std::isfinite(mx)) return static_cast<int32_t>(best);

  // Candidates sorted by logit (the lower id first on ties), cut by top-k.
  cand.resize(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) cand[static_cast<size_t>(i)] = {canonical(x[i]), static_cast<int32_t>(i)};
  const size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), cand.size()) : cand.size();
  auto first = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(), first);
  cand.resize(k);
  // Softmax with the temperature.
  double sum = 0;
  for (auto& c : cand) sum += (c.first = std::exp((c.first - mx) / p.temperature));
  for (auto& c : cand) c.first = static_cast<float>(c.first / sum);
  // top-p: the shortest prefix whose mass reaches p (at least one token).
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      cum += cand[i].first;
      if (cum >= p.top_p) {
        cand.resize(i + 1);
        break;
      }
    }
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (p.min_p > 0.0f) {
    const float floor = cand[0].first * p.min_p;
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].first >= floor) ++keep;
    cand.resize(keep);
  }
  // The draw: the first candidate whose running mass exceeds u x the mass kept.
  double total = 0;
  for (auto& c : cand) total += c.first;
  const double r = p.u * total;
  double acc = 0;
  for (auto& c : cand) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand.back().second;
}

void sample_ref(const SampleArgs& a) {
  thread_local std::vector<std::pair<float, int32_t>> cand;
  for (int64_t r = 0; r < a.n; ++r) a.out[r] = sample_row(a.x + r * a.d, a.d, a.rows[r], cand);
}

std::string refuse_sample(const SampleArgs& a) { return a.d > 0 ? "" : "a row has no logits"; }

const bool registered = [] {
  Kernel<SampleArgs> k;
  k.name = "ref";
  k.reference = true;
  k.refuse = refuse_sample;
  k.run = sample_ref;
  return register_kernel(std::move(k));
}();

}  // namespace
}  // namespace fp
