// server/metrics.cpp — histogram buckets and the Prometheus exposition text.
#include "server/metrics.h"

#include <sstream>

namespace fp {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  std::ostringstream os;
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    os << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cum << "\n";
  }
  cum += counts_.back();
  os << name << "_bucket{le=\"+Inf\"} " << cum << "\n" << name << "_sum " << sum_ << "\n" << name << "_count " << count_ << "\n";
  out += os.str();
}

std::string Metrics::text() {
  std::lock_guard<std::mutex> lock(mu);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    std::ostringstream os;
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
    out += os.str();
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    std::ostringstream os;
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
    out += os.str();
  };
  gauge("fastpath:num_requests_running", "Number of requests in the running batch.", requests_running);
  gauge("fastpath:num_requests_waiting", "Number of requests waiting to be scheduled.", requests_waiting);
  gauge("fastpath:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", kv_usage);
  gauge("fastpath:kv_cache_blocks_total", "KV-cache blocks in the pool.", static_cast<double>(kv_blocks_total));
  gauge("fastpath:kv_cache_blocks_free", "KV-cache blocks free or held only by the prefix cache.", static_cast<double>(kv_blocks_free));
  gauge("fastpath:prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens.", prefix_hit_rate);
  counter("fastpath:prompt_tokens_total", "Prompt tokens received.", prompt_tokens);
  counter("fastpath:generation_tokens_total", "Tokens generated.", generation_tokens);
  counter("fastpath:num_preemptions_total", "Sequences preempted for lack of KV blocks.", preemptions);
  counter("fastpath:num_prefix_waits_total", "Admissions put off until a prompt prefix being computed is cached.", prefix_waits);
  counter("fastpath:spec_decode_num_drafts_total", "Speculative drafts verified (one per sequence and step).", spec_drafts);
  counter("fastpath:spec_decode_num_draft_tokens_total", "Tokens drafted by prompt lookup.", spec_draft_tokens);
  counter("fastpath:spec_decode_num_accepted_tokens_total", "Drafted tokens the model kept.", spec_accepted_tokens);
  out += "# HELP fastpath:request_success_total Finished requests by finish reason.\n# TYPE fastpath:request_success_total counter\n";
  out += "fastpath:request_success_total{finished_reason=\"stop\"} " + std::to_string(success_stop) + "\n";
  out += "fastpath:request_success_total{finished_reason=\"length\"} " + std::to_string(success_length) + "\n";
  counter("fastpath:request_cancelled_total", "Requests cancelled (client gone or stop string matched early).", cancelled);
  counter("fastpath:request_rejected_total", "Requests refused with a 4xx.", rejected);
  counter("fastpath:embedding_requests_total", "Embedding requests served.", embedding_requests);
  counter("fastpath:embedding_tokens_total", "Tokens embedded.", embedding_tokens);
  if (!lora_requests.empty()) {
    out += "# HELP fastpath:lora_requests_total Completion requests by the LoRA adapter they ran with.\n"
           "# TYPE fastpath:lora_requests_total counter\n";
    for (const auto& [name, n] : lora_requests)  // names: --lora's or the load route's (no quote or newline)
      out += "fastpath:lora_requests_total{lora_name=\"" + name + "\"} " + std::to_string(n) + "\n";
  }
  ttft.write(out, "fastpath:time_to_first_token_seconds", "Time to first token.");
  tpot.write(out, "fastpath:time_per_output_token_seconds", "Time per output token after the first.");
  e2e.write(out, "fastpath:e2e_request_latency_seconds", "End-to-end request latency.");
  return out;
}

}  // namespace fp
