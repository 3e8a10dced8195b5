// parallel/planner.h — the cost model behind `fastpath plan`: for a dense model on a described
// machine, every tensor-parallel x data-parallel layout with its memory per device, KV capacity,
// and predicted prefill and decode throughput, each phase's time split into compute, memory
// traffic and communication (the largest is the bottleneck).
//
// Roofline arithmetic, no measured efficiencies: a step takes max(compute, memory) + the
// all-reduces (not overlapped). Compute = FLOPs / peak; memory = bytes read / bandwidth; an
// all-reduce of B bytes over n ranks on a ring = 2(n-1)/n * B / link bandwidth + 2(n-1) * latency.
// Figures are upper bounds for what the layout can reach.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp {

// The parts of a dense transformer the cost model needs.
struct PlanModel {
  std::string name;
  int64_t n_layers = 0, dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  double split_bytes = 0;       // the layers' matrices, divided across tensor-parallel ranks
  double replicated_bytes = 0;  // embedding, output projection, norms: on every rank
  double matmul_flops_per_token = 0;  // 2 x the matrix parameters one token passes through
};

struct PlanHardware {
  std::string name;
  int devices = 1;
  double memory_gib = 0;           // per device
  double memory_bandwidth_gbps = 0;  // per device, GB/s (1e9 bytes)
  double compute_tflops = 0;       // per device, dense, at the weights' compute type
  std::string link = "";           // "pcie4", "nvlink4", "shared memory", ...
  double link_gbps = 0;            // per device bus bandwidth an all-reduce sees, GB/s
  double link_latency_us = 0;      // per ring step
  double reserved_gib = 0;         // per device: runtime, activations, fragmentation
  double kv_bytes = 2;             // bytes per cached K/V value
  double activation_bytes = 2;     // bytes per value in an all-reduce
};
// Reads a hardware description (see hardware/*.json); errors name `where` and the field.
PlanHardware hardware_from_json(const nlohmann::json& j, const std::string& where);

struct PlanWorkload {
  int64_t input_len = 1024, output_len = 256;
  std::vector<int> concurrency{1, 16, 64};
};

// One phase's step: its time split, the throughput and what limits it.
struct PhaseCost {
  double compute_s = 0, memory_s = 0, comm_s = 0;
  double seconds = 0;    // max(compute, memory) + comm
  double tokens_per_s = 0;
  int64_t batch = 0;     // sequences per replica in the step (decode) / 1 prompt (prefill)
  bool kv_capped = false;  // decode: fewer sequences than asked fit in the KV cache
  std::string bottleneck;  // "compute", "memory bandwidth", "communication"
};

struct LayoutPlan {
  int tp = 1, dp = 1;
  bool fits = false;
  std::string why_not;  // when !fits
  double weight_gib = 0;            // per device
  double kv_bytes_per_token = 0;    // per device (this device's KV heads)
  int64_t kv_capacity_tokens = 0;   // per replica
  int64_t max_sequences = 0;        // per replica, at input + output tokens each
  PhaseCost prefill;                // one prompt of input_len per replica, replicas in parallel
  std::vector<PhaseCost> decode;    // one per workload concurrency
};

// Seconds for one ring all-reduce of `bytes` over `ranks`.
double ring_all_reduce_seconds(double bytes, int ranks, const PlanHardware& hw);
// Every layout tp x dp = devices (tp dividing the head counts), in increasing tp.
std::vector<LayoutPlan> plan_layouts(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w);

}  // namespace fp
