// tools/bench_serve/svg.h — a small self-contained SVG line chart (hand-written markup):
// one or two y axes, numeric or categorical x, a legend. Used for throughput and p95 TTFT
// against concurrency, or the latency CDFs of a single level.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tools/bench_serve/stats.h"

namespace fp::bench_serve {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); x is a category index when categorical
  bool right_axis = false;                        // plotted against y2
};

struct Chart {
  std::string title, x_label, y_label, y2_label;  // y2_label empty: no right axis
  std::vector<std::string> x_categories;          // non-empty: evenly spaced, labelled x positions
  std::vector<Series> series;
};

std::string render_svg(const Chart& c);

// Several levels: output throughput (left) and p95 TTFT (right) per level, x labelled with
// the concurrency (or the request rate when the levels differ by rate).
Chart levels_chart(const std::vector<LevelResult>& levels, const std::string& title);
// One level: cumulative distributions of TTFT and end-to-end latency (ms).
Chart cdf_chart(const LevelResult& level, const std::string& title);

// Round step (1, 2 or 5 times a power of ten) giving about `target` intervals on [0, max].
double nice_step(double max, int target = 5);

}  // namespace fp::bench_serve
