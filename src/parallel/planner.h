// parallel/planner.h — the cost model behind `fastpath plan`: for a model (dense, Mixture-of-
// Experts, latent attention) on a described machine, a short list of named parallel layouts with
// their memory per device, KV capacity, and predicted prefill and decode throughput, each phase's
// step split into compute, memory traffic and communication (the largest is the bottleneck).
//
// Roofline arithmetic: a step takes max(compute, memory) + the collectives (not overlapped).
// Compute = FLOPs / (peak x compute_efficiency); memory = bytes read / (bandwidth x
// bandwidth_efficiency) — the efficiencies are the fractions of the peaks the kernels reach,
// calibrated by measurement (bench/plan_calibration.sh), 1 (an upper bound) unless the hardware
// file gives them; on n ranks,
// with a per-step latency and a per-call overhead (NCCL's tuning model has both: hwLat, baseLat)
//   ring all-reduce of B bytes   call + 2(n-1)/n * B / link + 2(n-1) * step
//   ring all-gather of B bytes   call + (n-1)/n * B / link + (n-1) * step      (B = the gathered total)
//   all-to-all, S bytes leaving  call + S / link + (n-1) * step                (pairwise exchange)
// Figures are upper bounds for what a layout can reach.
//
// Overlap (a second figure per phase, not used to choose): the step run as two micro-batches whose
// collectives each travel while the other computes, so communication hides behind compute, but
// each micro-batch reads the weights again:  max(compute, 2 x memory, comm). Only where the link
// moves data without the compute units (GPUs' copy engines, NICs); on CPU ranks the cores copy
// the messages themselves ("overlaps_compute": false in the hardware file) and nothing is hidden.
//
// Layouts (devices N = tp x groups):
//   TPt[xDPg]            attention heads, FFNs and experts sliced over t ranks; g replicas with their
//                        own sequences. 2 all-reduces of the tokens' hidden states per layer.
//   CPg[xTPt]            prefill only: one prompt cut into g chunks, one per TP group; every layer
//                        all-gathers the chunks' K/V (the latent rows for MLA) across the groups.
//   ...+EPN              MoE only: routed experts partitioned over all N ranks (E/N each, whole).
//                        Attention runs as DPg x TPt ("DP8-attn": t = 1, "TP8+EP8": g = 1); each
//                        rank dispatches its 1/t of its group's tokens to the k experts' ranks and
//                        gets the results back: two all-to-alls of tokens/t * k * (N-1)/N hidden
//                        states each, plus an all-gather within the TP group. Shared experts are
//                        replicated (run on the rank's 1/t of the tokens).
//   CPg...+EPN           prefill only: as above with one prompt split across the g groups.
// MoE decode reads only the experts its batch touches: B tokens picking k of E experts uniformly
// touch on average  E * (1 - (1 - k/E)^B)  distinct experts per MoE layer (an expert is missed by
// one pick with probability 1 - 1/E, by a token's k distinct picks with 1 - k/E); with EP a rank
// holds E/N of them and the experts see the tokens of every group.
// Output projection (vocab x dim): split by vocabulary rows over the ranks that hold slices of
// the model (the tp ranks of a group; all N ranks with EP), each rank multiplying its rows for
// the step's logit rows, one all-gather of the f32 logits putting them together (what the
// runtime's VocabParallelOutput does). The embedding table is resident on every rank but a step
// reads only its tokens' rows (not counted). A tied output is the embedding table: resident once,
// its rows still read split.
// KV per token per device: GQA 2 x layers x (KV heads / t) x head_dim x kv_bytes (split by heads);
// MLA layers x (kv_lora_rank + rope_dim) x kv_bytes — the latent row has no heads, so every TP rank
// of a group holds the whole of it (TP replicates MLA's cache; DP attention does not).
// Sliding-window layers (Gemma 2/3, gpt-oss, Mistral, Phi-3): a sequence of S tokens keeps
// min(S, window) positions in each (the runtime's window trimming, on by default), and a query
// attends to at most `window` of them (scores and K/V reads). kv_bytes_per_token is then a
// sequence's KV divided by its tokens at the workload's length, and kv_capacity_tokens the
// full-attention positions that fit beside the windows of max_sequences such sequences.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp {

// The parts of a transformer the cost model needs.
struct PlanModel {
  std::string name;
  int64_t n_layers = 0, dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t ff = 0;               // widest FFN intermediate one token passes through (activations)
  double split_bytes = 0;       // attention + dense FFN matrices, divided across tensor-parallel ranks
  double replicated_bytes = 0;  // norms, routers, head-less projections: on every rank, read every step
  double embedding_bytes = 0;   // the token embedding table: on every rank, a step reads its tokens' rows
  double output_bytes = 0;      // the output projection: split by vocabulary rows (see the top)
  bool tied_output = false;     // the output projection is the embedding table
  int64_t vocab = 0;
  double matmul_flops_per_token = 0;  // 2 x the parameters one token passes through, the output projection aside
  double output_flops = 0;            // 2 x the output projection's parameters: per row whose logits are computed
  // Mixture of experts (n_experts == 0: dense).
  int64_t n_experts = 0, n_used = 0, n_moe_layers = 0;  // routed experts, top-k, layers with experts
  double expert_bytes = 0, expert_flops = 0;   // one routed expert of one layer; 2 x its parameters
  double shared_bytes = 0, shared_flops = 0;   // every layer's shared experts; per token
  // Multi-head latent attention (kv_lora_rank == 0: GQA). head_dim = nope + rope for MLA.
  int64_t kv_lora_rank = 0, rope_dim = 0, v_head_dim = 0;
  // Sliding-window attention: n_window_layers of the n_layers attend to the last `window`
  // positions only (0: none).
  int64_t window = 0, n_window_layers = 0;
  bool moe() const { return n_experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
};

// A model from a Hugging Face config.json (llama/qwen2/qwen3, qwen3_moe/qwen2_moe, deepseek_v2/v3),
// `weight_bytes` per parameter; errors name `where` and the field.
PlanModel plan_model_from_hf_config(const nlohmann::json& j, const std::string& where, double weight_bytes);

struct PlanHardware {
  std::string name;
  int devices = 1;
  double memory_gib = 0;           // per device
  double memory_bandwidth_gbps = 0;  // per device, GB/s (1e9 bytes)
  double compute_tflops = 0;       // per device, dense, at the weights' compute type
  double compute_efficiency = 1;   // fraction of compute_tflops the matmuls reach (1: roofline)
  double bandwidth_efficiency = 1; // fraction of the bandwidth a weight-streaming step reaches
  std::string link = "";           // "pcie4", "nvlink4", "shared memory", ...
  double link_gbps = 0;            // per device bandwidth a collective sees, GB/s
  double link_latency_us = 0;      // per ring / exchange step
  double collective_us = 0;        // per collective call (launch and synchronisation)
  bool link_overlaps = true;       // collectives can run beside compute (interconnect.overlaps_compute)
  double reserved_gib = 0;         // per device: runtime, fragmentation
  double kv_bytes = 2;             // bytes per cached K/V value
  double activation_bytes = 2;     // bytes per activation value (collectives, activation memory)
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
  // Two overlapped micro-batches (see the top): their step and throughput; 0 when nothing is
  // communicated or the link cannot overlap.
  double overlapped_s = 0, overlapped_tokens_per_s = 0;
  int64_t batch = 0;     // sequences per group in the step (decode) / 1 prompt (prefill)
  bool kv_capped = false;  // decode: fewer sequences than asked fit in the KV cache
  std::string bottleneck;  // "compute", "memory bandwidth", "communication"
};

struct Layout {
  std::string name;
  int tp = 1;       // ranks per attention group (heads split)
  int groups = 1;   // attention groups: DP replicas, or CP chunks of one prompt
  int ep = 1;       // ranks the routed experts are partitioned over (1: sliced over tp instead)
  bool cp = false;  // prefill only: the groups share one prompt
};

struct LayoutPlan {
  Layout layout;
  bool fits = false;
  std::string why_not;  // when !fits
  double weight_gib = 0;            // per device
  double activation_gib = 0;        // per device: one prefill's hidden states and FFN intermediates
  double kv_bytes_per_token = 0;    // per device
  int64_t kv_capacity_tokens = 0;   // per group
  int64_t max_sequences = 0;        // per group, at input + output tokens each
  PhaseCost prefill;                // one prompt per group (CP: one prompt over all groups)
  std::vector<PhaseCost> decode;    // one per workload concurrency; empty for CP layouts
};

// Seconds for one collective over `ranks` (formulas above).
double ring_all_reduce_seconds(double bytes, int ranks, const PlanHardware& hw);
double ring_all_gather_seconds(double bytes, int ranks, const PlanHardware& hw);
double all_to_all_seconds(double bytes_leaving, int ranks, const PlanHardware& hw);
// E * (1 - (1 - k/E)^tokens): experts a batch touches on average.
double expected_distinct_experts(int64_t experts, int64_t used, double tokens);

// The layouts for the machine's device count (see the list above), each costed.
std::vector<Layout> enumerate_layouts(const PlanModel& m, int devices);
std::vector<LayoutPlan> plan_layouts(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w);

// The best fitting layout for prefill / for decode at concurrency index i (nullptr: none fits).
const LayoutPlan* best_prefill(const std::vector<LayoutPlan>& plans);
const LayoutPlan* best_decode(const std::vector<LayoutPlan>& plans, size_t i);
// Why `best` beats the runner-up, from the two step costs: the term that differs most, with both
// splits in ms per step. Empty when no other layout fits.
std::string explain_best(const std::vector<LayoutPlan>& plans, const LayoutPlan& best, bool decode, size_t i);

}  // namespace fp
