// parallel/planner.cpp — the layout cost model (see planner.h for the formulas).
#include "parallel/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace fp {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double positive(const nlohmann::json& j, const char* key, const std::string& where, bool required, double fallback) {
  if (!j.contains(key)) {
    FP_CHECK(!required, where, ": field '", key, "' is required");
    return fallback;
  }
  FP_CHECK(j[key].is_number(), where, ": field '", key, "' must be a number");
  const double v = j[key].get<double>();
  FP_CHECK(v > 0 || (!required && v == 0), where, ": field '", key, "' must be positive, got ", v);
  return v;
}

std::string bottleneck_of(const PhaseCost& c) {
  if (c.comm_s >= c.compute_s && c.comm_s >= c.memory_s) return "communication";
  return c.compute_s >= c.memory_s ? "compute" : "memory bandwidth";
}

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / kGiB);
  return b;
}

void finish(PhaseCost& c) {
  c.seconds = std::max(c.compute_s, c.memory_s) + c.comm_s;
  c.bottleneck = bottleneck_of(c);
}
}  // namespace

PlanHardware hardware_from_json(const nlohmann::json& j, const std::string& where) {
  FP_CHECK(j.is_object(), where, ": expected a JSON object");
  PlanHardware h;
  h.name = j.value("name", where);
  FP_CHECK(j.contains("devices") && j["devices"].is_number_integer() && j["devices"].get<int64_t>() >= 1 &&
               j["devices"].get<int64_t>() <= 4096,
           where, ": field 'devices' must be an integer in [1, 4096]");
  h.devices = j["devices"].get<int>();
  h.memory_gib = positive(j, "memory_gib", where, true, 0);
  h.memory_bandwidth_gbps = positive(j, "memory_bandwidth_gbps", where, true, 0);
  h.compute_tflops = positive(j, "compute_tflops", where, true, 0);
  h.reserved_gib = positive(j, "reserved_gib", where, false, 0);
  h.kv_bytes = positive(j, "kv_bytes", where, false, 2);
  h.activation_bytes = positive(j, "activation_bytes", where, false, 2);
  if (h.devices > 1) {
    FP_CHECK(j.contains("interconnect") && j["interconnect"].is_object(), where,
             ": field 'interconnect' ({\"kind\", \"bandwidth_gbps\", \"latency_us\"}) is required with several devices");
    const nlohmann::json& l = j["interconnect"];
    h.link = l.value("kind", "link");
    h.link_gbps = positive(l, "bandwidth_gbps", where + " interconnect", true, 0);
    h.link_latency_us = positive(l, "latency_us", where + " interconnect", false, 0);
  }
  return h;
}

double ring_all_reduce_seconds(double bytes, int ranks, const PlanHardware& hw) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return 2 * (n - 1) / n * bytes / (hw.link_gbps * 1e9) + 2 * (n - 1) * hw.link_latency_us * 1e-6;
}

std::vector<LayoutPlan> plan_layouts(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w) {
  FP_CHECK(m.n_layers > 0 && m.dim > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0, "plan: model '", m.name,
           "' has no layers or heads");
  FP_CHECK(w.input_len >= 1 && w.output_len >= 1, "plan: input and output lengths must be at least 1");
  const double L = static_cast<double>(m.n_layers), att = static_cast<double>(m.n_heads * m.head_dim);
  const double in = static_cast<double>(w.input_len), seq = static_cast<double>(w.input_len + w.output_len);
  const double ctx = in + static_cast<double>(w.output_len) / 2;  // mean context during decode
  std::vector<LayoutPlan> out;
  for (int tp = 1; tp <= hw.devices; ++tp) {
    if (hw.devices % tp != 0) continue;
    LayoutPlan p;
    p.tp = tp;
    p.dp = hw.devices / tp;
    if (m.n_heads % tp != 0 || m.n_kv_heads % tp != 0) {
      p.why_not = "TP=" + std::to_string(tp) + " does not divide the " + std::to_string(m.n_heads) + " heads / " +
                  std::to_string(m.n_kv_heads) + " KV heads";
      out.push_back(p);
      continue;
    }
    const double weights = m.replicated_bytes + m.split_bytes / tp;
    p.weight_gib = weights / kGiB;
    p.kv_bytes_per_token = 2 * L * static_cast<double>(m.n_kv_heads / tp * m.head_dim) * hw.kv_bytes;  // K and V
    const double free_bytes = (hw.memory_gib - hw.reserved_gib) * kGiB - weights;
    if (free_bytes <= 0) {
      p.why_not = "weights need " + gib(weights) + " per device, " + gib((hw.memory_gib - hw.reserved_gib) * kGiB) +
                  " available (short by " + gib(-free_bytes) + ")";
      out.push_back(p);
      continue;
    }
    p.kv_capacity_tokens = static_cast<int64_t>(std::floor(free_bytes / p.kv_bytes_per_token));
    p.max_sequences = static_cast<int64_t>(std::floor(static_cast<double>(p.kv_capacity_tokens) / seq));
    if (p.max_sequences < 1) {
      p.why_not = "the KV cache holds " + std::to_string(p.kv_capacity_tokens) + " tokens per replica, one sequence needs " +
                  std::to_string(w.input_len + w.output_len);
      out.push_back(p);
      continue;
    }
    p.fits = true;
    const double flops = hw.compute_tflops * 1e12, bw = hw.memory_bandwidth_gbps * 1e9;
    // Prefill: one prompt per replica. Attention: QK^T and PV over the causal half, 2 FLOPs each.
    PhaseCost& pf = p.prefill;
    pf.batch = 1;
    pf.compute_s = (in * m.matmul_flops_per_token + 4 * L * att * in * in / 2) / tp / flops;
    pf.memory_s = weights / bw;
    pf.comm_s = 2 * L * ring_all_reduce_seconds(in * static_cast<double>(m.dim) * hw.activation_bytes, tp, hw);
    finish(pf);
    pf.tokens_per_s = p.dp * in / pf.seconds;
    // Decode: every replica steps its share of the sequences, reading its weights once and
    // each sequence's KV.
    for (int c : w.concurrency) {
      PhaseCost d;
      const int64_t want = (c + p.dp - 1) / p.dp;
      d.batch = std::min<int64_t>(want, p.max_sequences);
      d.kv_capped = d.batch < want;
      const double b = static_cast<double>(d.batch);
      d.compute_s = b * (m.matmul_flops_per_token + 4 * L * att * ctx) / tp / flops;
      d.memory_s = (weights + b * ctx * p.kv_bytes_per_token) / bw;
      d.comm_s = 2 * L * ring_all_reduce_seconds(b * static_cast<double>(m.dim) * hw.activation_bytes, tp, hw);
      finish(d);
      const double active = std::min(static_cast<double>(c), b * p.dp);  // sequences stepping together
      d.tokens_per_s = active / d.seconds;
      p.decode.push_back(d);
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace fp
