// kernels/timed_choice.cpp — the per-machine file of timed kernel choices (timed_choice.h).
#include "kernels/timed_choice.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_affinity.h"
#include "core/cpu_features.h"
#include "core/paths.h"
#include "core/thread_pool.h"

namespace fp {
namespace {

std::string file_path() { return fastpath_cache_dir() + "/kernel_choices.json"; }

// The same kernel can win on 1 thread and lose on 2 (bandwidth-bound vs compute-bound), and a
// rank bound to one core is not the machine: the key is the one machine_ceiling() uses.
std::string cpu_name() { return cpu_features().brand.empty() ? "unknown CPU" : cpu_features().brand; }

std::string machine_key() {
  return cpu_name() + " | " + std::to_string(thread_pool().size()) + " threads on CPUs " + thread_cpus().text();
}

std::string choice_key(const std::string& op, const std::string& shape_class, std::vector<std::string> kernels) {
  std::sort(kernels.begin(), kernels.end());  // in name order: one entry whatever the ranks
  std::string key = op + " | " + shape_class + " |";
  for (size_t i = 0; i < kernels.size(); ++i) key += (i ? " vs " : " ") + kernels[i];
  return key;
}

std::mutex& file_mutex() {
  static std::mutex mu;
  return mu;
}

nlohmann::json read_file() {
  std::ifstream in(file_path());
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_discarded() || !j.is_object() ? nlohmann::json::object() : j;
}

// Written to a temporary file and renamed over the old one, so that ranks writing at once
// leave one whole file (the last writer's), never a torn one.
void write_file(const nlohmann::json& j) {
  const std::string path = file_path();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (!out) return;  // an unwritable cache costs a timing next run, nothing else
    out << j.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

std::string TimedChoice::describe() const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  for (size_t i = 0; i < times.size(); ++i) os << (i ? ", " : "") << times[i].first << " " << times[i].second << " ms";
  os << " per call, best of 2 each on the class's first call";
  os << (cached ? " (stored in " + file_path() + ")" : " (timed in this run)");
  return os.str();
}

std::optional<TimedChoice> load_timed_choice(const std::string& op, const std::string& shape_class,
                                             std::vector<std::string> kernels) {
  std::lock_guard<std::mutex> lock(file_mutex());
  const nlohmann::json j = read_file();
  const std::string mk = machine_key(), ck = choice_key(op, shape_class, kernels);
  if (!j.contains(mk) || !j[mk].is_object() || !j[mk].contains(ck) || !j[mk][ck].is_object()) return std::nullopt;
  const nlohmann::json& e = j[mk][ck];
  if (!e.contains("times_ms") || !e["times_ms"].is_object()) return std::nullopt;
  TimedChoice c;
  c.cached = true;
  for (const auto& k : kernels) {
    if (!e["times_ms"].contains(k) || !e["times_ms"][k].is_number()) return std::nullopt;  // a kernel renamed since
    c.times.emplace_back(k, e["times_ms"][k].get<double>());
  }
  std::stable_sort(c.times.begin(), c.times.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  return c;
}

void store_timed_choice(const std::string& op, const std::string& shape_class, const TimedChoice& c) {
  std::lock_guard<std::mutex> lock(file_mutex());
  nlohmann::json j = read_file();
  std::vector<std::string> kernels;
  nlohmann::json times = nlohmann::json::object();
  for (auto& [k, ms] : c.times) kernels.push_back(k), times[k] = ms;
  const std::string mk = machine_key();
  if (!j.contains(mk) || !j[mk].is_object()) j[mk] = nlohmann::json::object();  // absent, or a hand-edited file's other type
  j[mk][choice_key(op, shape_class, kernels)] = {{"winner", c.winner()}, {"times_ms", times}};
  write_file(j);
}

void forget_timed_choices() {
  std::lock_guard<std::mutex> lock(file_mutex());
  nlohmann::json j = read_file();
  const std::string cpu = cpu_name();
  std::vector<std::string> mine;  // this CPU's entries, for every thread count
  for (auto& [key, value] : j.items())
    if (key.rfind(cpu + " | ", 0) == 0) mine.push_back(key);
  if (mine.empty()) return;
  for (auto& key : mine) j.erase(key);
  write_file(j);
}

}  // namespace fp
