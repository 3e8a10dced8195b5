// tools/cmd_plan.cpp — `fastpath plan`: for a model (a model file, or a Hugging Face
// config.json of a dense llama/qwen2/qwen3 shape) on a described machine (hardware/*.json),
// every tensor-parallel x data-parallel layout with its memory per device and predicted prefill
// and decode throughput, the best per phase, and what limits each (parallel/planner.h).
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "parallel/planner.h"
#include "tools/common.h"

namespace fp::tools {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  FP_CHECK(in, path, ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

// A dense model from its Hugging Face config.json, weights of `weight_bytes` per parameter.
PlanModel model_from_config(const std::string& path, double weight_bytes) {
  const nlohmann::json j = read_json(path);
  auto get = [&](const char* k) {
    FP_CHECK(j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() > 0, path, ": field '", k,
             "' (a positive integer) is required");
    return j[k].get<int64_t>();
  };
  FP_CHECK(!j.contains("num_experts") && !j.contains("n_routed_experts") && !j.contains("kv_lora_rank"), path,
           ": plan covers dense llama/qwen2/qwen3 shapes so far (this config has experts or latent attention)");
  PlanModel m;
  m.name = path;
  m.dim = get("hidden_size");
  m.n_layers = get("num_hidden_layers");
  m.n_heads = get("num_attention_heads");
  m.n_kv_heads = j.contains("num_key_value_heads") ? get("num_key_value_heads") : m.n_heads;
  m.head_dim = j.contains("head_dim") ? get("head_dim") : m.dim / m.n_heads;
  const double ff = static_cast<double>(get("intermediate_size")), vocab = static_cast<double>(get("vocab_size"));
  const double d = static_cast<double>(m.dim), q = static_cast<double>(m.n_heads * m.head_dim);
  const double kv = static_cast<double>(m.n_kv_heads * m.head_dim);
  const double per_layer = d * q + 2 * d * kv + q * d + 3 * d * ff;  // q, k, v, o; gate, up, down
  const bool tied = j.value("tie_word_embeddings", false);
  m.split_bytes = static_cast<double>(m.n_layers) * per_layer * weight_bytes;
  m.replicated_bytes = (tied ? 1 : 2) * vocab * d * weight_bytes;
  m.matmul_flops_per_token = 2 * (static_cast<double>(m.n_layers) * per_layer + vocab * d);
  return m;
}

// A dense model from its file: the layers' matrices are split, everything else replicated.
PlanModel model_from_file(const std::string& path) {
  LoadOptions lo;
  lo.prefault = false;
  auto f = load_model_file(path, lo);
  const ModelConfig& c = f->config;
  FP_CHECK(c.moe.n_experts == 0 && c.mla.kv_lora_rank == 0, path, ": plan covers dense llama/qwen2/qwen3 models so far (",
           c.arch, " has experts or latent attention)");
  PlanModel m;
  m.name = c.name.empty() ? path : c.name;
  m.n_layers = c.n_layers;
  m.dim = c.dim;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.head_dim = c.head_dim;
  for (const auto& [name, t] : f->tensors) {
    const double bytes = static_cast<double>(t.nbytes());
    const bool layer_matrix = name.rfind("blk.", 0) == 0 && t.ndim == 2;
    (layer_matrix ? m.split_bytes : m.replicated_bytes) += bytes;
    const bool embedding = name == "token_embd.weight";
    if (t.ndim == 2 && (!embedding || c.tied_output)) m.matmul_flops_per_token += 2.0 * static_cast<double>(t.numel());
  }
  return m;
}

std::string gib(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

}  // namespace

void add_plan(CLI::App& app) {
  struct Opts {
    std::string model, hardware;
    PlanWorkload work;
    double weight_bytes = 2;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("plan", "predict memory per device and throughput of each parallel layout on a machine");
  cmd->add_option("--model,-m", o->model, "a model file / directory, or a Hugging Face config.json (dense shapes)")->required();
  cmd->add_option("--hardware", o->hardware, "machine description (hardware/*.json)")->required();
  cmd->add_option("--input-len", o->work.input_len, "prompt tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--output-len", o->work.output_len, "generated tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--concurrency", o->work.concurrency, "requests in flight for decode (e.g. 1,16,64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--weight-bytes", o->weight_bytes, "bytes per parameter when --model is a config.json (bf16: 2)")
      ->check(CLI::Range(0.1, 8.0));
  cmd->add_flag("--json", o->json, "print the layouts as JSON");
  cmd->callback([o] {
    const bool config_only = o->model.size() > 5 && o->model.substr(o->model.size() - 5) == ".json";
    const PlanModel m = config_only ? model_from_config(o->model, o->weight_bytes) : model_from_file(o->model);
    const PlanHardware hw = hardware_from_json(read_json(o->hardware), o->hardware);
    const std::vector<LayoutPlan> plans = plan_layouts(m, hw, o->work);
    const LayoutPlan* best_prefill = nullptr;
    std::vector<const LayoutPlan*> best_decode(o->work.concurrency.size(), nullptr);
    for (const LayoutPlan& p : plans) {
      if (!p.fits) continue;
      if (!best_prefill || p.prefill.tokens_per_s > best_prefill->prefill.tokens_per_s) best_prefill = &p;
      for (size_t i = 0; i < best_decode.size(); ++i)
        if (!best_decode[i] || p.decode[i].tokens_per_s > best_decode[i]->decode[i].tokens_per_s) best_decode[i] = &p;
    }
    if (!best_prefill) {
      std::string why;
      for (const LayoutPlan& p : plans) why += "\n  TP=" + std::to_string(p.tp) + " x DP=" + std::to_string(p.dp) + ": " + p.why_not;
      fail(m.name, " does not fit ", hw.name, " in any layout:", why);
    }
    if (o->json) {
      nlohmann::json j;
      j["model"] = m.name;
      j["hardware"] = hw.name;
      for (const LayoutPlan& p : plans) {
        nlohmann::json e{{"tp", p.tp}, {"dp", p.dp}, {"fits", p.fits}};
        if (!p.fits) e["why_not"] = p.why_not;
        else {
          e["weight_gib_per_device"] = p.weight_gib;
          e["kv_capacity_tokens"] = p.kv_capacity_tokens;
          e["prefill"] = {{"input_tps", p.prefill.tokens_per_s}, {"bottleneck", p.prefill.bottleneck}};
          for (size_t i = 0; i < p.decode.size(); ++i)
            e["decode"].push_back({{"concurrency", o->work.concurrency[i]}, {"output_tps", p.decode[i].tokens_per_s},
                                   {"bottleneck", p.decode[i].bottleneck}, {"kv_capped", p.decode[i].kv_capped}});
        }
        j["layouts"].push_back(e);
      }
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::printf("model     %s: %lld layers, dim %lld, %lld heads / %lld KV heads; weights %s GiB split + %s GiB replicated\n",
                m.name.c_str(), static_cast<long long>(m.n_layers), static_cast<long long>(m.dim),
                static_cast<long long>(m.n_heads), static_cast<long long>(m.n_kv_heads), gib(m.split_bytes / (1 << 30)).c_str(),
                gib(m.replicated_bytes / (1 << 30)).c_str());
    std::printf("hardware  %s: %d devices x %.0f GiB, %.0f GB/s, %.0f TFLOP/s; %s %.0f GB/s, %.1f us\n", hw.name.c_str(),
                hw.devices, hw.memory_gib, hw.memory_bandwidth_gbps, hw.compute_tflops, hw.link.c_str(), hw.link_gbps,
                hw.link_latency_us);
    std::printf("workload  %lld input + %lld output tokens per request\n\n", static_cast<long long>(o->work.input_len),
                static_cast<long long>(o->work.output_len));
    std::printf("%-10s %12s %14s %9s %14s  %s\n", "layout", "weights GiB", "KV tokens", "max seqs", "prefill tok/s",
                "prefill bottleneck (compute / memory / comm ms)");
    for (const LayoutPlan& p : plans) {
      const std::string name = "TP" + std::to_string(p.tp) + "xDP" + std::to_string(p.dp);
      if (!p.fits) {
        std::printf("%-10s does not fit: %s\n", name.c_str(), p.why_not.c_str());
        continue;
      }
      const PhaseCost& f = p.prefill;
      std::printf("%-10s %12.2f %14lld %9lld %14.1f  %s (%.2f / %.2f / %.2f)%s\n", name.c_str(), p.weight_gib,
                  static_cast<long long>(p.kv_capacity_tokens), static_cast<long long>(p.max_sequences), f.tokens_per_s,
                  f.bottleneck.c_str(), f.compute_s * 1e3, f.memory_s * 1e3, f.comm_s * 1e3, &p == best_prefill ? "  <- best prefill" : "");
    }
    for (size_t i = 0; i < o->work.concurrency.size(); ++i) {
      std::printf("\ndecode at concurrency %d:\n%-10s %14s  %s\n", o->work.concurrency[i], "layout", "output tok/s",
                  "bottleneck (compute / memory / comm ms per step)");
      for (const LayoutPlan& p : plans) {
        if (!p.fits) continue;
        const PhaseCost& d = p.decode[i];
        const std::string capped = d.kv_capped ? " [KV holds " + std::to_string(p.max_sequences) + " seqs per replica]" : "";
        const std::string name = "TP" + std::to_string(p.tp) + "xDP" + std::to_string(p.dp);
        std::printf("%-10s %14.1f  %s (%.3f / %.3f / %.3f)%s%s\n", name.c_str(), d.tokens_per_s, d.bottleneck.c_str(),
                    d.compute_s * 1e3, d.memory_s * 1e3, d.comm_s * 1e3, capped.c_str(), &p == best_decode[i] ? "  <- best" : "");
      }
    }
    std::printf("\n(rooflines without measured efficiencies: upper bounds; communication is not overlapped)\n");
  });
}

}  // namespace fp::tools
