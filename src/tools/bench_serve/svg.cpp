// tools/bench_serve/svg.cpp — SVG chart markup.
#include "tools/bench_serve/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>


namespace fp::bench_serve {

namespace {

constexpr double kW = 760, kH = 440;                       // canvas, px
constexpr double kLeft = 80, kRight = 80, kTop = 60, kBottom = 64;  // plot margins, px
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// ' fill="color"' when `on` (the left axis takes the first series' colour on a dual chart).
std::string fill_attr(bool on, const char* color) {
  std::string a;
  if (on) {
    a += " fill=\"";
    a += color;
    a += '"';
  }
  return a;
}

struct Axis {
  double max = 1, step = 0.2;
};

Axis axis_for(double data_max) {
  if (!(data_max > 0) || !std::isfinite(data_max)) data_max = 1;
  Axis a;
  a.step = nice_step(data_max);
  a.max = std::ceil(data_max / a.step - 1e-9) * a.step;
  return a;
}

}  // namespace

double nice_step(double max, int target) {
  if (!(max > 0) || !std::isfinite(max)) return 1;
  double raw = max / std::max(target, 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * mag * (1 + 1e-9)) return m * mag;
  return 10 * mag;
}

std::string render_svg(const Chart& c) {
  const bool categorical = !c.x_categories.empty(), dual = !c.y2_label.empty();
  double xmax = 0, ymax = 0, y2max = 0;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmax = std::max(xmax, x);
      (s.right_axis ? y2max : ymax) = std::max(s.right_axis ? y2max : ymax, y);
    }
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  const double ncat = static_cast<double>(c.x_categories.size());
  Axis ax = axis_for(xmax), ay = axis_for(ymax), ay2 = axis_for(y2max);
  auto X = [&](double x) { return categorical ? kLeft + (x + 0.5) / ncat * pw : kLeft + x / ax.max * pw; };
  auto Y = [&](double y, bool right) { return kTop + ph - y / (right ? ay2.max : ay.max) * ph; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH << "\" viewBox=\"0 0 "
    << kW << " " << kH << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << kW << "\" height=\"" << kH << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << px(kW / 2) << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << esc(c.title)
    << "</text>\n";
  // Grid and left ticks.
  for (double v = 0; v <= ay.max * (1 + 1e-9); v += ay.step) {
    double y = Y(v, false);
    o << "<line x1=\"" << px(kLeft) << "\" y1=\"" << px(y) << "\" x2=\"" << px(kLeft + pw) << "\" y2=\"" << px(y)
      << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<text x=\"" << px(kLeft - 6) << "\" y=\"" << px(y + 4) << "\" text-anchor=\"end\""
      << fill_attr(dual, kColors[0]) << ">" << num(v) << "</text>\n";
  }
  if (dual)
    for (double v = 0; v <= ay2.max * (1 + 1e-9); v += ay2.step)
      o << "<text x=\"" << px(kLeft + pw + 6) << "\" y=\"" << px(Y(v, true) + 4) << "\" fill=\"" << kColors[1]
        << "\">" << num(v) << "</text>\n";
  // X ticks.
  if (categorical) {
    for (size_t i = 0; i < c.x_categories.size(); ++i)
      o << "<text x=\"" << px(X(static_cast<double>(i))) << "\" y=\"" << px(kTop + ph + 18)
        << "\" text-anchor=\"middle\">" << esc(c.x_categories[i]) << "</text>\n";
  } else {
    for (double v = 0; v <= ax.max * (1 + 1e-9); v += ax.step)
      o << "<text x=\"" << px(X(v)) << "\" y=\"" << px(kTop + ph + 18) << "\" text-anchor=\"middle\">" << num(v)
        << "</text>\n";
  }
  // Axes and their labels.
  o << "<polyline points=\"" << px(kLeft) << "," << px(kTop) << " " << px(kLeft) << "," << px(kTop + ph) << " "
    << px(kLeft + pw) << "," << px(kTop + ph);
  if (dual) o << " " << px(kLeft + pw) << "," << px(kTop);
  o << "\" fill=\"none\" stroke=\"#333\"/>\n";
  o << "<text x=\"" << px(kLeft + pw / 2) << "\" y=\"" << px(kH - 16) << "\" text-anchor=\"middle\">"
    << esc(c.x_label) << "</text>\n";
  o << "<text x=\"18\" y=\"" << px(kTop + ph / 2) << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
    << px(kTop + ph / 2) << ")\"" << fill_attr(dual, kColors[0]) << ">"
    << esc(c.y_label) << "</text>\n";
  if (dual)
    o << "<text x=\"" << px(kW - 18) << "\" y=\"" << px(kTop + ph / 2) << "\" text-anchor=\"middle\" transform=\"rotate(90 "
      << px(kW - 18) << " " << px(kTop + ph / 2) << ")\" fill=\"" << kColors[1] << "\">" << esc(c.y2_label)
      << "</text>\n";
  // Series: a line, markers when there are few points, and a legend entry.
  double legend_x = kLeft;
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& s = c.series[k];
    const char* color = kColors[k % std::size(kColors)];
    std::string pts;
    for (auto [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        if (!pts.empty()) pts += ' ';
        pts += px(X(x));
        pts += ',';
        pts += px(Y(y, s.right_axis));
      }
    if (!pts.empty())
      o << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n";
    if (s.points.size() <= 24)
      for (auto [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          o << "<circle cx=\"" << px(X(x)) << "\" cy=\"" << px(Y(y, s.right_axis)) << "\" r=\"4\" fill=\"" << color
            << "\"/>\n";
    // Legend: one row between the title and the plot.
    o << "<line x1=\"" << px(legend_x) << "\" y1=\"40\" x2=\"" << px(legend_x + 24) << "\" y2=\"40\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>\n";
    o << "<text x=\"" << px(legend_x + 30) << "\" y=\"44\">" << esc(s.name) << "</text>\n";
    legend_x += 30 + 7 * static_cast<double>(s.name.size()) + 24;
  }
  o << "</svg>\n";
  return o.str();
}

Chart levels_chart(const std::vector<LevelResult>& levels, const std::string& title) {
  Chart c;
  c.title = title;
  // The x axis is whatever varies: the concurrency, or the rate when every level has one concurrency.
  bool by_rate = !levels.empty();
  for (const LevelResult& l : levels)
    if (l.concurrency != levels.front().concurrency) by_rate = false;
  if (by_rate) {
    by_rate = false;
    for (const LevelResult& l : levels)
      if (l.request_rate != levels.front().request_rate) by_rate = true;
  }
  c.x_label = by_rate ? "request rate (req/s)" : "max concurrency";
  c.y_label = "output throughput (tok/s)";
  c.y2_label = "p95 TTFT (ms)";
  Series thr{"output throughput (tok/s, left)", {}, false}, ttft{"p95 TTFT (ms, right)", {}, true};
  for (size_t i = 0; i < levels.size(); ++i) {
    const LevelResult& l = levels[i];
    std::string cat = by_rate ? (std::isinf(l.request_rate) ? "inf" : num(l.request_rate))
                              : (l.concurrency > 0 ? std::to_string(l.concurrency) : "unlimited");
    c.x_categories.push_back(cat);
    thr.points.push_back({static_cast<double>(i), l.output_throughput});
    ttft.points.push_back({static_cast<double>(i), l.ttft.p95 * 1e3});
  }
  c.series = {thr, ttft};
  return c;
}

Chart cdf_chart(const LevelResult& level, const std::string& title) {
  Chart c;
  c.title = title;
  c.x_label = "latency (ms)";
  c.y_label = "fraction of requests";
  auto cdf = [](std::vector<double> v, const std::string& name) {
    Series s{name, {}, false};
    std::sort(v.begin(), v.end());
    size_t n = v.size(), step = std::max<size_t>(1, n / 400);  // at most ~400 points
    for (size_t i = 0; i < n; i += step) s.points.push_back({v[i] * 1e3, static_cast<double>(i + 1) / static_cast<double>(n)});
    if (n && (n - 1) % step) s.points.push_back({v[n - 1] * 1e3, 1.0});
    return s;
  };
  std::vector<double> ttft, e2e;
  for (const RequestRecord& r : level.requests) {
    if (!r.ok) continue;
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
  }
  c.series = {cdf(ttft, "TTFT"), cdf(e2e, "end-to-end latency")};
  return c;
}

}  // namespace fp::bench_serve
