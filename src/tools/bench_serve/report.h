// tools/bench_serve/report.h — the figures of a run as a text table (vLLM's layout), as JSON,
// and as one comparison table across levels.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_serve/stats.h"

namespace fp::bench_serve {

// "concurrency 4", "concurrency 4, rate 2 req/s", "unlimited concurrency, rate inf".
std::string level_label(int concurrency, double request_rate);

void print_level(std::ostream& os, const LevelResult& r);
// One row per level: concurrency/rate, req/s, output tok/s, TTFT/TPOT/ITL/E2E medians and p95s.
void print_comparison(std::ostream& os, const std::vector<LevelResult>& levels);

// Figures in vLLM's key names (ms for latencies: mean_ttft_ms, median_ttft_ms, p95_ttft_ms,
// p99_ttft_ms, ...) plus "requests": every record when with_requests.
nlohmann::json level_json(const LevelResult& r, bool with_requests);

}  // namespace fp::bench_serve
