// kernels/registry.h — the op registry and dispatcher.
//
// An op is an argument struct `Args` with `static constexpr const char* kName` and a method
// `std::string shape_class() const` naming the class of calls that share one dispatch decision.
// A kernel implements an op for a backend and answers `refuse(args)`: empty when it can run the
// call, otherwise the reason it cannot. Dispatch asks the candidates best first, caches the
// decision per shape class, and records it in the ledger. Registration is one line beside the
// kernel:  static const bool reg = register_kernel<RmsNormArgs>({...});
//
// Timed kernels: where the order of kernels depends on the CPU and not on its features
// (timed_choice.h), the better ranked are marked `timed`. When a timed kernel accepts a call, it
// and the candidates below it that accept it, down to the first one not timed, are raced on the
// first call of the shape class (twice each: they must be idempotent, as every kernel that
// writes its output and reads only its inputs is) and the fastest is cached like any decision;
// the others are recorded as refused, and the times in the entry. The choice is kept per
// machine, so later runs take it without timing. --kernel op=name still decides outright.
//
// Backends: a call runs on the calling thread's execution device (core/device.h,
// current_device()); only that backend's kernels are candidates, and its decisions are cached
// and recorded apart ("cuda: " before the shape class), so the ledger shows both sides.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "kernels/timed_choice.h"

namespace fp {

enum class Backend { CPU, CUDA };
inline const char* backend_name(Backend b) { return b == Backend::CPU ? "cpu" : "cuda"; }
inline Backend backend_of(Device d) { return d == Device::CPU ? Backend::CPU : Backend::CUDA; }

// Forget every cached decision of every op (after changing overrides or resetting the ledger).
void invalidate_all_dispatch();
void register_invalidator(std::function<void()> fn);

template <class Args>
struct Kernel {
  std::string name;    // unique within the op, e.g. "ref", "avx2"
  Backend backend = Backend::CPU;
  int priority = 0;    // higher is tried first; reference kernels use 0
  bool reference = false;
  std::function<std::string(const Args&)> refuse;  // "" when the kernel can run the call
  std::function<void(const Args&)> run;
  // Its lead over the candidates below it that accept a call is settled by timing them (above).
  bool timed = false;
  // When set, only the calls it says yes to are timed; the others take the kernel by its rank.
  // A race must be between kernels whose products the caller accepts either way: one between
  // numerics of different precision (BF16-rounded against f32 activations) would let timing
  // noise, or each rank's own race, choose the numbers.
  std::function<bool(const Args&)> timed_for = nullptr;
  bool timed_on(const Args& a) const { return timed && (!timed_for || timed_for(a)); }
};

// Forced kernel choices (--kernel op=name), shared by all ops.
class KernelOverrides {
 public:
  static KernelOverrides& global();
  void force(const std::string& op, const std::string& kernel);
  void clear();
  const std::string* forced(const std::string& op) const;
  std::map<std::string, std::string> all() const { return forced_; }
 private:
  std::map<std::string, std::string> forced_;
};

// Every registered op name with its kernel names (for --help and validation of --kernel).
std::map<std::string, std::vector<std::string>>& kernel_catalog();

template <class Args>
class OpRegistry {
 public:
  static OpRegistry& instance() {
    static OpRegistry r;
    return r;
  }

  bool add(Kernel<Args> k) {
    std::lock_guard<std::mutex> lock(mu_);
    kernel_catalog()[Args::kName].push_back(k.name);
    kernels_.push_back(std::move(k));
    std::stable_sort(kernels_.begin(), kernels_.end(),
                     [](const Kernel<Args>& a, const Kernel<Args>& b) { return a.priority > b.priority; });
    cache_.clear();
    return true;
  }

  const std::vector<Kernel<Args>>& kernels() const { return kernels_; }

  // Runs the call on the chosen kernel, recording it in the ledger.
  void call(const Args& args) {
    Contest c;
    Decision d = decide(args, c);
    if (!c.contenders.empty()) return contest(args, d, c);
    Ledger& ledger = Ledger::global();
    if (ledger.profiling()) {
      auto t0 = std::chrono::steady_clock::now();
      d.kernel->run(args);
      // Device kernels return at launch: wait for this one so its time is its own.
      if (d.kernel->backend != Backend::CPU) device_memory(Device::CUDA).synchronize();
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      d.entry->nanos += static_cast<uint64_t>(ns);
    } else {
      d.kernel->run(args);
    }
    ++d.entry->calls;
  }

  // Drops cached decisions (after forcing kernels or changing CPU features).
  void invalidate() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.clear();
  }

 private:
  OpRegistry() { register_invalidator([this] { invalidate(); }); }

  struct Decision {  // what the cache keeps per shape class, copied on every call
    const Kernel<Args>* kernel = nullptr;
    LedgerEntry* entry = nullptr;
  };
  // A timed choice not settled yet: the kernels to time, best ranked first, and every kernel
  // ranked from the first down to the last of them with its refusal ("" for the contenders),
  // for the ledger once the winner is known.
  struct Contest {
    std::vector<const Kernel<Args>*> contenders;
    std::vector<std::pair<const Kernel<Args>*, std::string>> ranked;
    std::string cls;
  };

  static double run_ms(const Kernel<Args>& k, const Args& args) {
    auto t0 = std::chrono::steady_clock::now();
    k.run(args);
    if (k.backend != Backend::CPU) device_memory(Device::CUDA).synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  static std::vector<std::string> names(const std::vector<const Kernel<Args>*>& ks) {
    std::vector<std::string> out;
    for (auto* k : ks) out.push_back(k->name);
    return out;
  }

  // Runs the call on every contender twice: worst ranked first in the first round (so the timed
  // kernels do not pay for first touches alone), best ranked first in the second; the best time
  // of each decides, and the call's output is the winner's (run once more if it did not run
  // last). Outside the lock: a kernel may dispatch other ops.
  void contest(const Args& args, Decision d, Contest& c) {
    const size_t n = c.contenders.size();
    std::vector<double> ms(n);
    for (size_t i = n; i-- > 0;) ms[i] = run_ms(*c.contenders[i], args);
    for (size_t i = 0; i < n; ++i) ms[i] = std::min(ms[i], run_ms(*c.contenders[i], args));
    TimedChoice t;
    for (size_t i = 0; i < n; ++i) t.times.emplace_back(c.contenders[i]->name, ms[i]);
    std::stable_sort(t.times.begin(), t.times.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
    if (t.winner() != c.contenders[n - 1]->name)  // the output must be the kernel's every later call runs
      for (auto* k : c.contenders)
        if (k->name == t.winner()) k->run(args);
    store_timed_choice(Args::kName, c.cls, t);
    std::lock_guard<std::mutex> lock(mu_);
    settle(d, c, t);
    cache_[c.cls] = d;
    ++d.entry->calls;
    if (Ledger::global().profiling()) d.entry->nanos += static_cast<uint64_t>(t.times[0].second * 1e6);
  }

  // Records the timed choice in the decision and the ledger (under mu_): the kernels ranked
  // above the winner are refused with their reasons, and every other contender as slower.
  void settle(Decision& d, Contest& c, const TimedChoice& t) {
    for (auto* k : c.contenders)
      if (k->name == t.winner()) d.kernel = k;
    bool above = true;
    for (auto& [k, why] : c.ranked) {
      if (k == d.kernel) {
        above = false;
        continue;
      }
      if (!why.empty()) {
        if (above) d.entry->refused.emplace_back(k->name, why);
      } else {
        d.entry->refused.emplace_back(k->name, "slower on this machine (timed: see above)");
      }
    }
    c.contenders.clear();
    c.ranked.clear();
    d.entry->timing = t.describe();
    d.entry->kernel = d.kernel->name;
    d.entry->backend = backend_name(d.kernel->backend);
    d.entry->reference = d.kernel->reference;
  }

  Decision decide(const Args& args, Contest& c) {
    const Backend backend = backend_of(current_device());
    std::string cls = args.shape_class();
    if (backend != Backend::CPU) cls = std::string(backend_name(backend)) + ": " + cls;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(cls);
    // A cached decision is re-asked: a kernel whose refusal depends on something the shape class
    // does not name would otherwise run on calls it refuses (twice a wrong result: rows not whole
    // 256-value groups on the CPU, not whole 8-value chunks on the GPU). Such a call is decided
    // apart, under a class naming the gap, once with a warning; the ledger shows both entries.
    for (int depth = 0; it != cache_.end() && depth < 4; ++depth) {
      const Kernel<Args>* k = it->second.kernel;
      const std::string why = k->refuse ? k->refuse(args) : std::string();
      if (why.empty()) return it->second;
      const std::string apart = cls + " | " + k->name + " refuses: " + why;
      if (!cache_.count(apart))
        log_warn("dispatch: ", Args::kName, " class '", cls, "' was decided for ", k->name,
                 ", which refuses this call (", why, "): the class misses a property; deciding it apart");
      cls = apart;
      it = cache_.find(cls);
    }
    Decision d;  // a new class (or, past 4 gaps, the last one decided again)
    LedgerEntry* e = Ledger::global().entry(Args::kName, cls);
    e->refused.clear();
    e->timing.clear();
    const std::string* forced = KernelOverrides::global().forced(Args::kName);
    for (const auto& k : kernels_) {
      if (k.backend != backend) continue;  // another device's kernel: not a candidate here
      if (forced && k.name != *forced) continue;
      std::string why = k.refuse ? k.refuse(args) : std::string();
      if (!why.empty()) {
        if (forced) fail("kernel ", Args::kName, "=", k.name, " was forced but cannot run ", cls, ": ", why);
        if (d.kernel) c.ranked.emplace_back(&k, why);
        else e->refused.emplace_back(k.name, why);
        continue;
      }
      if (!d.kernel) {
        d.kernel = &k;
        if (!k.timed_on(args) || forced) break;
      }
      // A timed kernel: it and every candidate that accepts the call down to the first one
      // that is not timed are raced.
      c.contenders.push_back(&k);
      c.ranked.emplace_back(&k, std::string());
      if (c.contenders.size() > 1 && !k.timed_on(args)) break;
    }
    if (c.contenders.size() == 1) c.contenders.clear(), c.ranked.clear();  // no rival accepts the call
    if (!d.kernel) {
      if (forced)
        fail("kernel ", Args::kName, "=", *forced, " was forced but no ", backend_name(backend), " kernel of that name is registered");
      std::string reasons;
      for (auto& [n, r] : e->refused) reasons += "; " + n + ": " + r;
      fail("no kernel can run op ", Args::kName, " for ", cls, reasons);
    }
    e->kernel = d.kernel->name;
    e->backend = backend_name(d.kernel->backend);
    e->reference = d.kernel->reference;
    e->forced = forced != nullptr;
    d.entry = e;
    if (!c.contenders.empty()) {
      std::optional<TimedChoice> stored = load_timed_choice(Args::kName, cls, names(c.contenders));
      if (!stored) {
        c.cls = cls;
        return d;  // the caller times them (contest) and caches the winner
      }
      settle(d, c, *stored);
    }
    cache_[cls] = d;
    return d;
  }

  std::mutex mu_;
  std::vector<Kernel<Args>> kernels_;
  std::map<std::string, Decision> cache_;
};

template <class Args>
bool register_kernel(Kernel<Args> k) {
  return OpRegistry<Args>::instance().add(std::move(k));
}

// Why no kernel of `backend` could run `args`: each candidate's refusal ("" when one accepts).
// Lets a loader refuse a configuration up front instead of at the first call.
template <class Args>
std::string refusals(const Args& args, Backend backend) {
  std::string reasons;
  for (const auto& k : OpRegistry<Args>::instance().kernels()) {
    if (k.backend != backend) continue;
    const std::string why = k.refuse ? k.refuse(args) : std::string();
    if (why.empty()) return "";
    reasons += (reasons.empty() ? "" : "; ") + k.name + ": " + why;
  }
  return reasons.empty() ? std::string("no ") + backend_name(backend) + " kernel is registered" : reasons;
}

// Dispatches one op call: dispatch(args) picks the kernel and runs it.
template <class Args>
void dispatch(const Args& args) {
  OpRegistry<Args>::instance().call(args);
}

}  // namespace fp
