// tools/cmd_bench.cpp — `fastpath bench`: prefill and decode tokens/s with warm-up and
// repetitions (median and spread), each shown against this machine's roofline:
// decode = read bandwidth / weight bytes touched per token; prefill = peak FMA / FLOPs per token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/cpu_affinity.h"
#include "core/error.h"
#include "core/cpu_features.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/ledger.h"
#include "kernels/timed_choice.h"
#include "engine/engine.h"
#include "engine/followers.h"
#include "parallel/collectives.h"
#include "tools/common.h"
#include "tools/engine_options.h"

namespace fp::tools {
namespace {

// With --profile: the ledger's per-kernel calls and times of everything the benchmark ran, on
// stderr (stdout stays the table or the JSON).
void print_profile() {
  if (Ledger::global().profiling()) std::fprintf(stderr, "%s", Ledger::global().table().c_str());
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return s;
}

// What one token costs: bytes of weights a decode step reads, and matmul FLOPs. For an MoE
// model a token reads only its n_used of the n_experts routed experts of each layer (shared
// experts and everything else in full), so the routed experts' bytes count at that fraction.
struct ModelCost {
  double dense_bytes = 0;             // every non-expert matrix once + one embedding row
  double expert_bytes = 0;            // all routed experts' matrices
  double expert_fraction = 1;         // n_used / n_experts (1 for a dense model)
  double matmul_flops_per_token = 0;  // 2 x parameters of every matrix the token passes through
  double output_flops = 0;            // of which the output projection's (logits of one row)
  // Per prompt token of a prefill that computes the logits of its last row only.
  double prefill_matmul_flops_per_token(double prompt) const {
    return matmul_flops_per_token - output_flops + output_flops / std::max(prompt, 1.0);
  }
  double params = 0;
  bool integer_matmuls = false;       // most matrix bytes are integer-quantized: int8 dot rate applies
  bool bf16_matmuls = false;          // most matrix bytes are BF16 or F16: the BF16 dot rate applies where the CPU has it
  std::string weight_types;

  double weight_bytes_per_token() const { return dense_bytes + expert_bytes * expert_fraction; }
  // A step of `batch` tokens with independent routing touches 1 - (1 - k/E)^batch of the experts
  // on average (uniform routing).
  double weight_bytes_per_step(int batch) const {
    return dense_bytes + expert_bytes * (1.0 - std::pow(1.0 - expert_fraction, batch));
  }
};

ModelCost model_cost(const Model& m) {
  ModelCost c;
  const ModelConfig& cfg = m.config();
  if (cfg.moe.n_experts > 0) c.expert_fraction = static_cast<double>(cfg.moe.n_used) / static_cast<double>(cfg.moe.n_experts);
  std::map<std::string, int64_t> bytes_by_type;
  int64_t int_bytes = 0, bf16_bytes = 0, matrix_bytes = 0;
  for (auto& [name, t] : m.file().tensors) {
    c.params += static_cast<double>(t.numel());
    const bool embedding = name == "token_embd.weight";
    const bool expert = name.find("_exps") != std::string::npos;
    if (embedding) c.dense_bytes += static_cast<double>(t.nbytes()) / static_cast<double>(t.rows());
    if (!embedding || cfg.tied_output) {
      (expert ? c.expert_bytes : c.dense_bytes) += static_cast<double>(t.nbytes());
      if (t.ndim >= 2) c.matmul_flops_per_token += 2.0 * static_cast<double>(t.numel()) * (expert ? c.expert_fraction : 1.0);
      if (name == "output.weight" || embedding) c.output_flops = 2.0 * static_cast<double>(t.numel());
    }
    if (t.ndim >= 2) {
      bytes_by_type[dtype_name(t.dtype)] += t.nbytes();
      matrix_bytes += t.nbytes();
      if (dtype_info(t.dtype).quantized) int_bytes += t.nbytes();
      if (t.dtype == DType::BF16 || t.dtype == DType::F16) bf16_bytes += t.nbytes();  // F16 prefill: BF16 kernels too
    }
  }
  c.integer_matmuls = 2 * int_bytes > matrix_bytes;
  c.bf16_matmuls = 2 * bf16_bytes > matrix_bytes;
  for (auto& [ty, b] : bytes_by_type) c.weight_types += (c.weight_types.empty() ? "" : " ") + ty + ":" + std::to_string(b >> 20) + "MiB";
  return c;
}

// Attention FLOPs for one token at context `ctx` (QK^T and PV).
double attention_flops(const ModelConfig& c, double ctx) {
  return 2.0 * 2.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim) * ctx;
}
// KV bytes one decode step reads at context ctx: the model's own cache layout (GQA K and V, or
// MLA's latent row) in the cache's dtype.
double kv_bytes(const KvLayout& kv, double ctx) { return static_cast<double>(kv.bytes_per_token()) * ctx; }

// `batch` sequences of up to gen + 1 positions, each with its own block table in one pool.
struct DecodeSequences {
  KvPool pool;
  std::vector<std::vector<int32_t>> tables;
  DecodeSequences(const KvLayout& kv, const Model& model, int batch, int gen)
      : pool(kv, kPage, pages(gen) * batch, model.device()), tables(static_cast<size_t>(batch)) {
    for (auto& t : tables)
      for (int64_t p = 0; p < pages(gen); ++p) t.push_back(pool.blocks().allocate());
  }
  static constexpr int64_t kPage = 16;
  static int64_t pages(int gen) { return (gen + 1 + kPage - 1) / kPage; }
};

// Decode tokens/s for `batch` sequences stepping together (one token each per forward), each
// with its own block table in one pool: the weights are read once per step for all of them.
// Greedy steps as the engine runs them (Model::forward_sampled): on a device only the sampled
// ids come back, not batch x n_vocab logits.
double batched_decode_tps(Model& model, const KvLayout& kv, int batch, int gen, std::mt19937& rng) {
  const ModelConfig& cfg = model.config();
  DecodeSequences seqs(kv, model, batch, gen);  // beside the weights
  KvPool& pool = seqs.pool;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.n_vocab - 1));
  std::vector<float> logits(static_cast<size_t>(batch * cfg.n_vocab));
  const std::vector<RowSampling> greedy(static_cast<size_t>(batch), RowSampling{true, SampleRow{}});
  std::vector<int32_t> ids(static_cast<size_t>(batch));
  ForwardBatch fb;
  auto step = [&](int pos) {
    fb.clear();
    for (auto& t : seqs.tables) {
      int32_t id = tok(rng);
      fb.add_sequence(&id, 1, pos, t.data(), static_cast<int64_t>(t.size()), true);
      fb.seq_lora.back() = model.n_loras() > 0 ? 1 : 0;  // --lora: every sequence runs with it
    }
    model.forward_sampled(fb, pool, logits.data(), greedy, ids.data());
  };
  step(0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= gen; ++i) step(i);
  return static_cast<double>(batch) * gen / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Decode of `batch` sequences as the engine runs it with async scheduling: each step is
// launched before the one before it has finished, its tokens fed on the device from the ids that
// step samples (greedy), so the host's work between steps overlaps the device's (on the CPU the
// steps run one after another as before). Tokens per second over `gen` steps.
double overlapped_decode_tps(Model& model, const KvLayout& kv, int batch, int gen, std::mt19937& rng) {
  const ModelConfig& cfg = model.config();
  DecodeSequences seqs(kv, model, batch, gen);
  KvPool& pool = seqs.pool;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.n_vocab - 1));
  const std::vector<RowSampling> greedy(static_cast<size_t>(batch), RowSampling{true, SampleRow{}});
  std::vector<int32_t> ids(static_cast<size_t>(batch));
  ForwardBatch fb;
  auto launch = [&](int pos) {
    fb.clear();
    for (auto& t : seqs.tables) {
      int32_t id = pos == 0 ? tok(rng) : 0;
      fb.add_sequence(&id, 1, pos, t.data(), static_cast<int64_t>(t.size()), true);
      fb.seq_lora.back() = model.n_loras() > 0 ? 1 : 0;  // --lora: every sequence runs with it
    }
    if (pos > 0) {  // each sequence's token: the id its row of the step before samples
      fb.feed_rows.resize(static_cast<size_t>(batch));
      for (int r = 0; r < batch; ++r) fb.feed_rows[static_cast<size_t>(r)] = r;
    }
    model.launch_step(fb, pool, greedy);
  };
  launch(0);
  model.finish_step(ids.data());
  const auto t0 = std::chrono::steady_clock::now();
  launch(1);
  for (int i = 2; i <= gen; ++i) {
    launch(i);
    model.finish_step(ids.data());  // step i-1's ids
  }
  model.finish_step(ids.data());
  return static_cast<double>(batch) * gen / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

struct ServingResult {
  int concurrency = 0;
  double seconds = 0, input_tps = 0, output_tps = 0, total_tps = 0, hit_rate = 0;
  double ttft_median_ms = 0, ttft_p95_ms = 0, tpot_median_ms = 0;
  // --high-priority-every: the TTFT of the high-priority requests and of the others apart.
  double ttft_high_median_ms = 0, ttft_high_p95_ms = 0, ttft_low_median_ms = 0, ttft_low_p95_ms = 0;
  int64_t priority_preemptions = 0, priority_reclaimed_chunks = 0;
  int64_t n_high = 0, n_low = 0;  // requests of each class
  int64_t prompt_tokens = 0;      // every request's prompt tokens (cached ones too)
  int64_t preemptions = 0, steps = 0, steps_ahead = 0;
  bool prefix_caching = false;  // as the engine ran
  bool async_scheduling = false;
  SpeculativeStats speculative;
};

// A closed loop: `concurrency` requests in flight, a new one submitted as each finishes. With
// high_every = K > 0 every K-th request has priority 0 and the others 1 (what the engine does with
// that depends on its --scheduling-policy), its prompt high_input_len tokens long (0: input_len).
ServingResult serving_run(Model& model, const EngineConfig& ecfg, int requests, int input_len, int output_len,
                          int concurrency, int shared_prefix, int high_every, int high_input_len, std::mt19937& rng) {
  const ModelConfig& cfg = model.config();
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.n_vocab - 1));
  std::vector<int32_t> prefix(static_cast<size_t>(shared_prefix));
  for (auto& t : prefix) t = tok(rng);
  auto is_high = [&](size_t i) { return high_every > 0 && i % static_cast<size_t>(high_every) == static_cast<size_t>(high_every - 1); };
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(requests));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t>& p = prompts[i];
    p = prefix;
    const int len = is_high(i) && high_input_len > 0 ? high_input_len : input_len;
    while (static_cast<int>(p.size()) < len) p.push_back(tok(rng));
  }
  Engine engine(model, ecfg);
  log_info(engine.capacity().describe());
  int submitted = 0, in_flight = 0;
  std::vector<int64_t> ids;
  auto submit = [&] {
    Request r;
    r.priority = is_high(static_cast<size_t>(submitted)) ? 0 : 1;
    r.lora = model.n_loras() > 0 ? 1 + submitted % model.n_loras() : 0;  // --lora: cycling through the adapters
    r.prompt = prompts[static_cast<size_t>(submitted++)];
    r.max_new_tokens = output_len;
    r.stop_at_eog = false;
    r.sampling.temperature = 0;
    ids.push_back(engine.add_request(r));
    ++in_flight;
  };
  auto t0 = std::chrono::steady_clock::now();
  while (submitted < requests && in_flight < concurrency) submit();
  while (engine.has_work()) {
    for (const StepOutput& o : engine.step())
      if (o.finished) {
        --in_flight;
        if (submitted < requests) submit();
      }
  }
  ServingResult r;
  r.concurrency = concurrency;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats& st = engine.stats();
  r.input_tps = static_cast<double>(st.prompt_tokens) / r.seconds;
  r.prompt_tokens = st.prompt_tokens;
  r.output_tps = static_cast<double>(st.generated_tokens) / r.seconds;
  r.total_tps = r.input_tps + r.output_tps;
  r.hit_rate = st.prompt_tokens ? static_cast<double>(st.cached_prompt_tokens) / static_cast<double>(st.prompt_tokens) : 0;
  r.preemptions = st.preemptions;
  r.steps = st.steps;
  r.steps_ahead = st.steps_ahead;
  r.prefix_caching = engine.config().prefix_caching;
  r.async_scheduling = engine.async_scheduling();
  r.speculative = st.speculative;
  r.priority_preemptions = st.priority_preemptions;
  r.priority_reclaimed_chunks = st.priority_reclaimed_chunks;
  std::vector<double> ttft, tpot, ttft_class[2];
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence* s = engine.sequence(ids[i]);
    ttft.push_back((s->t_first_token - s->t_arrival) * 1e3);
    ttft_class[is_high(i) ? 0 : 1].push_back(ttft.back());
    if (s->n_generated() > 1) tpot.push_back((s->t_last_token - s->t_first_token) * 1e3 / static_cast<double>(s->n_generated() - 1));
  }
  r.ttft_median_ms = percentile(ttft, 50);
  r.ttft_p95_ms = percentile(ttft, 95);
  r.tpot_median_ms = percentile(tpot, 50);
  r.n_high = static_cast<int64_t>(ttft_class[0].size());
  r.n_low = static_cast<int64_t>(ttft_class[1].size());
  r.ttft_high_median_ms = percentile(ttft_class[0], 50);
  r.ttft_high_p95_ms = percentile(ttft_class[0], 95);
  r.ttft_low_median_ms = percentile(ttft_class[1], 50);
  r.ttft_low_p95_ms = percentile(ttft_class[1], 95);
  return r;
}

}  // namespace

template <class Opts>
void run_serving_bench(Model& model, const Opts& o) {
  EngineConfig ecfg = engine_config(o.engine, model);
  const int longest = std::max(o.input_len, o.high_priority_input_len);
  if (ecfg.max_model_len <= 0) ecfg.max_model_len = std::min<int64_t>(model.config().max_context, longest + o.output_len);
  FP_CHECK(o.shared_prefix <= o.input_len, "--shared-prefix-len ", o.shared_prefix, " exceeds --input-len ", o.input_len);
  FP_CHECK(o.high_priority_input_len == 0 || o.high_priority_every > 0, "--high-priority-input-len needs --high-priority-every");
  FP_CHECK(o.high_priority_input_len == 0 || o.shared_prefix <= o.high_priority_input_len, "--shared-prefix-len ", o.shared_prefix,
           " exceeds --high-priority-input-len ", o.high_priority_input_len);
  std::mt19937 rng(1234);
  nlohmann::json j;
  j["model"] = model.file().path;
  j["requests"] = o.requests;
  j["input_len"] = o.input_len;
  j["output_len"] = o.output_len;
  j["shared_prefix_len"] = o.shared_prefix;
  j["high_priority_every"] = o.high_priority_every;
  j["high_priority_input_len"] = o.high_priority_input_len > 0 ? o.high_priority_input_len : o.input_len;
  j["scheduling_policy"] = ecfg.scheduler.policy == SchedulingPolicy::Priority ? "priority" : "fcfs";
  j["threads"] = thread_pool().size();
  std::vector<ServingResult> results;
  for (int c : o.concurrency) {
    std::mt19937 run_rng(rng());
    results.push_back(
        serving_run(model, ecfg, o.requests, o.input_len, o.output_len, c, o.shared_prefix, o.high_priority_every,
                    o.high_priority_input_len, run_rng));
    const ServingResult& r = results.back();
    j["runs"].push_back({{"concurrency", c}, {"seconds", r.seconds}, {"input_tps", r.input_tps}, {"output_tps", r.output_tps},
                         {"total_tps", r.total_tps}, {"prefix_hit_rate", r.hit_rate}, {"ttft_median_ms", r.ttft_median_ms},
                         {"ttft_p95_ms", r.ttft_p95_ms}, {"tpot_median_ms", r.tpot_median_ms}, {"prompt_tokens", r.prompt_tokens},
                         {"preemptions", r.preemptions},
                         {"steps", r.steps}, {"steps_ahead", r.steps_ahead}});
    if (o.high_priority_every > 0)
      j["runs"].back()["priority"] = {{"high_requests", r.n_high}, {"low_requests", r.n_low},
                                      {"ttft_high_median_ms", r.ttft_high_median_ms}, {"ttft_high_p95_ms", r.ttft_high_p95_ms},
                                      {"ttft_low_median_ms", r.ttft_low_median_ms}, {"ttft_low_p95_ms", r.ttft_low_p95_ms},
                                      {"priority_preemptions", r.priority_preemptions},
                                      {"reclaimed_chunks", r.priority_reclaimed_chunks}};
    if (ecfg.speculative.enabled())
      j["runs"].back()["speculative"] = {{"drafts", r.speculative.drafts},
                                         {"draft_tokens", r.speculative.draft_tokens},
                                         {"accepted_tokens", r.speculative.accepted_tokens}};
  }
  const bool prefix_caching = results.empty() ? ecfg.prefix_caching : results.front().prefix_caching;
  j["prefix_caching"] = prefix_caching;
  j["async_scheduling"] = !results.empty() && results.front().async_scheduling;
  log_info(Ledger::global().summary_line());
  print_profile();
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("model    %s; %d requests of %d in / %d out, shared prefix %d, prefix caching %s, async scheduling %s\n",
              model.file().path.c_str(), o.requests, o.input_len, o.output_len, o.shared_prefix, prefix_caching ? "on" : "off",
              !results.empty() && results.front().async_scheduling ? "on" : "off");
  std::printf("%11s %9s %11s %11s %11s %9s %12s %12s %12s %8s\n", "concurrency", "seconds", "input t/s", "output t/s",
              "total t/s", "hit rate", "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "preempt");
  for (const ServingResult& r : results)
    std::printf("%11d %9.2f %11.2f %11.2f %11.2f %8.1f%% %12.1f %12.1f %12.1f %8lld\n", r.concurrency, r.seconds, r.input_tps,
                r.output_tps, r.total_tps, 100 * r.hit_rate, r.ttft_median_ms, r.ttft_p95_ms, r.tpot_median_ms,
                static_cast<long long>(r.preemptions));
  if (o.high_priority_every > 0) {
    std::printf("every %d-th request priority 0 (%d tokens in), the others 1; scheduling policy %s\n", o.high_priority_every,
                o.high_priority_input_len > 0 ? o.high_priority_input_len : o.input_len,
                ecfg.scheduler.policy == SchedulingPolicy::Priority ? "priority" : "fcfs (priorities ignored)");
    std::printf("%11s %8s %14s %14s %8s %14s %14s %9s %9s\n", "concurrency", "hi reqs", "TTFT hi p50", "TTFT hi p95", "lo reqs",
                "TTFT lo p50", "TTFT lo p95", "preempt", "reclaim");
    auto ms = [](int64_t count, double v) { return count > 0 ? std::to_string(static_cast<long long>(std::llround(v))) : std::string("-"); };
    for (const ServingResult& r : results)
      std::printf("%11d %8lld %14s %14s %8lld %14s %14s %9lld %9lld\n", r.concurrency, static_cast<long long>(r.n_high),
                  ms(r.n_high, r.ttft_high_median_ms).c_str(), ms(r.n_high, r.ttft_high_p95_ms).c_str(),
                  static_cast<long long>(r.n_low), ms(r.n_low, r.ttft_low_median_ms).c_str(), ms(r.n_low, r.ttft_low_p95_ms).c_str(),
                  static_cast<long long>(r.priority_preemptions), static_cast<long long>(r.priority_reclaimed_chunks));
  }
  if (ecfg.speculative.enabled()) {
    std::printf("%s\n", ecfg.speculative.describe().c_str());
    for (const ServingResult& r : results)
      std::printf("concurrency %d: %s; %lld steps\n", r.concurrency, r.speculative.describe().c_str(),
                  static_cast<long long>(r.steps));
  }
}

void add_bench(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    int prompt = 512, gen = 128, reps = 3, warmup = 1;
    std::vector<int> batch;
    bool json = false, recalibrate = false, gemv_rates = false;
    int requests = 0, input_len = 256, output_len = 128, shared_prefix = 0, high_priority_every = 0, high_priority_input_len = 0;
    std::vector<int> concurrency{1};
    EngineOptions engine;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "measure prefill and decode tokens/s against this machine's ceiling");
  add_common(cmd, o->common, false);
  add_lora_cycle_option(cmd, o->common);
  cmd->add_option("-p,--n-prompt", o->prompt, "prompt tokens for the prefill test (0 skips it)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", o->gen, "tokens for the decode test (0 skips it)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-b,--batch", o->batch, "decode batch sizes besides 1 (sequences decoding together, e.g. -b 4,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--requests", o->requests, "serving benchmark: this many requests through the engine (instead of -p/-n)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--input-len", o->input_len, "serving benchmark: prompt tokens per request")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", o->output_len, "serving benchmark: generated tokens per request")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--concurrency", o->concurrency, "serving benchmark: requests in flight (several: 1,4,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--shared-prefix-len", o->shared_prefix, "serving benchmark: leading prompt tokens all requests share")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--high-priority-every", o->high_priority_every,
                  "serving benchmark: every K-th request has priority 0, the others 1; TTFT reported per class "
                  "(with --scheduling-policy priority the engine acts on it)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--high-priority-input-len", o->high_priority_input_len,
                  "serving benchmark: the high-priority requests' prompt tokens (default --input-len): short urgent "
                  "requests among long ones")
      ->check(CLI::Range(1, 1 << 20));
  add_engine_options(cmd, o->engine);
  cmd->add_option("-r,--reps", o->reps, "timed repetitions (median reported)")->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", o->warmup, "untimed warm-up runs")->check(CLI::Range(0, 100));
  cmd->add_flag("--json", o->json, "one JSON object on stdout");
  cmd->add_flag("--gemv-rates", o->gemv_rates,
                "on a GPU, also time the decode GEMVs alone at the Llama-3-8B shapes (about 10 s)");
  cmd->add_flag("--recalibrate", o->recalibrate,
                "measure the machine's ceilings again instead of using the cache, and time the timed kernel choices again");
  cmd->callback([o] {
    if (o->recalibrate) forget_timed_choices();
    o->common.mtp = o->engine.speculative.mtp();
    auto model = load_with(o->common, o->engine.max_model_len);
    if (o->requests > 0) {
      // Several ranks: rank 0 runs the engine, the others follow its steps.
      if (!is_output_rank()) return follow_engines(*model);
      run_serving_bench(*model, *o);
      release_followers(*model);
      return;
    }
    const ModelConfig& cfg = model->config();
    const int threads = thread_pool().size();
    const bool on_device = model->device() != Device::CPU;
    MachineCeiling ceil;
    DeviceCeilings dc;
    if (on_device) {
      // The GPU's ceilings, measured now: copy bandwidth for decode, the BF16 matrix rate for
      // prefill (float and quantized weights alike run BF16/F16 tensor-core products there).
      dc = device_memory(model->device()).measure_ceilings();
      if (o->gemv_rates && device_memory(model->device()).measure_gemv_rates)
        device_memory(model->device()).measure_gemv_rates(dc);
      ceil.cpu = dc.name;
      ceil.read_gbps = dc.copy_gbps;
      ceil.fma_gflops = ceil.int8_gops = dc.bf16_gflops;
      ceil.threads = 0;
    }
    // Split across ranks, the ceiling is the ranks' together, each weight byte counted once
    // (layouts that replicate weights, such as EP's attention, read more: their fraction is
    // understated). Ranks on one machine: rank 0 measures the machine with every rank's threads
    // while the others sleep in broadcast_idle (not spinning on a core), then tells them. Ranks
    // on several machines: each measures its own share at the same time and the figures add up.
    Communicator* ranks = model->tp_size() > 1 && !on_device ? model->tensor_parallel() : nullptr;
    const bool one_machine = ranks && launched_local_size() == ranks->size();
    auto sum_over_ranks = [&](double v) {
      float f = static_cast<float>(v);
      dispatch(AllReduceArgs{ranks, &f, 1});
      return static_cast<double>(f);
    };
    // The CPUs the ranks may run on, together. A launcher may bind each rank to its own core
    // (mpirun does when it starts two ranks or fewer): rank 0's threads alone on its core would
    // measure one core, so it measures on every rank's CPUs.
    CpuSet cpus = thread_cpus();
    if (one_machine) {
      std::vector<CpuSet> each(static_cast<size_t>(ranks->size()));
      const CpuSet mine = cpus;
      dispatch(AllGatherArgs{ranks, &mine, each.data(), static_cast<int64_t>(sizeof(CpuSet))});
      for (const CpuSet& c : each) cpus |= c;
    } else if (ranks) {
      cpus = CpuSet{};  // only the count adds up across machines
    }
    int ceiling_cpus = ranks && !one_machine ? static_cast<int>(sum_over_ranks(thread_cpus().count())) : cpus.count();
    auto on_rank0 = [&](auto measure) {  // measure() with every rank's threads on rank 0; its result everywhere
      decltype(measure()) v{};
      if (ranks->rank() == 0) {
        const CpuSet own = thread_cpus();
        const bool widened = !(cpus == own) && set_thread_cpus(cpus);  // the pool's new threads inherit it
        if (!(cpus == own) && !widened) {
          log_warn("ceiling: rank 0 may not run on the ranks' CPUs (", cpus.text(), "); measured on its own (", own.text(),
                   ")");
          ceiling_cpus = own.count();
        }
        set_num_threads(threads * ranks->size());
        v = measure();
        if (widened) set_thread_cpus(own);
        set_num_threads(threads);
      }
      ranks->broadcast_idle(&v, sizeof v, 0);
      return v;
    };
    auto read_gbps_now = [&]() -> double {
      if (on_device) return 0.0;
      if (!ranks) return measure_read_bandwidth_now();
      if (one_machine) return on_rank0([] { return measure_read_bandwidth_now(); });
      return sum_over_ranks(measure_read_bandwidth_now());
    };
    if (!on_device) {
      if (one_machine) {
        struct Figures {
          double read, fma, int8, bf16;
          bool cached, bf16_amx;
        };
        const Figures f = on_rank0([&] {
          const MachineCeiling m = machine_ceiling(threads * ranks->size(), o->recalibrate);
          return Figures{m.read_gbps, m.fma_gflops, m.int8_gops, m.bf16_gflops, m.cached,
                         m.bf16_path.find("AMX") != std::string::npos};
        });
        ceil.cached = f.cached;
        ceil.cpu = cpu_features().brand.empty() ? "unknown CPU" : cpu_features().brand;
        ceil.read_gbps = f.read;
        ceil.fma_gflops = f.fma;
        ceil.int8_gops = f.int8;
        ceil.bf16_gflops = f.bf16;
        ceil.bf16_path = f.bf16_amx ? "tdpbf16ps (AMX)" : "vdpbf16ps";
        ceil.threads = threads * ranks->size();
      } else {
        ceil = machine_ceiling(threads, o->recalibrate);
        set_num_threads(threads);
        if (ranks) {
          ceil.threads = static_cast<int>(sum_over_ranks(threads));
          ceil.fma_gflops = sum_over_ranks(ceil.fma_gflops);
          ceil.int8_gops = sum_over_ranks(ceil.int8_gops);
          ceil.bf16_gflops = sum_over_ranks(ceil.bf16_gflops);
          ceil.read_gbps = sum_over_ranks(measure_read_bandwidth_now());
          ceil.cached = false;
        }
      }
    }
    const std::string machine =
        on_device ? ceil.cpu + ": device copy " + std::to_string(static_cast<int>(ceil.read_gbps)) + " GB/s, BF16 cuBLAS " +
                        std::to_string(static_cast<int>(ceil.fma_gflops)) + " GFLOP/s (measured now)"
                  : ceil.describe();
    log_info("ceiling: ", machine);
    ModelCost cost = model_cost(*model);
    // The compute roofline: integer-quantized matmuls run int8 dot products, or BF16 ones where
    // the CPU's BF16 path is faster (AMX: the amxbf16 kernel takes quantized prefill), BF16
    // matmuls BF16 dot products where the CPU has them (avx512bf16, amxbf16), other float ones
    // FMAs; attention is float.
    const bool bf16_rate = !on_device && ceil.bf16_gflops > 0 &&
                           (cost.integer_matmuls ? ceil.bf16_gflops > ceil.int8_gops : cost.bf16_matmuls);
    const double matmul_rate = (bf16_rate ? ceil.bf16_gflops : cost.integer_matmuls ? ceil.int8_gops : ceil.fma_gflops) * 1e9;
    const std::string rate_name = on_device ? "bf16 cuBLAS"
                                  : bf16_rate ? (ceil.bf16_path.find("AMX") != std::string::npos ? "bf16 AMX" : "bf16 dot")
                                  : cost.integer_matmuls ? "int8 dot"
                                                         : "f32 FMA";
    auto compute_seconds = [&](double matmul_flops, double attn_flops) {
      return matmul_flops / matmul_rate + attn_flops / (ceil.fma_gflops * 1e9);
    };
    KvLayout kv = model->kv_layout();
    kv.dtype = kv_cache_dtype(o->engine.kv_cache_dtype, *model);
    FP_CHECK(o->prompt + o->gen + 1 <= cfg.max_context || cfg.max_context <= 0, "bench: -p ", o->prompt, " + -n ", o->gen,
             " exceeds the model's context of ", cfg.max_context);
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.n_vocab - 1));
    std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
    using Clock = std::chrono::steady_clock;

    nlohmann::json j;
    j["model"] = model->file().path;
    j["arch"] = cfg.arch;
    j["params"] = cost.params;
    j["weight_types"] = cost.weight_types;
    j["decode_weight_bytes_per_token"] = cost.weight_bytes_per_token();
    j["threads"] = threads;
    j["device"] = device_name(model->device());
    j["kv_dtype"] = dtype_name(kv.dtype);
    j["ranks"] = model->tp_size();  // ceilings are the ranks' together (see above)
    j["tensor_parallel_size"] = model->parallel().tp;
    j["expert_parallel_size"] = model->parallel().ep;
    j["ceiling"] = {{"read_gbps", ceil.read_gbps}, {"fma_gflops", ceil.fma_gflops}, {"int8_gops", ceil.int8_gops},
                    {"bf16_gflops", ceil.bf16_gflops}, {"cpu", ceil.cpu}, {"cpus", on_device ? 0 : ceiling_cpus}};
    if (on_device) j["chained_launches"] = dc.chained_launches;  // FASTPATH_CUDA_PDL=1 took effect (pdl.cuh)
    if (on_device)  // the engine's matmul at 8192^3 on BF16 and FP8 block-scaled weights (ceiling.cu)
      j["device_gemm"] = {{"bf16_gflops", dc.gemm_bf16_gflops},
                          {"fp8_block_gflops", dc.gemm_fp8_gflops},
                          {"fp8_dequant_gflops", dc.gemm_fp8_dequant_gflops},
                          {"lt_fp8_first_gflops", dc.lt_fp8_first_gflops},
                          {"lt_fp8_chosen_gflops", dc.lt_fp8_chosen_gflops},
                          {"lt_fp8_candidates", dc.lt_fp8_candidates}};
    if (on_device && !dc.gemv_rates.empty()) {  // the decode GEMVs alone (ceiling.cu)
      nlohmann::json rates = nlohmann::json::array();
      for (const auto& r : dc.gemv_rates)
        rates.push_back({{"out", r.out},
                         {"in", r.in},
                         {"gemv_gbps", r.gemv_gbps},
                         {"gemv_warp_gbps", r.gemv_warp_gbps},
                         {"gemv_chained_gbps", r.gemv_chained_gbps},
                         {"gemv_warp_chained_gbps", r.gemv_warp_chained_gbps}});
      j["device_gemv"] = rates;
    }

    if (o->prompt > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(o->prompt)), pos(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = tok(rng), pos[i] = static_cast<int32_t>(i);
      std::vector<double> tps;
      for (int r = 0; r < o->warmup + o->reps; ++r) {
        auto cache = model->new_cache(o->prompt, 0, kv.dtype);
        auto t0 = Clock::now();
        model->forward(ids.data(), pos.data(), o->prompt, *cache, logits.data(), false);
        double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= o->warmup) tps.push_back(o->prompt / sec);
      }
      Stats s = stats_of(tps);
      // The prefill computes the last row's logits only: the output projection counts once.
      const double matmul_flops = cost.prefill_matmul_flops_per_token(o->prompt);
      double flops = matmul_flops + attention_flops(cfg, o->prompt / 2.0);
      double ceiling_tps = 1.0 / compute_seconds(matmul_flops, attention_flops(cfg, o->prompt / 2.0));
      j["prefill_tps"] = s.median;
      j["prefill_tps_min"] = s.min;
      j["prefill_tps_max"] = s.max;
      j["prefill_gflops"] = s.median * flops / 1e9;
      j["prefill_ceiling_tps"] = ceiling_tps;
      j["prefill_ceiling_fraction"] = s.median / ceiling_tps;
    }
    if (o->gen > 0) {
      // Bandwidth is probed before every decode run and after the last: the ceiling is the
      // largest figure seen (the cached calibration included), and the median of the probes
      // beside the runs says what this machine gave while they ran (its neighbours move it).
      std::vector<double> tps, beside{read_gbps_now()};
      for (int r = 0; r < o->warmup + o->reps; ++r) {
        if (r > o->warmup) beside.push_back(read_gbps_now());
        // Each step samples greedily where the logits are (as generation and the batches below
        // do): on a GPU, one id comes back per step rather than the whole logit row.
        auto cache = model->new_cache(o->gen + 1, 0, kv.dtype);
        const RowSampling greedy{true, SampleRow{}};
        int32_t id = tok(rng), p = 0, next = 0;
        model->forward_sampled(&id, &p, 1, *cache, logits.data(), greedy, &next);
        auto t0 = Clock::now();
        for (int i = 1; i <= o->gen; ++i) {
          id = tok(rng);
          p = i;
          model->forward_sampled(&id, &p, 1, *cache, logits.data(), greedy, &next);
        }
        double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= o->warmup) tps.push_back(o->gen / sec);
      }
      Stats s = stats_of(tps);
      beside.push_back(read_gbps_now());
      const Stats probes = stats_of(beside);
      double bw = std::max(ceil.read_gbps, probes.max);
      ceil.read_gbps = bw;
      j["ceiling"]["read_gbps"] = bw;
      double bytes = cost.weight_bytes_per_token() + kv_bytes(kv, o->gen / 2.0);
      double ceiling_tps = bw * 1e9 / bytes;
      j["decode_read_gbps_beside"] = probes.median;
      j["decode_beside_ceiling_tps"] = probes.median * 1e9 / bytes;
      j["decode_beside_fraction"] = probes.median > 0 ? s.median * bytes / 1e9 / probes.median : 0.0;
      j["decode_tps"] = s.median;
      j["decode_tps_min"] = s.min;
      j["decode_tps_max"] = s.max;
      j["decode_gbps"] = s.median * bytes / 1e9;
      j["decode_ceiling_tps"] = ceiling_tps;
      j["decode_ceiling_fraction"] = s.median / ceiling_tps;
      if (on_device) {  // the same steps overlapped with the host's work, as the engine runs them
        std::vector<double> otps;
        for (int r = 0; r < o->warmup + o->reps; ++r) {
          const double t = overlapped_decode_tps(*model, kv, 1, o->gen, rng);
          if (r >= o->warmup) otps.push_back(t);
        }
        const Stats os = stats_of(otps);
        j["decode_overlapped_tps"] = os.median;
        j["decode_overlapped_ceiling_fraction"] = os.median / ceiling_tps;
      }
    }
    for (int b : o->batch) {
      if (b == 1 || o->gen <= 0) continue;
      std::vector<double> tps;
      for (int r = 0; r < o->warmup + o->reps; ++r) {
        double t = batched_decode_tps(*model, kv, b, o->gen, rng);
        if (r >= o->warmup) tps.push_back(t);
      }
      Stats s = stats_of(tps);
      // Ceiling at batch b: the weights once per step plus each sequence's KV.
      double bytes_per_step = cost.weight_bytes_per_step(b) + b * kv_bytes(kv, o->gen / 2.0);
      double ceiling_tps = std::min(ceil.read_gbps * 1e9 / bytes_per_step * b,
                                    1.0 / compute_seconds(cost.matmul_flops_per_token, attention_flops(cfg, o->gen / 2.0)));
      nlohmann::json e{{"batch", b}, {"decode_tps", s.median}, {"decode_tps_min", s.min}, {"decode_tps_max", s.max},
                       {"decode_ceiling_tps", ceiling_tps}, {"decode_ceiling_fraction", s.median / ceiling_tps}};
      j["decode_batches"].push_back(e);
    }
    j["fallbacks"] = Ledger::global().fallbacks();
    log_info(Ledger::global().summary_line());
    print_profile();
    if (o->json) {
      std::cout << j.dump() << "\n";
      return;
    }
    std::printf("model    %s (%s, %.3g params; %s; KV cache %s, %lld B/token)\n", model->file().path.c_str(), cfg.arch.c_str(),
                cost.params, cost.weight_types.c_str(), dtype_name(kv.dtype), static_cast<long long>(kv.bytes_per_token()));
    std::printf("machine  %s\n", machine.c_str());
    if (on_device)
      std::printf("gemm     the matmul op at 8192^3: BF16 weights %.0f GFLOP/s, FP8 block-scaled %.0f (%.2fx; dequantized first: %.0f)\n",
                  dc.gemm_bf16_gflops, dc.gemm_fp8_gflops, dc.gemm_bf16_gflops > 0 ? dc.gemm_fp8_gflops / dc.gemm_bf16_gflops : 0.0,
                  dc.gemm_fp8_dequant_gflops);
    for (const auto& r : dc.gemv_rates)
      std::printf("gemv     BF16 %lld x %lld, one token: gemv %.0f GB/s, gemv_warp %.0f; chained %.0f, %.0f (copy %.0f)\n",
                  static_cast<long long>(r.out), static_cast<long long>(r.in), r.gemv_gbps, r.gemv_warp_gbps,
                  r.gemv_chained_gbps, r.gemv_warp_chained_gbps, dc.copy_gbps);
    std::printf("%-12s %12s %18s %14s %10s  %s\n", "test", "tok/s", "spread (min-max)", "ceiling tok/s", "fraction", "achieved");
    if (j.contains("prefill_tps"))
      std::printf("%-12s %12.2f %8.2f - %-8.2f %14.2f %9.1f%%  %.1f GFLOP/s (%s peak %.1f)\n", ("prefill " + std::to_string(o->prompt)).c_str(),
                  j["prefill_tps"].get<double>(), j["prefill_tps_min"].get<double>(), j["prefill_tps_max"].get<double>(),
                  j["prefill_ceiling_tps"].get<double>(), 100 * j["prefill_ceiling_fraction"].get<double>(),
                  j["prefill_gflops"].get<double>(), rate_name.c_str(), matmul_rate / 1e9);
    if (j.contains("decode_tps"))
      std::printf("%-12s %12.2f %8.2f - %-8.2f %14.2f %9.1f%%  %.1f GB/s of %.1f\n", ("decode " + std::to_string(o->gen)).c_str(),
                  j["decode_tps"].get<double>(), j["decode_tps_min"].get<double>(), j["decode_tps_max"].get<double>(),
                  j["decode_ceiling_tps"].get<double>(), 100 * j["decode_ceiling_fraction"].get<double>(),
                  j["decode_gbps"].get<double>(), ceil.read_gbps);
    if (j.contains("decode_read_gbps_beside") && j["decode_read_gbps_beside"].get<double>() > 0)
      std::printf("%-12s %12s %18s %14.2f %9.1f%%  of %.1f GB/s, the median read probe beside the decode runs\n", "", "", "",
                  j["decode_beside_ceiling_tps"].get<double>(),
                  100 * j["decode_beside_fraction"].get<double>(), j["decode_read_gbps_beside"].get<double>());
    if (j.contains("decode_overlapped_tps"))
      std::printf("%-12s %12.2f %18s %14.2f %9.1f%%  steps overlapped with the host's work (async scheduling)\n", "",
                  j["decode_overlapped_tps"].get<double>(), "", j["decode_ceiling_tps"].get<double>(),
                  100 * j["decode_overlapped_ceiling_fraction"].get<double>());
    if (j.contains("decode_batches"))
      for (auto& e : j["decode_batches"])
        std::printf("%-12s %12.2f %8.2f - %-8.2f %14.2f %9.1f%%  (ceiling: min of bandwidth and compute rooflines)\n",
                    ("decode b=" + std::to_string(e["batch"].get<int>())).c_str(), e["decode_tps"].get<double>(),
                    e["decode_tps_min"].get<double>(), e["decode_tps_max"].get<double>(), e["decode_ceiling_tps"].get<double>(),
                    100 * e["decode_ceiling_fraction"].get<double>());
    std::printf("(the read ceiling is the largest of the cached calibration and the probes taken beside the decode runs)\n");
  });
}

}  // namespace fp::tools
