// kernels/registry.h — the op registry and dispatcher.
//
// An op is an argument struct `Args` with `static constexpr const char* kName` and a method
// `std::string shape_class() const` naming the class of calls that share one dispatch decision.
// A kernel implements an op for a backend and answers `refuse(args)`: empty when it can run the
// call, otherwise the reason it cannot. Dispatch asks the candidates best first, caches the
// decision per shape class, and records it in the ledger. Registration is one line beside the
// kernel:  static const bool reg = register_kernel<RmsNormArgs>({...});
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
#include "kernels/ledger.h"

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
    Decision d = decide(args);
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

  struct Decision {
    const Kernel<Args>* kernel = nullptr;
    LedgerEntry* entry = nullptr;
  };

  Decision decide(const Args& args) {
    const Backend backend = backend_of(current_device());
    std::string cls = args.shape_class();
    if (backend != Backend::CPU) cls = std::string(backend_name(backend)) + ": " + cls;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(cls);
    if (it != cache_.end()) return it->second;
    Decision d;
    LedgerEntry* e = Ledger::global().entry(Args::kName, cls);
    e->refused.clear();
    const std::string* forced = KernelOverrides::global().forced(Args::kName);
    for (const auto& k : kernels_) {
      if (k.backend != backend) continue;  // another device's kernel: not a candidate here
      if (forced && k.name != *forced) continue;
      std::string why = k.refuse ? k.refuse(args) : std::string();
      if (!why.empty()) {
        if (forced) fail("kernel ", Args::kName, "=", k.name, " was forced but cannot run ", cls, ": ", why);
        e->refused.emplace_back(k.name, why);
        continue;
      }
      d.kernel = &k;
      break;
    }
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
