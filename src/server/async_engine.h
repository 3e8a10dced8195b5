// server/async_engine.h — the engine on its own thread, for many client threads at once.
// Clients submit a group of requests (the `n` choices of one API call) and read their events
// from a RequestStream; the engine thread never waits on a client, so a slow reader cannot
// slow the others. Cancelling a stream (a client that went away) frees its KV at the next step.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace fp {

struct TokenEvent {
  int index = 0;              // which choice of the group
  int32_t token = -1;         // -1: no token (the choice finished on EOG, or was cancelled)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  bool finished = false;
  std::string finish_reason;
  int64_t cached_tokens = -1;  // with the choice's first token: prompt tokens from the prefix cache
};

class RequestStream {
 public:
  // Waits up to timeout_ms for events; returns them (empty on timeout).
  std::vector<TokenEvent> wait(int timeout_ms);
  bool all_finished() const;
  int64_t prompt_tokens() const { return prompt_tokens_; }
  std::string error() const;  // set when the engine refused the request

 private:
  friend class AsyncEngine;
  void push(TokenEvent e);
  void set_error(const std::string& e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  std::vector<int64_t> ids_;
  int n_ = 0, finished_ = 0;
  int64_t prompt_tokens_ = 0;
  std::string error_;
};

class AsyncEngine {
 public:
  AsyncEngine(Model& model, const EngineConfig& cfg);
  ~AsyncEngine();
  const KvCapacity& capacity() const { return capacity_; }
  const EngineConfig& config() const { return cfg_; }
  // Queues the requests as one group; their events arrive on the returned stream.
  std::shared_ptr<RequestStream> submit(const std::vector<Request>& group);
  // Cancels choice `index` of the group, or every unfinished choice when index < 0 (idempotent).
  void cancel(const std::shared_ptr<RequestStream>& stream, int index = -1);
  // Cancels everything in flight and stops the engine thread.
  void shutdown();
  Metrics& metrics() { return metrics_; }
  // Refreshes the gauges (running, waiting, KV usage, ...) from the engine thread's last step.
  std::string metrics_text();
  int64_t in_flight() const { return in_flight_.load(); }
  // The fast-path ledger as JSON, read between engine steps.
  std::string ledger_json();
  // Runs `job` on the engine thread between two steps (the model belongs to that thread:
  // embeddings use it there) and waits for it; its exception, if any, is rethrown here. Throws
  // when the engine is shutting down.
  void run_between_steps(const std::function<void()>& job);
  // The engine, for a run_between_steps job (on the engine thread only).
  const Engine& engine() const { return *engine_; }

 private:
  void loop();
  Model& model_;
  EngineConfig cfg_;
  KvCapacity capacity_;
  std::unique_ptr<Engine> engine_;
  std::mutex mu_;
  std::mutex step_mu_;  // held by the engine thread while it runs a step (the ledger changes then)
  std::condition_variable wake_;
  std::vector<std::shared_ptr<RequestStream>> pending_;
  std::vector<std::unique_ptr<std::vector<Request>>> pending_reqs_;  // beside pending_
  std::vector<std::pair<std::shared_ptr<RequestStream>, int>> to_cancel_;
  std::vector<std::packaged_task<void()>> jobs_;  // run_between_steps
  std::map<int64_t, std::pair<std::shared_ptr<RequestStream>, int>> live_;  // engine id -> (stream, choice index)
  bool stop_ = false;
  std::atomic<int64_t> in_flight_{0};
  Metrics metrics_;
  std::thread thread_;
};

}  // namespace fp
