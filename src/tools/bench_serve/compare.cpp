// tools/bench_serve/compare.cpp — see compare.h.
#include "tools/bench_serve/compare.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fp::bench_serve {

namespace {

double number_or_zero(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return 0;  // e.g. TPOT when every request had one token
  return j[key].get<double>();
}

const RunSummary::Level* find_level(const RunSummary& r, const std::string& label) {
  for (const auto& l : r.levels)
    if (l.label == label) return &l;
  return nullptr;
}

}  // namespace

RunSummary read_run(const std::string& path, const std::string& name) {
  std::ifstream f(path, std::ios::binary);
  FP_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  FP_CHECK(!j.is_discarded(), path, ": not valid JSON");
  FP_CHECK(j.is_object() && j.contains("levels") && j["levels"].is_array(), path, ": no \"levels\" array (not a bench-serve --json result)");
  RunSummary r;
  r.name = name.empty() ? path.substr(path.find_last_of('/') + 1) : name;
  for (size_t i = 0; i < j["levels"].size(); ++i) {
    const nlohmann::json& l = j["levels"][i];
    try {
      RunSummary::Level v;
      v.label = l.at("label").get<std::string>();
      v.output_tps = l.at("output_throughput").get<double>();
      v.median_ttft_ms = number_or_zero(l, "median_ttft_ms");
      v.median_tpot_ms = number_or_zero(l, "median_tpot_ms");
      v.completed = l.at("completed").get<int>();
      v.failed = l.at("failed").get<int>();
      r.levels.push_back(v);
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": levels[", i, "]: ", e.what());
    }
  }
  FP_CHECK(!r.levels.empty(), path, ": \"levels\" is empty");
  return r;
}

void print_runs(std::ostream& os, const std::vector<RunSummary>& runs) {
  if (runs.empty()) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-18s %-16s %12s %9s %14s %14s %10s\n", "level", "server", "output tok/s", "vs first",
                "TTFT p50 ms", "TPOT p50 ms", "ok/failed");
  os << buf;
  for (const auto& first : runs.front().levels) {
    for (const RunSummary& r : runs) {
      const RunSummary::Level* l = find_level(r, first.label);
      if (!l) {
        std::snprintf(buf, sizeof buf, "%-18s %-16s %12s\n", first.label.c_str(), r.name.c_str(), "(not run)");
        os << buf;
        continue;
      }
      char ratio[32] = "-";
      if (const RunSummary::Level* base = find_level(runs.front(), first.label); base && base->output_tps > 0)
        std::snprintf(ratio, sizeof ratio, "%.2fx", l->output_tps / base->output_tps);
      std::string ok = std::to_string(l->completed) + "/" + std::to_string(l->failed);
      std::snprintf(buf, sizeof buf, "%-18s %-16s %12.2f %9s %14.1f %14.1f %10s\n", first.label.c_str(), r.name.c_str(),
                    l->output_tps, ratio, l->median_ttft_ms, l->median_tpot_ms, ok.c_str());
      os << buf;
    }
  }
}

Chart runs_chart(const std::vector<RunSummary>& runs, const std::string& title) {
  Chart c;
  c.title = title;
  c.x_label = "level";
  c.y_label = "output throughput (tok/s)";
  if (runs.empty()) return c;
  for (const auto& l : runs.front().levels) c.x_categories.push_back(l.label);
  for (const RunSummary& r : runs) {
    Series s{r.name, {}, false};
    for (size_t i = 0; i < c.x_categories.size(); ++i)
      if (const RunSummary::Level* l = find_level(r, c.x_categories[i])) s.points.push_back({static_cast<double>(i), l->output_tps});
    c.series.push_back(std::move(s));
  }
  return c;
}

}  // namespace fp::bench_serve
