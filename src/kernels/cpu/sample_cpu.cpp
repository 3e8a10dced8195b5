// kernels/cpu/sample_cpu.cpp — the sample op's fast CPU kernel ("partial_sort"): the reference's
// rules (kernels/cpu/sample_ref.cpp) without sorting the whole vocabulary. The reference sorts
// every candidate before it walks them; here the candidates are put in order only as far as a
// walk reaches, a chunk at a time, each twice the last (a heap selection for a small chunk, else
// nth_element and a sort of the chunk). A
// top-k of up to 4096 is selected and sorted at once; a larger one found by nth_element. With top-k off (the OpenAI API's default), a full
// sort of a 128K vocabulary costs ~13 ms a token on this machine; a language model's
// distribution puts the cut and the draw within the first few hundred candidates.
//
// The probabilities are the reference's, computed the same way; only the order in which the
// softmax denominator (and, when nothing is cut, the total kept) is summed differs, so the two
// agree except when a cut or the draw falls within rounding of a boundary.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

struct Cand {
  float logit;  // canonical
  int32_t id;
  float e;      // exp((logit - max) / T), once the top-k set is known
};

float canonical(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l == 0.0f ? 0.0f : l; }
// The reference's order: larger logit first, the lower id on ties (a functor, so sorts inline it).
struct First {
  bool operator()(const Cand& a, const Cand& b) const { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }
};
constexpr First first;

int32_t sample_row(const float* x, int64_t d, const SampleRow& p, std::vector<Cand>& cand) {
  int64_t best = 0;
  for (int64_t j = 1; j < d; ++j)
    if (canonical(x[j]) > canonical(x[best])) best = j;
  const float mx = canonical(x[best]);
  if (!(p.temperature > 0.0f) || !std::isfinite(mx)) return static_cast<int32_t>(best);

  cand.resize(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) cand[static_cast<size_t>(i)] = {canonical(x[i]), static_cast<int32_t>(i), 0.0f};
  const size_t n = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), cand.size()) : cand.size();
  // The top-k set: a heap selection when k is small (most elements lose one comparison), else
  // nth_element.
  if (n <= 4096) {
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), cand.end(), first);
  } else if (n < cand.size()) {
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), cand.end(), first);
  }

  // cand[0, sorted) are the first `sorted` candidates in order; the rest of [0, n) follow.
  size_t sorted = n <= 4096 ? n : 0;
  auto ensure = [&](size_t upto) {
    if (upto <= sorted) return;
    const size_t to = std::min(n, std::max({upto, 2 * sorted, size_t{64}}));
    const auto b = cand.begin() + static_cast<std::ptrdiff_t>(sorted), e = cand.begin() + static_cast<std::ptrdiff_t>(n),
               m = cand.begin() + static_cast<std::ptrdiff_t>(to);
    if (to - sorted <= 1024) {
      std::partial_sort(b, m, e, first);
    } else {
      std::nth_element(b, m, e, first);
      std::sort(b, m, first);
    }
    sorted = to;
  };
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (cand[i].e = std::exp((cand[i].logit - mx) / p.temperature));
  // As the reference: exp in float, divided in double, stored as float.
  auto prob = [&](size_t i) { return static_cast<float>(cand[i].e / sum); };

  size_t keep = n;
  if (p.top_p < 1.0f) {  // the shortest prefix whose mass reaches p
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      ensure(i + 1);
      cum += prob(i);
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // drop those below min_p times the first's probability
    ensure(1);
    const float floor = prob(0) * p.min_p;
    size_t k = 1;
    for (; k < keep; ++k) {
      ensure(k + 1);
      if (!(prob(k) >= floor)) break;
    }
    keep = k;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob(i);
  const double r = p.u * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    ensure(i + 1);
    acc += prob(i);
    if (r < acc) return cand[i].id;
  }
  ensure(keep);
  return cand[keep - 1].id;
}

void sample_partial_sort(const SampleArgs& a) {
  thread_local std::vector<Cand> cand;
  for (int64_t r = 0; r < a.n; ++r) a.out[r] = sample_row(a.x + r * a.d, a.d, a.rows[r], cand);
}

const bool registered = [] {
  Kernel<SampleArgs> k;
  k.name = "partial_sort";
  k.priority = 10;
  k.refuse = [](const SampleArgs& a) { return a.d > 0 ? std::string() : std::string("a row has no logits"); };
  k.run = sample_partial_sort;
  return register_kernel(std::move(k));
}();

}  // namespace
}  // namespace fp
