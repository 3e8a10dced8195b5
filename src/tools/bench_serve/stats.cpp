// tools/bench_serve/stats.cpp — percentiles and the aggregation of one level.
#include "tools/bench_serve/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace fp::bench_serve {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, v.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

Summary summarize(const std::vector<double>& v) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Summary s{v.size(), nan, nan, nan, nan, nan, nan, nan};
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - s.mean) * (x - s.mean);
  s.stdev = std::sqrt(var / static_cast<double>(v.size()));
  s.median = percentile(v, 50);
  s.p95 = percentile(v, 95);
  s.p99 = percentile(v, 99);
  auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  s.min = *mn;
  s.max = *mx;
  return s;
}

LevelResult aggregate(std::vector<RequestRecord> records, double duration_s) {
  LevelResult r;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  bool from_usage = false, from_chunks = false;
  for (const RequestRecord& q : records) {
    if (!q.ok) {
      if (r.failed++ == 0) r.first_error = q.error;
      continue;
    }
    ++r.completed;
    r.total_input_tokens += q.input_tokens;
    r.total_output_tokens += q.output_tokens;
    (q.output_from_usage ? from_usage : from_chunks) = true;
    if (q.ttft_s >= 0) ttft.push_back(q.ttft_s);
    if (q.tpot_s >= 0) tpot.push_back(q.tpot_s);
    itl.insert(itl.end(), q.itl_s.begin(), q.itl_s.end());
    e2e.push_back(q.e2e_s);
  }
  r.output_count_source = from_usage && from_chunks ? "usage+chunks" : from_usage ? "usage" : from_chunks ? "chunks" : "";
  if (duration_s > 0) {
    r.request_throughput = static_cast<double>(r.completed) / duration_s;
    r.input_throughput = static_cast<double>(r.total_input_tokens) / duration_s;
    r.output_throughput = static_cast<double>(r.total_output_tokens) / duration_s;
    r.total_throughput = r.input_throughput + r.output_throughput;
  }
  r.ttft = summarize(ttft);
  r.tpot = summarize(tpot);
  r.itl = summarize(itl);
  r.e2e = summarize(e2e);
  r.requests = std::move(records);
  return r;
}

}  // namespace fp::bench_serve
