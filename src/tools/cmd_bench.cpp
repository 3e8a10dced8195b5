// tools/cmd_bench.cpp — `fastpath bench`: prefill and decode tokens/s with warm-up and
// repetitions (median and spread), each shown against this machine's roofline:
// decode = read bandwidth / weight bytes touched per token; prefill = peak FMA / FLOPs per token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/ledger.h"
#include "tools/common.h"

namespace fp::tools {
namespace {

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

// What one token costs: bytes of weights a decode step reads, and matmul FLOPs.
struct ModelCost {
  double weight_bytes_per_token = 0;  // every matrix once + one embedding row
  double matmul_flops_per_token = 0;  // 2 x parameters of every matrix the token passes through
  double params = 0;
  std::string weight_types;
};

ModelCost model_cost(const Model& m) {
  ModelCost c;
  const ModelConfig& cfg = m.config();
  std::map<std::string, int64_t> bytes_by_type;
  for (auto& [name, t] : m.file().tensors) {
    c.params += static_cast<double>(t.numel());
    bool embedding = name == "token_embd.weight";
    if (embedding) c.weight_bytes_per_token += static_cast<double>(t.nbytes()) / static_cast<double>(t.rows());
    if (!embedding || cfg.tied_output) {
      c.weight_bytes_per_token += static_cast<double>(t.nbytes());
      if (t.ndim >= 2) c.matmul_flops_per_token += 2.0 * static_cast<double>(t.numel());
    }
    if (t.ndim >= 2) bytes_by_type[dtype_name(t.dtype)] += t.nbytes();
  }
  for (auto& [ty, b] : bytes_by_type) c.weight_types += (c.weight_types.empty() ? "" : " ") + ty + ":" + std::to_string(b >> 20) + "MiB";
  return c;
}

// Attention FLOPs for one token at context `ctx` (QK^T and PV).
double attention_flops(const ModelConfig& c, double ctx) {
  return 2.0 * 2.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim) * ctx;
}
// KV bytes one decode step reads at context ctx (f32 cache).
double kv_bytes(const ModelConfig& c, double ctx) {
  return 2.0 * 4.0 * static_cast<double>(c.n_layers * c.n_kv_heads * c.head_dim) * ctx;
}

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    int prompt = 512, gen = 128, reps = 3, warmup = 1;
    std::vector<int> batch;
    bool json = false, recalibrate = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "measure prefill and decode tokens/s against this machine's ceiling");
  add_common(cmd, o->common, false);
  cmd->add_option("-p,--n-prompt", o->prompt, "prompt tokens for the prefill test (0 skips it)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", o->gen, "tokens for the decode test (0 skips it)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-b,--batch", o->batch, "decode batch sizes (only 1 until the batched engine lands)");
  cmd->add_option("-r,--reps", o->reps, "timed repetitions (median reported)")->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", o->warmup, "untimed warm-up runs")->check(CLI::Range(0, 100));
  cmd->add_flag("--json", o->json, "one JSON object on stdout");
  cmd->add_flag("--recalibrate", o->recalibrate, "measure the machine's ceilings again instead of using the cache");
  cmd->callback([o] {
    for (int b : o->batch)
      FP_CHECK(b == 1, "--batch ", b, ": decode at batch sizes above 1 needs the batched engine (continuous batching), not built yet");
    auto model = load_with(o->common);
    const ModelConfig& cfg = model->config();
    const int threads = thread_pool().size();
    MachineCeiling ceil = machine_ceiling(threads, o->recalibrate);
    set_num_threads(threads);
    log_info("ceiling: ", ceil.describe());
    ModelCost cost = model_cost(*model);
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
    j["threads"] = threads;
    j["ceiling"] = {{"read_gbps", ceil.read_gbps}, {"fma_gflops", ceil.fma_gflops}, {"int8_gops", ceil.int8_gops}, {"cpu", ceil.cpu}};

    if (o->prompt > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(o->prompt)), pos(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = tok(rng), pos[i] = static_cast<int32_t>(i);
      std::vector<double> tps;
      for (int r = 0; r < o->warmup + o->reps; ++r) {
        auto cache = model->new_cache(o->prompt);
        auto t0 = Clock::now();
        model->forward(ids.data(), pos.data(), o->prompt, *cache, logits.data(), false);
        double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= o->warmup) tps.push_back(o->prompt / sec);
      }
      Stats s = stats_of(tps);
      double flops = cost.matmul_flops_per_token + attention_flops(cfg, o->prompt / 2.0);
      double ceiling_tps = ceil.fma_gflops * 1e9 / flops;
      j["prefill_tps"] = s.median;
      j["prefill_tps_min"] = s.min;
      j["prefill_tps_max"] = s.max;
      j["prefill_gflops"] = s.median * flops / 1e9;
      j["prefill_ceiling_tps"] = ceiling_tps;
      j["prefill_ceiling_fraction"] = s.median / ceiling_tps;
    }
    if (o->gen > 0) {
      // Bandwidth is measured before and after the decode runs; the larger figure is the ceiling.
      double bw_before = measure_read_bandwidth_now();
      std::vector<double> tps;
      for (int r = 0; r < o->warmup + o->reps; ++r) {
        auto cache = model->new_cache(o->gen + 1);
        int32_t id = tok(rng), p = 0;
        model->forward(&id, &p, 1, *cache, logits.data(), false);
        auto t0 = Clock::now();
        for (int i = 1; i <= o->gen; ++i) {
          id = tok(rng);
          p = i;
          model->forward(&id, &p, 1, *cache, logits.data(), false);
        }
        double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= o->warmup) tps.push_back(o->gen / sec);
      }
      Stats s = stats_of(tps);
      double bw = std::max({ceil.read_gbps, bw_before, measure_read_bandwidth_now()});
      ceil.read_gbps = bw;
      j["ceiling"]["read_gbps"] = bw;
      double bytes = cost.weight_bytes_per_token + kv_bytes(cfg, o->gen / 2.0);
      double ceiling_tps = bw * 1e9 / bytes;
      j["decode_tps"] = s.median;
      j["decode_tps_min"] = s.min;
      j["decode_tps_max"] = s.max;
      j["decode_gbps"] = s.median * bytes / 1e9;
      j["decode_ceiling_tps"] = ceiling_tps;
      j["decode_ceiling_fraction"] = s.median / ceiling_tps;
    }
    j["fallbacks"] = Ledger::global().fallbacks();
    log_info(Ledger::global().summary_line());
    if (o->json) {
      std::cout << j.dump() << "\n";
      return;
    }
    std::printf("model    %s (%s, %.3g params; %s)\n", model->file().path.c_str(), cfg.arch.c_str(), cost.params,
                cost.weight_types.c_str());
    std::printf("machine  %s\n", ceil.describe().c_str());
    std::printf("%-12s %12s %18s %14s %10s  %s\n", "test", "tok/s", "spread (min-max)", "ceiling tok/s", "fraction", "achieved");
    if (j.contains("prefill_tps"))
      std::printf("%-12s %12.2f %8.2f - %-8.2f %14.2f %9.1f%%  %.1f GFLOP/s of %.1f\n", ("prefill " + std::to_string(o->prompt)).c_str(),
                  j["prefill_tps"].get<double>(), j["prefill_tps_min"].get<double>(), j["prefill_tps_max"].get<double>(),
                  j["prefill_ceiling_tps"].get<double>(), 100 * j["prefill_ceiling_fraction"].get<double>(),
                  j["prefill_gflops"].get<double>(), ceil.fma_gflops);
    if (j.contains("decode_tps"))
      std::printf("%-12s %12.2f %8.2f - %-8.2f %14.2f %9.1f%%  %.1f GB/s of %.1f\n", ("decode " + std::to_string(o->gen)).c_str(),
                  j["decode_tps"].get<double>(), j["decode_tps_min"].get<double>(), j["decode_tps_max"].get<double>(),
                  j["decode_ceiling_tps"].get<double>(), 100 * j["decode_ceiling_fraction"].get<double>(),
                  j["decode_gbps"].get<double>(), ceil.read_gbps);
    std::printf("(the read ceiling is the largest of the cached calibration and two measurements taken beside the decode runs)\n");
  });
}

}  // namespace fp::tools
