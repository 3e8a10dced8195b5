// tools/bench_serve/runner.h — one run level: the prompts sent with at most `concurrency` in
// flight (one thread per slot) and Poisson arrivals at `request_rate` (inf: all at once),
// after an untimed warm-up.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "tools/bench_serve/client.h"

namespace fp::bench_serve {

struct Level {
  int concurrency = 0;  // 0: unlimited (one slot per request, capped at kMaxSlots)
  double request_rate = std::numeric_limits<double>::infinity();
};

inline constexpr int kMaxSlots = 1024;

// Arrival offsets (seconds from the start) of n requests: exponential gaps of mean 1/rate
// (a Poisson process), all zero when the rate is infinite.
std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed);

// Sends `warmups` (their results are dropped; the failures are counted into *warmup_failed),
// then the prompts; returns the aggregated level with every request's record.
LevelResult run_level(const Target& t, const SamplingOptions& s, const std::vector<Prompt>& prompts,
                      const std::vector<Prompt>& warmups, const Level& level, uint64_t seed,
                      int* warmup_failed = nullptr);

}  // namespace fp::bench_serve
