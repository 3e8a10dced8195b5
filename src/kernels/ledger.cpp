// kernels/ledger.cpp — ledger storage and its table / JSON / one-line renderings.
#include "kernels/ledger.h"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/registry.h"

namespace fp {

Ledger& Ledger::global() {
  static Ledger l;
  return l;
}

LedgerEntry* Ledger::entry(const std::string& op, const std::string& shape_class) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[{op, shape_class}];
  e.op = op;
  e.shape_class = shape_class;
  return &e;
}

std::vector<LedgerEntry> Ledger::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LedgerEntry> out;
  for (auto& [k, e] : entries_) out.push_back(e);
  return out;
}

void Ledger::reset() {
  invalidate_all_dispatch();  // cached decisions point into the entries
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  steps_.clear();
  engine_steps_.clear();
}

void Ledger::note_step(const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_[how];
}

std::map<std::string, uint64_t> Ledger::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

void Ledger::note_engine_step(const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  ++engine_steps_[how];
}

std::map<std::string, uint64_t> Ledger::engine_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_steps_;
}

std::vector<std::string> Ledger::fallbacks() const {
  std::vector<std::string> out;
  for (auto& e : snapshot())
    if (e.fallback()) out.push_back(e.op + " (" + e.shape_class + ")");
  return out;
}

std::string Ledger::table() const {
  auto entries = snapshot();
  int shape_w = 26;  // wide enough for the longest shape class (MLA's are long)
  int op_w = 12;
  for (auto& e : entries) {
    shape_w = std::max(shape_w, static_cast<int>(e.shape_class.size()) + 2);
    op_w = std::max(op_w, static_cast<int>(e.op.size()) + 2);
  }
  std::ostringstream os;
  os << std::left << std::setw(op_w) << "op" << std::setw(shape_w) << "shape class" << std::setw(16) << "kernel"
     << std::setw(6) << "be" << std::right << std::setw(9) << "calls" << std::setw(12) << "time ms" << "  status\n";
  for (auto& e : entries) {
    std::string status = e.forced ? "forced" : e.fallback() ? "FALLBACK" : e.reference ? "reference (only kernel)" : "fast";
    os << std::left << std::setw(op_w) << e.op << std::setw(shape_w) << e.shape_class << std::setw(16) << e.kernel
       << std::setw(6) << e.backend << std::right << std::setw(9) << e.calls << std::setw(12) << std::fixed
       << std::setprecision(2);
    if (e.nanos > 0) os << e.nanos / 1e6;
    else os << "-";  // not profiled (--profile)
    os << "  " << status << "\n";
    if (!e.timing.empty()) os << "    chosen by timing: " << e.timing << "\n";
    for (auto& [k, why] : e.refused) os << "    refused " << k << ": " << why << "\n";
  }
  auto st = steps();
  if (!st.empty()) {
    os << "device steps:";
    for (auto& [how, n] : st) os << "  " << how << " x" << n;
    os << "\n";
  }
  auto es = engine_steps();
  if (!es.empty()) {
    os << "engine steps (async scheduling):";
    for (auto& [how, n] : es) os << "  " << how << " x" << n;
    os << "\n";
  }
  return os.str();
}

std::string Ledger::json() const {
  nlohmann::json j;
  j["entries"] = nlohmann::json::array();
  for (auto& e : snapshot()) {
    nlohmann::json r;
    r["op"] = e.op;
    r["shape_class"] = e.shape_class;
    r["kernel"] = e.kernel;
    r["backend"] = e.backend;
    r["reference"] = e.reference;
    r["forced"] = e.forced;
    if (!e.timing.empty()) r["timing"] = e.timing;
    r["fallback"] = e.fallback();
    r["calls"] = e.calls;
    r["time_ms"] = e.nanos / 1e6;
    r["refused"] = nlohmann::json::array();
    for (auto& [k, why] : e.refused) r["refused"].push_back({{"kernel", k}, {"reason", why}});
    j["entries"].push_back(r);
  }
  j["fallbacks"] = fallbacks();
  j["device_steps"] = steps();
  j["engine_steps"] = engine_steps();
  return j.dump(2);
}

std::string Ledger::summary_line() const {
  auto entries = snapshot();
  std::set<std::string> ops;
  std::map<std::string, int> kernels;
  int fallbacks = 0, refs = 0;
  for (auto& e : entries) {
    ops.insert(e.op);
    kernels[e.op + "=" + e.kernel]++;
    fallbacks += e.fallback();
    refs += e.reference;
  }
  std::ostringstream os;
  os << "ledger: " << ops.size() << " ops, " << entries.size() << " shape classes, " << fallbacks << " fallbacks, "
     << refs << " on reference kernels; kernels:";
  for (auto& [k, n] : kernels) os << ' ' << k;
  for (auto& [how, n] : steps()) os << "; steps " << how << " x" << n;
  return os.str();
}

}  // namespace fp
