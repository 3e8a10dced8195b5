// server/async_engine.cpp — the engine thread: take new and cancelled requests, step, hand
// each output to its stream, keep the metrics.
#include "server/async_engine.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"

namespace fp {

std::vector<TokenEvent> RequestStream::wait(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  std::vector<TokenEvent> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

bool RequestStream::all_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ >= n_ && events_.empty();
}

std::string RequestStream::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void RequestStream::set_error(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  error_ = e;
}

void RequestStream::push(TokenEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (e.finished) ++finished_;
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

AsyncEngine::AsyncEngine(Model& model, const EngineConfig& cfg) : model_(model), cfg_(cfg) {
  engine_ = std::make_unique<Engine>(model, cfg);
  capacity_ = engine_->capacity();
  cfg_ = engine_->config();
  metrics_.kv_blocks_total = engine_->pool().n_blocks();
  metrics_.kv_blocks_free = engine_->pool().n_blocks();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { shutdown(); }

std::shared_ptr<RequestStream> AsyncEngine::submit(const std::vector<Request>& group) {
  auto s = std::make_shared<RequestStream>();
  s->n_ = static_cast<int>(group.size());
  s->prompt_tokens_ = group.empty() ? 0 : static_cast<int64_t>(group[0].prompt.size());
  auto reqs = std::make_unique<std::vector<Request>>(group);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      s->set_error("the server is shutting down");
      for (int i = 0; i < s->n_; ++i) s->push({i, -1, 0, {}, true, "cancelled", -1});
      return s;
    }
    pending_.push_back(s);
    pending_reqs_.push_back(std::move(reqs));
  }
  in_flight_ += s->n_;
  wake_.notify_all();
  return s;
}

void AsyncEngine::cancel(const std::shared_ptr<RequestStream>& stream, int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    to_cancel_.push_back({stream, index});
  }
  wake_.notify_all();
}

void AsyncEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string AsyncEngine::metrics_text() { return metrics_.text(); }

void AsyncEngine::run_between_steps(const std::function<void()>& job) {
  std::packaged_task<void()> task(job);
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    FP_CHECK(!stop_, "the server is shutting down");
    jobs_.push_back(std::move(task));
  }
  wake_.notify_all();
  done.get();  // rethrows the job's exception
}

std::string AsyncEngine::ledger_json() {
  std::lock_guard<std::mutex> lock(step_mu_);
  return Ledger::global().json();
}

void AsyncEngine::loop() {
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  auto finish_choice = [&](int64_t id, const std::string& reason) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    const Sequence* s = engine_->sequence(id);
    {
      std::lock_guard<std::mutex> lock(metrics_.mu);
      if (reason == "stop") ++metrics_.success_stop;
      else if (reason == "length") ++metrics_.success_length;
      else ++metrics_.cancelled;
      if (s && s->t_first_token > 0) {
        metrics_.ttft.observe(s->t_first_token - s->t_arrival);
        if (s->n_generated() > 1)
          metrics_.tpot.observe((s->t_last_token - s->t_first_token) / static_cast<double>(s->n_generated() - 1));
      }
      if (s) metrics_.e2e.observe(now() - s->t_arrival);
    }
    live_.erase(it);
    engine_->drop(id);
    --in_flight_;
  };
  while (true) {
    std::vector<std::shared_ptr<RequestStream>> adds;
    std::vector<std::pair<std::shared_ptr<RequestStream>, int>> cancels;
    std::vector<std::unique_ptr<std::vector<Request>>> add_reqs;
    std::vector<std::packaged_task<void()>> jobs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !pending_.empty() || !to_cancel_.empty() || !jobs_.empty() || engine_->has_work(); });
      if (stop_) break;
      adds.swap(pending_);
      add_reqs.swap(pending_reqs_);
      cancels.swap(to_cancel_);
      jobs.swap(jobs_);
    }
    for (size_t g = 0; g < adds.size(); ++g) {
      auto& stream = adds[g];
      const std::vector<Request>& group = *add_reqs[g];
      for (int i = 0; i < static_cast<int>(group.size()); ++i) {
        try {
          const int64_t id = engine_->add_request(group[static_cast<size_t>(i)]);
          stream->ids_.push_back(id);
          live_[id] = {stream, i};
          {
            std::lock_guard<std::mutex> lock(metrics_.mu);
            metrics_.prompt_tokens += static_cast<int64_t>(group[static_cast<size_t>(i)].prompt.size());
          }
          const Sequence* s = engine_->sequence(id);
          if (s && s->state == SeqState::Finished) {  // nothing to generate
            stream->push({i, -1, 0, {}, true, s->finish_reason, -1});
            finish_choice(id, s->finish_reason);
          }
        } catch (const Error& e) {
          stream->set_error(e.what());
          stream->push({i, -1, 0, {}, true, "error", -1});
          --in_flight_;
        }
      }
    }
    // Jobs after the requests submitted before them are in the engine (an adapter's unload sees them).
    for (auto& job : jobs) {
      std::lock_guard<std::mutex> step_lock(step_mu_);
      job();  // a packaged task: an exception goes to its waiter
    }
    jobs.clear();
    for (auto& [stream, which] : cancels)
      for (int64_t id : stream->ids_) {
        auto it = live_.find(id);
        if (it == live_.end()) continue;
        const int index = it->second.second;
        if (which >= 0 && which != index) continue;
        if (engine_->cancel(id)) {
          stream->push({index, -1, 0, {}, true, "cancelled", -1});
          finish_choice(id, "cancelled");
        }
      }
    if (engine_->has_work()) {
      std::lock_guard<std::mutex> step_lock(step_mu_);
      std::vector<StepOutput> outs;
      try {
        outs = engine_->step();
      } catch (const std::exception& e) {
        // A failed step (a bug, not bad input: inputs are checked on submit) must not take the
        // server down: fail the requests in flight and carry on.
        log_error("engine step failed: ", e.what(), "; cancelling ", live_.size(), " requests");
        std::vector<int64_t> ids;
        for (auto& [id, sc] : live_) ids.push_back(id);
        for (int64_t id : ids) {
          auto [stream, index] = live_[id];
          engine_->cancel(id);
          stream->set_error(e.what());
          stream->push({index, -1, 0, {}, true, "error", -1});
          finish_choice(id, "error");
        }
      }
      int64_t gen = 0;
      for (const StepOutput& o : outs) {
        auto it = live_.find(o.id);
        if (it == live_.end()) continue;
        auto stream = it->second.first;
        const int index = it->second.second;
        if (o.token >= 0) ++gen;
        stream->push({index, o.token, o.logprob, o.top_logprobs, o.finished, o.finish_reason, o.cached_tokens});
        if (o.finished) finish_choice(o.id, o.finish_reason);
      }
      std::lock_guard<std::mutex> lock(metrics_.mu);
      metrics_.generation_tokens += gen;
    }
    const EngineStats& st = engine_->stats();
    std::lock_guard<std::mutex> lock(metrics_.mu);
    metrics_.requests_running = static_cast<double>(engine_->scheduler().n_running());
    metrics_.requests_waiting = static_cast<double>(engine_->scheduler().n_waiting());
    metrics_.kv_usage = engine_->kv_usage();
    metrics_.kv_blocks_total = engine_->pool().n_blocks();
    metrics_.kv_blocks_free = engine_->blocks().n_available();
    metrics_.preemptions = st.preemptions;
    metrics_.prefix_waits = st.prefix_waits;
    metrics_.spec_drafts = st.speculative.drafts;
    metrics_.spec_draft_tokens = st.speculative.draft_tokens;
    metrics_.spec_accepted_tokens = st.speculative.accepted_tokens;
    metrics_.prefix_hit_rate =
        st.prompt_tokens ? static_cast<double>(st.cached_prompt_tokens) / static_cast<double>(st.prompt_tokens) : 0.0;
  }
  // Shutting down: everything still in flight is cancelled, so every waiting client returns.
  std::vector<int64_t> ids;
  for (auto& [id, sc] : live_) ids.push_back(id);
  for (int64_t id : ids) {
    auto [stream, index] = live_[id];
    engine_->cancel(id);
    stream->push({index, -1, 0, {}, true, "cancelled", -1});
    finish_choice(id, "cancelled");
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& stream : pending_)
    for (int i = 0; i < stream->n_; ++i) stream->push({i, -1, 0, {}, true, "cancelled", -1});
  pending_.clear();
  pending_reqs_.clear();
  for (auto& job : jobs_) job();  // waiters get an answer (the engine is idle now)
  jobs_.clear();
}

}  // namespace fp
