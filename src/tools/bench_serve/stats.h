// tools/bench_serve/stats.h — what one request measured, and the figures of one run level
// (one concurrency or request rate): counts, throughputs, and latency distributions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp::bench_serve {

// One request as the client saw it. Times in seconds; start_s is relative to the level's start.
struct RequestRecord {
  int index = 0;
  bool ok = false;
  std::string error;             // why it failed (empty when ok)
  int64_t input_tokens = 0;      // prompt tokens as the dataset built it (no BOS)
  int64_t requested_output = 0;  // max_tokens sent
  int64_t output_tokens = 0;     // from usage when the server sent it, else content chunks
  bool output_from_usage = false;
  int64_t server_prompt_tokens = -1;  // usage.prompt_tokens (-1: not sent)
  int64_t chunks = 0;            // non-empty content chunks
  int64_t output_bytes = 0;      // bytes of generated text
  double start_s = 0;
  double ttft_s = -1;            // first non-empty content chunk (-1: none came)
  double e2e_s = 0;
  double tpot_s = -1;            // (e2e - ttft) / (output_tokens - 1); -1 when output_tokens < 2
  std::vector<double> itl_s;     // gaps between successive content chunks
};

// Mean, median, p95, p99 (plus std, min, max) of a sample; all NaN when it is empty.
struct Summary {
  size_t n = 0;
  double mean, median, p95, p99, stdev, min, max;
};

// The p-th percentile (0..100) by linear interpolation between closest ranks (numpy's default,
// which vLLM's figures use): rank p/100 * (n-1). NaN for an empty sample.
double percentile(std::vector<double> v, double p);
Summary summarize(const std::vector<double>& v);

struct LevelResult {
  std::string label;            // "concurrency 4", "rate 2 req/s"
  int concurrency = 0;          // 0: unlimited
  double request_rate = 0;      // requests/s; infinity: all at once
  double duration_s = 0;        // first request sent to last request finished
  int64_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  Summary ttft, tpot, itl, e2e;   // seconds
  std::string first_error;      // of the first failed request (by index)
  std::string output_count_source;  // "usage", "chunks", "usage+chunks" (mixed), "" (none ok)
  std::vector<RequestRecord> requests;
};

// Aggregates the records of one level (successful requests only enter the figures).
LevelResult aggregate(std::vector<RequestRecord> records, double duration_s);

}  // namespace fp::bench_serve
