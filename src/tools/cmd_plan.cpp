// tools/cmd_plan.cpp — `fastpath plan`: for a model (a model file, or a Hugging Face config.json;
// dense, MoE, MLA) on a described machine (hardware/*.json), each parallel layout (TP, DP, CP,
// EP, DP attention) with its memory per device and predicted prefill and decode throughput, the
// best per phase with the reason from the step costs, and what limits each (parallel/planner.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "model/plan_model.h"
#include "parallel/planner.h"
#include "tools/common.h"

namespace fp::tools {

namespace {

// A phase's throughput with two overlapped micro-batches, or "-".
std::string overlapped(const PhaseCost& c) {
  if (c.overlapped_tokens_per_s <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", c.overlapped_tokens_per_s);
  return buf;
}

void print_text(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w, const std::vector<LayoutPlan>& plans) {
  const double g = 1024.0 * 1024.0 * 1024.0;
  std::printf("model     %s: %lld layers, dim %lld, %lld heads / %lld KV heads", m.name.c_str(),
              static_cast<long long>(m.n_layers), static_cast<long long>(m.dim), static_cast<long long>(m.n_heads),
              static_cast<long long>(m.n_kv_heads));
  if (m.mla()) std::printf(", MLA latent %lld + rope %lld", static_cast<long long>(m.kv_lora_rank), static_cast<long long>(m.rope_dim));
  if (m.window > 0)
    std::printf(", sliding window %lld on %lld layers (their KV trimmed to it)", static_cast<long long>(m.window),
                static_cast<long long>(m.n_window_layers));
  if (m.moe())
    std::printf(", %lld experts (top %lld) on %lld layers", static_cast<long long>(m.n_experts), static_cast<long long>(m.n_used),
                static_cast<long long>(m.n_moe_layers));
  const double routed = static_cast<double>(m.n_experts * m.n_moe_layers) * m.expert_bytes;
  std::printf("\n          weights %.2f GiB split over TP", m.split_bytes / g);
  if (m.moe()) std::printf(" + %.2f GiB routed experts + %.2f GiB shared experts", routed / g, m.shared_bytes / g);
  std::printf(" + %.2f GiB output projection split over the model's ranks%s + %.2f GiB replicated\n", m.output_bytes / g,
              m.tied_output ? " (tied: the embedding table)" : "", (m.replicated_bytes + (m.tied_output ? 0 : m.embedding_bytes)) / g);
  std::printf("hardware  %s: %d devices x %.4g GiB, %.4g GB/s, %.4g TFLOP/s; %s %.4g GB/s, %.4g us per step + %.4g us per call\n",
              hw.name.c_str(), hw.devices, hw.memory_gib, hw.memory_bandwidth_gbps, hw.compute_tflops, hw.link.c_str(),
              hw.link_gbps, hw.link_latency_us, hw.collective_us);
  if (hw.compute_efficiency < 1 || hw.bandwidth_efficiency < 1)
    std::printf("          calibrated: the kernels reach %.0f%% of the compute peak and %.0f%% of the bandwidth\n",
                100 * hw.compute_efficiency, 100 * hw.bandwidth_efficiency);
  else
    std::printf("          roofline: no efficiencies given, figures are upper bounds\n");
  std::printf("workload  %lld input + %lld output tokens per request\n\n", static_cast<long long>(w.input_len),
              static_cast<long long>(w.output_len));
  const LayoutPlan* bp = best_prefill(plans);
  std::printf("%-22s %8s %8s %12s %9s %14s %11s  %s\n", "layout (per device:)", "weights", "activ.", "KV tok/group",
              "max seqs", "prefill tok/s", "overlapped", "bottleneck (compute / memory / comm ms)");
  for (const LayoutPlan& p : plans) {
    const char* name = p.layout.name.c_str();
    if (!p.fits) {
      std::printf("%-22s does not fit: %s\n", name, p.why_not.c_str());
      continue;
    }
    const PhaseCost& f = p.prefill;
    std::printf("%-22s %8.2f %8.2f %12lld %9lld %14.1f %11s  %s (%.2f / %.2f / %.2f)%s\n", name, p.weight_gib, p.activation_gib,
                static_cast<long long>(p.kv_capacity_tokens), static_cast<long long>(p.max_sequences * p.layout.groups),
                f.tokens_per_s, overlapped(f).c_str(), f.bottleneck.c_str(), f.compute_s * 1e3, f.memory_s * 1e3, f.comm_s * 1e3,
                &p == bp ? "  <- best prefill" : "");
  }
  std::printf("(GiB per device; max seqs over all groups; CP layouts are prefill only)\n");
  for (size_t i = 0; i < w.concurrency.size(); ++i) {
    const LayoutPlan* bd = best_decode(plans, i);
    std::printf("\ndecode at concurrency %d:\n%-22s %14s %11s  %s\n", w.concurrency[i], "layout", "output tok/s",
                "overlapped", "bottleneck (compute / memory / comm ms per step)");
    for (const LayoutPlan& p : plans) {
      if (!p.fits || p.decode.empty()) continue;
      const PhaseCost& d = p.decode[i];
      const std::string capped = d.kv_capped ? " [KV holds " + std::to_string(p.max_sequences) + " seqs per group]" : "";
      std::printf("%-22s %14.1f %11s  %s (%.3f / %.3f / %.3f)%s%s\n", p.layout.name.c_str(), d.tokens_per_s,
                  overlapped(d).c_str(), d.bottleneck.c_str(),
                  d.compute_s * 1e3, d.memory_s * 1e3, d.comm_s * 1e3, capped.c_str(), &p == bd ? "  <- best" : "");
    }
  }
  std::printf("\nbest prefill layout: %s, %.1f input tok/s, %s-bound\n  why: %s\n", bp->layout.name.c_str(),
              bp->prefill.tokens_per_s, bp->prefill.bottleneck.c_str(), explain_best(plans, *bp, false, 0).c_str());
  for (size_t i = 0; i < w.concurrency.size(); ++i) {
    const LayoutPlan* bd = best_decode(plans, i);
    if (!bd) continue;
    std::printf("best decode layout at concurrency %d: %s, %.1f output tok/s, %s-bound\n  why: %s\n", w.concurrency[i],
                bd->layout.name.c_str(), bd->decode[i].tokens_per_s, bd->decode[i].bottleneck.c_str(),
                explain_best(plans, *bd, true, i).c_str());
    if (bd != bp)
      std::printf("  prefill and decode differ at concurrency %d: prefill on %s, decode on %s\n", w.concurrency[i],
                  bp->layout.name.c_str(), bd->layout.name.c_str());
  }
  std::printf("\n(rooflines without measured efficiencies: upper bounds; communication is not overlapped; 'overlapped': the\n"
              " step as two micro-batches whose collectives hide behind each other's compute, weights read twice,\n"
              " '-' where nothing is communicated or the link cannot overlap; not used to choose)\n");
}

void print_json(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w, const std::vector<LayoutPlan>& plans) {
  nlohmann::json j;
  j["model"] = m.name;
  if (m.window > 0) j["sliding_window"] = {{"window", m.window}, {"layers", m.n_window_layers}};
  j["hardware"] = hw.name;
  j["compute_efficiency"] = hw.compute_efficiency;
  j["bandwidth_efficiency"] = hw.bandwidth_efficiency;
  j["best_prefill"] = best_prefill(plans)->layout.name;
  for (const LayoutPlan& p : plans) {
    nlohmann::json e{{"layout", p.layout.name}, {"tp", p.layout.tp}, {"groups", p.layout.groups}, {"ep", p.layout.ep},
                     {"cp", p.layout.cp}, {"fits", p.fits}};
    if (!p.fits) e["why_not"] = p.why_not;
    else {
      e["weight_gib_per_device"] = p.weight_gib;
      e["activation_gib_per_device"] = p.activation_gib;
      e["kv_capacity_tokens_per_group"] = p.kv_capacity_tokens;
      auto cost = [](const PhaseCost& c) {
        return nlohmann::json{{"bottleneck", c.bottleneck}, {"compute_ms", c.compute_s * 1e3}, {"memory_ms", c.memory_s * 1e3},
                              {"comm_ms", c.comm_s * 1e3}};
      };
      e["prefill"] = cost(p.prefill);
      e["prefill"]["input_tps"] = p.prefill.tokens_per_s;
      e["prefill"]["overlapped_input_tps"] = p.prefill.overlapped_tokens_per_s;
      for (size_t i = 0; i < p.decode.size(); ++i) {
        nlohmann::json d = cost(p.decode[i]);
        d["concurrency"] = w.concurrency[i];
        d["output_tps"] = p.decode[i].tokens_per_s;
        d["overlapped_output_tps"] = p.decode[i].overlapped_tokens_per_s;
        d["kv_capped"] = p.decode[i].kv_capped;
        e["decode"].push_back(d);
      }
    }
    j["layouts"].push_back(e);
  }
  for (size_t i = 0; i < w.concurrency.size(); ++i)
    if (const LayoutPlan* bd = best_decode(plans, i))
      j["best_decode"].push_back({{"concurrency", w.concurrency[i]}, {"layout", bd->layout.name}});
  std::cout << j.dump(2) << "\n";
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
  cmd->add_option("--model,-m", o->model, "a model file / directory, or a Hugging Face config.json")->required();
  cmd->add_option("--hardware", o->hardware, "machine description (hardware/*.json)")->required();
  cmd->add_option("--input-len", o->work.input_len, "prompt tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--output-len", o->work.output_len, "generated tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--concurrency", o->work.concurrency, "requests in flight for decode (e.g. 1,16,64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--weight-bytes", o->weight_bytes, "bytes per parameter when --model is a config.json (bf16: 2, fp8: 1)")
      ->check(CLI::Range(0.1, 8.0));
  cmd->add_flag("--json", o->json, "print the layouts as JSON");
  cmd->callback([o] {
    const bool config_only = o->model.size() > 5 && o->model.substr(o->model.size() - 5) == ".json";
    const PlanModel m = config_only ? plan_model_from_hf_config(read_json_file(o->model), o->model, o->weight_bytes)
                                    : plan_model_from_file(o->model);
    const PlanHardware hw = hardware_from_json(read_json_file(o->hardware), o->hardware);
    const std::vector<LayoutPlan> plans = plan_layouts(m, hw, o->work);
    if (!best_prefill(plans)) {
      std::string why;
      for (const LayoutPlan& p : plans) why += "\n  " + p.layout.name + ": " + p.why_not;
      fail(m.name, " does not fit ", hw.name, " in any layout:", why);
    }
    if (o->json) print_json(m, hw, o->work, plans);
    else print_text(m, hw, o->work, plans);
  });
}

}  // namespace fp::tools
