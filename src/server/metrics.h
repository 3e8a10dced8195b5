// server/metrics.h — Prometheus text-format metrics in the style of vLLM's, prefixed
// `fastpath:`: gauges (running/waiting requests, KV usage), counters (tokens, requests,
// preemptions) and histograms (time to first token, time per output token, end-to-end).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fp {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket/_sum/_count lines for `name`.
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t count_ = 0;
};

struct Metrics {
  std::mutex mu;  // guards everything below
  double requests_running = 0, requests_waiting = 0, kv_usage = 0, prefix_hit_rate = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0, prefix_waits = 0;
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;  // speculative decoding
  int64_t success_stop = 0, success_length = 0, cancelled = 0, rejected = 0;
  int64_t embedding_requests = 0, embedding_tokens = 0;  // POST /v1/embeddings
  std::map<std::string, int64_t> lora_requests;          // completions per LoRA adapter name
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}};
  Histogram tpot{{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}};
  Histogram e2e{{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0}};
  std::string text();  // locks mu
};

}  // namespace fp
