// kernels/ledger.h — the fast-path ledger: for every (op, shape class) the engine dispatched,
// which kernel ran, which candidates were refused and why, how often, and how long.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fp {

struct LedgerEntry {
  std::string op;
  std::string shape_class;  // e.g. "w=Q8_0 gemv"
  std::string kernel;       // chosen kernel name
  std::string backend;      // "cpu", "cuda"
  bool reference = false;   // the chosen kernel is the plain reference
  bool forced = false;      // chosen by --kernel op=name
  std::string timing;       // chosen by timing it against a rival (timed_choice.h): both times
  std::vector<std::pair<std::string, std::string>> refused;  // (kernel, reason), best first
  uint64_t calls = 0;
  uint64_t nanos = 0;  // only while profiling is on
  // A fallback: the reference ran although a faster kernel for this backend exists and was refused.
  bool fallback() const { return reference && !forced && !refused.empty(); }
};

class Ledger {
 public:
  static Ledger& global();
  LedgerEntry* entry(const std::string& op, const std::string& shape_class);  // created on first use
  std::vector<LedgerEntry> snapshot() const;
  void reset();

  bool profiling() const { return profiling_; }
  void set_profiling(bool on) { profiling_ = on; }

  // Graph coverage of the forward steps run on a device: how each step ran — "replayed" (a
  // recorded CUDA graph), "recorded" (captured, then replayed), or "eager: <why not a graph>".
  // Calls made inside a recording are counted once in the entries; replays only here.
  void note_step(const std::string& how);
  std::map<std::string, uint64_t> steps() const;
  // How the serving engine ran its steps under async scheduling: launched while the step before
  // ran on the device, or after it, and why (engine/engine.h).
  void note_engine_step(const std::string& how);
  std::map<std::string, uint64_t> engine_steps() const;

  // Ops whose entries include a fallback (for --strict).
  std::vector<std::string> fallbacks() const;
  std::string table() const;       // human-readable, one row per entry
  std::string json() const;        // one JSON object: {"entries":[...]}
  std::string summary_line() const;  // "ledger: 9 ops, 12 shape classes, 0 fallbacks, kernels: ..."

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, LedgerEntry> entries_;
  std::map<std::string, uint64_t> steps_, engine_steps_;
  bool profiling_ = false;
};

}  // namespace fp
