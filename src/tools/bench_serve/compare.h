// tools/bench_serve/compare.h — side-by-side view of several `bench-serve --json` results
// (one per server, same dataset and levels): a table of output throughput, median TTFT and
// TPOT per level with each server's ratio to the first, and a chart of output throughput.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "tools/bench_serve/svg.h"

namespace fp::bench_serve {

struct RunSummary {
  std::string name;  // the label given, else the file name
  struct Level {
    std::string label;  // "concurrency 16", "rate 4 req/s", ...
    double output_tps = 0, median_ttft_ms = 0, median_tpot_ms = 0;
    int completed = 0, failed = 0;
  };
  std::vector<Level> levels;
};

// Reads one --json result; throws naming the file and the field on anything malformed.
RunSummary read_run(const std::string& path, const std::string& name);
void print_runs(std::ostream& os, const std::vector<RunSummary>& runs);
// One series per run: output throughput per level (levels in the first run's order).
Chart runs_chart(const std::vector<RunSummary>& runs, const std::string& title);

}  // namespace fp::bench_serve
