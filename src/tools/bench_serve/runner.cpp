// tools/bench_serve/runner.cpp — worker threads pulling requests in arrival order.
#include "tools/bench_serve/runner.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

namespace fp::bench_serve {

std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed) {
  std::vector<double> at(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return at;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double t = 0;
  for (double& a : at) {
    a = t;
    t += gap(rng);
  }
  return at;
}

namespace {

using Clock = std::chrono::steady_clock;

// Runs prompts[i] at start + arrivals[i] on `slots` threads; each thread takes the next
// request in order when it is free, so no more than `slots` are ever in flight.
std::vector<RequestRecord> dispatch(const Target& t, const SamplingOptions& s, const std::vector<Prompt>& prompts,
                                    const std::vector<double>& arrivals, int slots, Clock::time_point start) {
  std::vector<RequestRecord> out(prompts.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    std::unique_ptr<httplib::Client> cli;
    for (size_t i = next++; i < prompts.size(); i = next++) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(arrivals[i])));
      if (!cli) cli = make_client(t);
      double sent = std::chrono::duration<double>(Clock::now() - start).count();
      out[i] = send_request(*cli, t, prompts[i], s);
      out[i].index = static_cast<int>(i);
      out[i].start_s = sent;
      // After a failure the connection may be half-used; start the next request on a fresh one.
      if (!out[i].ok) cli.reset();
    }
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < slots; ++k) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  return out;
}

int slots_for(int concurrency, size_t n) {
  size_t cap = concurrency > 0 ? static_cast<size_t>(concurrency) : static_cast<size_t>(kMaxSlots);
  return static_cast<int>(std::max<size_t>(1, std::min(cap, n)));
}

}  // namespace

LevelResult run_level(const Target& t, const SamplingOptions& s, const std::vector<Prompt>& prompts,
                      const std::vector<Prompt>& warmups, const Level& level, uint64_t seed, int* warmup_failed) {
  if (!warmups.empty()) {
    auto w = dispatch(t, s, warmups, std::vector<double>(warmups.size(), 0.0),
                      slots_for(level.concurrency, warmups.size()), Clock::now());
    if (warmup_failed) *warmup_failed = static_cast<int>(std::count_if(w.begin(), w.end(), [](auto& r) { return !r.ok; }));
  }
  auto arrivals = poisson_arrivals(static_cast<int>(prompts.size()), level.request_rate, seed);
  auto start = Clock::now();
  auto records = dispatch(t, s, prompts, arrivals, slots_for(level.concurrency, prompts.size()), start);
  double duration = 0;
  for (const RequestRecord& r : records) duration = std::max(duration, r.start_s + r.e2e_s);
  LevelResult res = aggregate(std::move(records), duration);
  res.concurrency = level.concurrency;
  res.request_rate = level.request_rate;
  return res;
}

}  // namespace fp::bench_serve
