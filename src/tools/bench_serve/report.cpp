// tools/bench_serve/report.cpp — text tables and JSON.
#include "tools/bench_serve/report.h"

#include <cmath>
#include <cstdio>

namespace fp::bench_serve {

namespace {

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string rate_text(double rate) { return std::isinf(rate) ? "inf" : fmt("%g", rate); }

void row(std::ostream& os, const std::string& name, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-40s %12s\n", name.c_str(), value.c_str());
  os << buf;
}

void heading(std::ostream& os, const std::string& title) {
  std::string line = "-" + title;
  line += std::string(line.size() < 53 ? 53 - line.size() : 0, '-');
  os << line << "\n";
}

const char* const kSeries[] = {"ttft", "tpot", "itl", "e2el"};
const char* const kTitles[] = {"Time to First Token", "Time per Output Token (excl. 1st token)",
                               "Inter-token Latency", "End-to-end Latency"};
const char* const kShort[] = {"TTFT", "TPOT", "ITL", "E2EL"};

const Summary& series(const LevelResult& r, int k) {
  return k == 0 ? r.ttft : k == 1 ? r.tpot : k == 2 ? r.itl : r.e2e;
}

nlohmann::json ms_or_null(double s) { return std::isnan(s) ? nlohmann::json(nullptr) : nlohmann::json(s * 1e3); }

}  // namespace

std::string level_label(int concurrency, double request_rate) {
  std::string c = concurrency > 0 ? "concurrency " + std::to_string(concurrency) : "unlimited concurrency";
  if (concurrency > 0 && std::isinf(request_rate)) return c;
  return c + ", rate " + rate_text(request_rate) + " req/s";
}

void print_level(std::ostream& os, const LevelResult& r) {
  os << "============ Serving Benchmark Result (" << r.label << ") ============\n";
  row(os, "Successful requests:", std::to_string(r.completed));
  row(os, "Failed requests:", std::to_string(r.failed));
  row(os, "Maximum request concurrency:", r.concurrency > 0 ? std::to_string(r.concurrency) : "unlimited");
  row(os, "Request rate (req/s):", rate_text(r.request_rate));
  row(os, "Benchmark duration (s):", fmt("%.2f", r.duration_s));
  row(os, "Total input tokens:", std::to_string(r.total_input_tokens));
  row(os, "Total generated tokens:", std::to_string(r.total_output_tokens));
  row(os, "Request throughput (req/s):", fmt("%.2f", r.request_throughput));
  row(os, "Input token throughput (tok/s):", fmt("%.2f", r.input_throughput));
  row(os, "Output token throughput (tok/s):", fmt("%.2f", r.output_throughput));
  row(os, "Total token throughput (tok/s):", fmt("%.2f", r.total_throughput));
  for (int k = 0; k < 4; ++k) {
    heading(os, kTitles[k]);
    const Summary& s = series(r, k);
    std::string n = kShort[k];
    row(os, "Mean " + n + " (ms):", fmt("%.2f", s.mean * 1e3));
    row(os, "Median " + n + " (ms):", fmt("%.2f", s.median * 1e3));
    row(os, "P95 " + n + " (ms):", fmt("%.2f", s.p95 * 1e3));
    row(os, "P99 " + n + " (ms):", fmt("%.2f", s.p99 * 1e3));
  }
  os << std::string(53, '=') << "\n";
  if (!r.output_count_source.empty())
    os << "output tokens counted from: "
       << (r.output_count_source == "usage" ? "the server's usage" : r.output_count_source == "chunks" ? "content chunks (no usage sent)" : "usage where sent, else content chunks")
       << "\n";
  if (r.failed) os << "first error: " << r.first_error << "\n";
}

void print_comparison(std::ostream& os, const std::vector<LevelResult>& levels) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-28s %6s %8s %10s %9s %9s %9s %9s %9s %9s\n", "level", "failed", "req/s",
                "out tok/s", "TTFT p50", "TTFT p95", "TPOT p50", "ITL p95", "E2E p50", "E2E p95");
  os << buf;
  for (const LevelResult& r : levels) {
    std::snprintf(buf, sizeof buf, "%-28s %6lld %8s %10s %9s %9s %9s %9s %9s %9s\n", r.label.c_str(),
                  static_cast<long long>(r.failed), fmt("%.2f", r.request_throughput).c_str(),
                  fmt("%.1f", r.output_throughput).c_str(), fmt("%.1f", r.ttft.median * 1e3).c_str(),
                  fmt("%.1f", r.ttft.p95 * 1e3).c_str(), fmt("%.2f", r.tpot.median * 1e3).c_str(),
                  fmt("%.2f", r.itl.p95 * 1e3).c_str(), fmt("%.1f", r.e2e.median * 1e3).c_str(),
                  fmt("%.1f", r.e2e.p95 * 1e3).c_str());
    os << buf;
  }
  os << "(latencies in ms)\n";
}

nlohmann::json level_json(const LevelResult& r, bool with_requests) {
  using nlohmann::json;
  json j;
  j["label"] = r.label;
  j["max_concurrency"] = r.concurrency > 0 ? json(r.concurrency) : json(nullptr);
  j["request_rate"] = std::isinf(r.request_rate) ? json("inf") : json(r.request_rate);
  j["duration"] = r.duration_s;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["first_error"] = r.first_error;
  j["total_input_tokens"] = r.total_input_tokens;
  j["total_output_tokens"] = r.total_output_tokens;
  j["output_tokens_source"] = r.output_count_source;
  j["request_throughput"] = r.request_throughput;
  j["input_throughput"] = r.input_throughput;
  j["output_throughput"] = r.output_throughput;
  j["total_token_throughput"] = r.total_throughput;
  for (int k = 0; k < 4; ++k) {
    const Summary& s = series(r, k);
    std::string n = kSeries[k];
    j["mean_" + n + "_ms"] = ms_or_null(s.mean);
    j["median_" + n + "_ms"] = ms_or_null(s.median);
    j["std_" + n + "_ms"] = ms_or_null(s.stdev);
    j["p95_" + n + "_ms"] = ms_or_null(s.p95);
    j["p99_" + n + "_ms"] = ms_or_null(s.p99);
    j["count_" + n] = s.n;
  }
  if (with_requests) {
    json reqs = json::array();
    for (const RequestRecord& q : r.requests) {
      json o;
      o["index"] = q.index;
      o["ok"] = q.ok;
      if (!q.ok) o["error"] = q.error;
      o["start_s"] = q.start_s;
      o["input_tokens"] = q.input_tokens;
      o["server_prompt_tokens"] = q.server_prompt_tokens >= 0 ? json(q.server_prompt_tokens) : json(nullptr);
      o["requested_output_tokens"] = q.requested_output;
      o["output_tokens"] = q.output_tokens;
      o["output_tokens_source"] = q.output_from_usage ? "usage" : "chunks";
      o["content_chunks"] = q.chunks;
      o["output_bytes"] = q.output_bytes;
      o["ttft_ms"] = q.ttft_s >= 0 ? json(q.ttft_s * 1e3) : json(nullptr);
      o["tpot_ms"] = q.tpot_s >= 0 ? json(q.tpot_s * 1e3) : json(nullptr);
      o["e2el_ms"] = q.e2e_s * 1e3;
      json itl = json::array();
      for (double g : q.itl_s) itl.push_back(g * 1e3);
      o["itl_ms"] = std::move(itl);
      reqs.push_back(std::move(o));
    }
    j["requests"] = std::move(reqs);
  }
  return j;
}

}  // namespace fp::bench_serve
