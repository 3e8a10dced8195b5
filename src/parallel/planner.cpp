// parallel/planner.cpp — the layout cost model (see planner.h for the formulas and layouts), and
// the PlanModel of a Hugging Face config.json.
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

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

std::string gib(double bytes) { return fmt("%.2f GiB", bytes / kGiB); }

void finish(PhaseCost& c) {
  c.seconds = std::max(c.compute_s, c.memory_s) + c.comm_s;
  c.bottleneck = bottleneck_of(c);
}

// What one step runs through the layers, seen from one rank of one group.
struct StepShape {
  double tokens = 0;      // tokens of this group
  double all_tokens = 0;  // tokens of every group (what EP-partitioned experts see)
  double attn_flops = 0;  // the group's attention score and value FLOPs
  double kv_read = 0;     // KV bytes one rank reads
  double kv_gather = 0;   // CP: K/V bytes of one layer all-gathered across the groups
  double logit_rows = 0;  // rows whose logits the step computes (all-gathered across output_ranks)
};

// The ranks the output projection is split over: those holding slices of the model.
int output_ranks(const Layout& l) { return l.ep > 1 ? l.tp * l.groups : l.tp; }

PhaseCost step_cost(const PlanModel& m, const Layout& l, const PlanHardware& hw, const StepShape& s) {
  const double t = l.tp, L = static_cast<double>(m.n_layers), moe_l = static_cast<double>(m.n_moe_layers);
  const double k = static_cast<double>(m.n_used), hidden = static_cast<double>(m.dim) * hw.activation_bytes;
  const double hidden_all = s.tokens * hidden;  // the group's hidden states, bytes
  double flops = (s.tokens * m.matmul_flops_per_token + s.attn_flops) / t +
                 s.logit_rows * m.output_flops / output_ranks(l);  // a prefill's last rows only
  double bytes = m.replicated_bytes + m.split_bytes / t + m.output_bytes / output_ranks(l) + s.kv_read;
  // Dense layers: all-reduce after attention and after the FFN.
  double comm = 2 * (L - moe_l) * ring_all_reduce_seconds(hidden_all, l.tp, hw);
  if (m.moe() && l.ep == 1) {  // experts sliced like the FFN
    flops += s.tokens * (m.shared_flops + moe_l * k * m.expert_flops) / t;
    bytes += (m.shared_bytes + moe_l * expected_distinct_experts(m.n_experts, m.n_used, s.tokens) * m.expert_bytes) / t;
    comm += 2 * moe_l * ring_all_reduce_seconds(hidden_all, l.tp, hw);
  } else if (m.moe()) {  // experts partitioned over ep ranks, tokens dispatched and combined
    const double ep = l.ep;
    flops += s.tokens / t * m.shared_flops + s.all_tokens * k * moe_l * m.expert_flops / ep;
    bytes += m.shared_bytes + moe_l * expected_distinct_experts(m.n_experts, m.n_used, s.all_tokens) / ep * m.expert_bytes;
    const double a2a = all_to_all_seconds(s.tokens / t * k * (ep - 1) / ep * hidden, l.ep, hw);
    comm += moe_l * (ring_all_reduce_seconds(hidden_all, l.tp, hw) + 2 * a2a + ring_all_gather_seconds(hidden_all, l.tp, hw));
  }
  if (l.cp) comm += L * ring_all_gather_seconds(s.kv_gather, l.groups, hw);
  if (m.vocab > 0) comm += ring_all_gather_seconds(s.logit_rows * static_cast<double>(m.vocab) * 4, output_ranks(l), hw);
  PhaseCost c;
  c.compute_s = flops / (hw.compute_tflops * 1e12 * hw.compute_efficiency);
  c.memory_s = bytes / (hw.memory_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency);
  c.comm_s = comm;
  finish(c);
  if (comm > 0 && hw.link_overlaps) c.overlapped_s = std::max({c.compute_s, 2 * c.memory_s, comm});
  return c;
}

double resident_weight_bytes(const PlanModel& m, const Layout& l) {
  const double routed = static_cast<double>(m.n_moe_layers * m.n_experts) * m.expert_bytes;
  const double every_rank = m.replicated_bytes + m.embedding_bytes + (m.tied_output ? 0 : m.output_bytes / output_ranks(l));
  if (l.ep == 1) return every_rank + (m.split_bytes + m.shared_bytes + routed) / l.tp;
  return every_rank + m.split_bytes / l.tp + m.shared_bytes + routed / l.ep;
}

std::string tp_dp_name(int t, int g) {
  if (g == 1) return "TP" + std::to_string(t);
  if (t == 1) return "DP" + std::to_string(g);
  return "TP" + std::to_string(t) + "xDP" + std::to_string(g);
}

int64_t int_field(const nlohmann::json& j, const char* k, const std::string& where, bool required, int64_t fallback) {
  if (!j.contains(k) || j[k].is_null()) {
    FP_CHECK(!required, where, ": field '", k, "' (a positive integer) is required");
    return fallback;
  }
  FP_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() >= (required ? 1 : 0), where, ": field '", k, "' must be a ",
           required ? "positive" : "non-negative", " integer, got ", j[k].dump());
  return j[k].get<int64_t>();
}
// The sliding window and its layers: layer_types where the config lists them (transformers v5,
// gpt-oss, Gemma 3, Qwen), else the pattern of the model_type (Gemma 2 and gpt-oss: the even
// layers; Gemma 3: five of every six; Mistral, Mixtral, Phi-3: all; Qwen2/3 only with
// use_sliding_window, from max_window_layers on).
void read_hf_windows(PlanModel& m, const nlohmann::json& j, const std::string& where) {
  if (!j.contains("sliding_window") || j["sliding_window"].is_null()) return;
  const int64_t window = int_field(j, "sliding_window", where, false, 0);
  const std::string type = j.value("model_type", std::string());
  if (window <= 0) return;
  if ((type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe") && !j.value("use_sliding_window", false)) return;
  std::vector<bool> sliding;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    FP_CHECK(j["layer_types"].is_array() && static_cast<int64_t>(j["layer_types"].size()) == m.n_layers, where,
             ": field 'layer_types' must list one type per layer (", m.n_layers, ")");
    for (const auto& t : j["layer_types"]) sliding.push_back(t == "sliding_attention");
  } else {
    for (int64_t l = 0; l < m.n_layers; ++l) {
      bool s = false;
      if (type == "gemma2" || type == "gpt_oss") s = l % 2 == 0;
      else if (type == "gemma3" || type == "gemma3_text") s = (l + 1) % j.value("sliding_window_pattern", 6) != 0;
      else if (type == "qwen2" || type == "qwen3") s = l >= j.value("max_window_layers", int64_t{28});
      else if (type == "mistral" || type == "mixtral" || type == "phi3") s = true;
      else if (type == "olmo3") s = (l + 1) % 4 != 0;
      else if (type == "exaone4") {  // sliding_window_pattern: every p-th layer global, or a string "LLLG"
        const nlohmann::json p = j.contains("sliding_window_pattern") ? j["sliding_window_pattern"] : nlohmann::json(4);
        const int64_t every = p.is_string() ? static_cast<int64_t>(p.get<std::string>().size())
                              : p.is_number_integer() ? p.get<int64_t>() : 0;
        FP_CHECK(every >= 1, where, ": field 'sliding_window_pattern' ", p.dump(), " is not a positive layer count");
        s = (l + 1) % every != 0;
      }
      else FP_CHECK(false, where, ": sliding_window ", window, " without layer_types on model_type '", type,
                    "': say which layers slide the window (layer_types)");
      sliding.push_back(s);
    }
  }
  m.window = window;
  m.n_window_layers = std::count(sliding.begin(), sliding.end(), true);
  if (m.n_window_layers == 0) m.window = 0;
}
// Llama 4's chunked layers (attention_chunk_size; the rotating ones, no_rope_layers 1, or
// layer_types' chunked_attention) keep the KV of their chunk only: a window as long as the chunk.
void read_hf_llama4_chunks(PlanModel& m, const nlohmann::json& j, const std::string& where) {
  if (j.contains("attention_chunk_size") && j["attention_chunk_size"].is_null()) return;
  const int64_t chunk = int_field(j, "attention_chunk_size", where, false, 8192);
  if (chunk <= 0) return;
  int64_t n = 0;
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (const auto& t : j["layer_types"]) n += t == "chunked_attention";
  } else if (j.contains("no_rope_layers") && j["no_rope_layers"].is_array() && !j["no_rope_layers"].empty()) {
    for (int64_t l = 0; l < m.n_layers && l < static_cast<int64_t>(j["no_rope_layers"].size()); ++l) n += j["no_rope_layers"][static_cast<size_t>(l)] == 1;
  } else {
    const int64_t every = std::max<int64_t>(1, int_field(j, "no_rope_layer_interval", where, false, 4));
    for (int64_t l = 0; l < m.n_layers; ++l) n += (l + 1) % every != 0;
  }
  if (n == 0) return;
  m.window = chunk;
  m.n_window_layers = n;
}
}  // namespace

PlanModel plan_model_from_hf_config(const nlohmann::json& outer, const std::string& where, double wb) {
  FP_CHECK(outer.is_object(), where, ": expected a JSON object");
  // A multimodal checkpoint's config (Llama 4, Gemma 3, Mistral 3): its text model's keys.
  nlohmann::json text;
  if (!outer.contains("hidden_size") && outer.contains("text_config") && outer["text_config"].is_object()) {
    text = outer["text_config"];
    if (outer.contains("tie_word_embeddings") && !text.contains("tie_word_embeddings")) text["tie_word_embeddings"] = outer["tie_word_embeddings"];
  }
  const nlohmann::json& j = text.is_object() ? text : outer;
  const std::string model_type = j.value("model_type", std::string());
  const bool llama4 = model_type == "llama4_text" || model_type == "llama4";
  auto get = [&](const char* k) { return int_field(j, k, where, true, 0); };
  auto opt = [&](const char* k, int64_t fallback) { return int_field(j, k, where, false, fallback); };
  PlanModel m;
  m.name = where;
  m.dim = get("hidden_size");
  m.n_layers = get("num_hidden_layers");
  m.n_heads = get("num_attention_heads");
  m.n_kv_heads = j.contains("num_key_value_heads") ? get("num_key_value_heads") : m.n_heads;
  m.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? get("head_dim") : m.dim / m.n_heads;
  const double d = static_cast<double>(m.dim), H = static_cast<double>(m.n_heads), vocab = static_cast<double>(get("vocab_size"));

  read_hf_windows(m, j, where);
  if (llama4) read_hf_llama4_chunks(m, j, where);
  // Experts: DeepSeek's n_routed_experts, Qwen's num_experts, or Mixtral's / gpt-oss's
  // num_local_experts (experts as wide as intermediate_size); which layers have them.
  // ERNIE 4.5: moe_num_experts, moe_k, moe_num_shared_experts, sparse layers from
  // moe_layer_start_index to moe_layer_end_index, every moe_layer_interval-th.
  const bool ernie = j.contains("moe_num_experts");
  const bool local_experts = !j.contains("n_routed_experts") && !j.contains("num_experts") && j.contains("num_local_experts");
  m.n_experts = ernie                            ? opt("moe_num_experts", 0)
                : j.contains("n_routed_experts") ? opt("n_routed_experts", 0)
                : local_experts                  ? opt("num_local_experts", 0)
                                                 : opt("num_experts", 0);
  int64_t moe_ff = 0, shared_ff = 0, first_dense = 0, step = 1;
  std::vector<int64_t> mlp_only;
  if (m.moe()) {
    m.n_used = ernie && j.contains("moe_k") ? get("moe_k") : get("num_experts_per_tok");
    FP_CHECK(m.n_used <= m.n_experts, where, ": field 'num_experts_per_tok' (", m.n_used, ") exceeds the ", m.n_experts,
             " routed experts");
    moe_ff = local_experts && !j.contains("moe_intermediate_size") ? get("intermediate_size") : get("moe_intermediate_size");
    shared_ff = opt("n_shared_experts", 0) * moe_ff;
    if (j.contains("shared_expert_intermediate_size")) shared_ff = opt("shared_expert_intermediate_size", 0);  // qwen2_moe
    if (j.contains("shared_intermediate_size")) shared_ff = opt("shared_intermediate_size", 0);  // granitemoeshared
    if (ernie) shared_ff = opt("moe_num_shared_experts", 2) * moe_ff;
    if (llama4) shared_ff = moe_ff;  // one shared expert as wide as a routed one
    first_dense = opt("first_k_dense_replace", 0);
    step = j.contains("decoder_sparse_step") ? get("decoder_sparse_step") : 1;
    if (ernie) {
      first_dense = opt("moe_layer_start_index", 1);
      step = j.contains("moe_layer_interval") ? get("moe_layer_interval") : 1;
      const int64_t end = j.contains("moe_layer_end_index") && j["moe_layer_end_index"].is_number_integer()
                              ? j["moe_layer_end_index"].get<int64_t>()
                              : -1;
      for (int64_t l = end < 0 ? m.n_layers : end + 1; l < m.n_layers; ++l) mlp_only.push_back(l);
    }
    if (llama4) {  // sparse every interleave_moe_layer_step-th layer, or the layers moe_layers lists
      step = j.contains("interleave_moe_layer_step") ? get("interleave_moe_layer_step") : 1;
      if (j.contains("moe_layers") && j["moe_layers"].is_array()) {
        step = 1;
        for (int64_t l = 0; l < m.n_layers; ++l)
          if (std::find(j["moe_layers"].begin(), j["moe_layers"].end(), nlohmann::json(l)) == j["moe_layers"].end()) mlp_only.push_back(l);
      }
    }
    if (j.contains("mlp_only_layers")) {
      FP_CHECK(j["mlp_only_layers"].is_array(), where, ": field 'mlp_only_layers' must be an array of layer indices");
      for (const auto& v : j["mlp_only_layers"]) {
        FP_CHECK(v.is_number_integer(), where, ": field 'mlp_only_layers' must be an array of layer indices, has ", v.dump());
        mlp_only.push_back(v.get<int64_t>());
      }
    }
  }
  for (int64_t l = 0; l < m.n_layers; ++l)
    if (m.moe() && l >= first_dense && (l + 1) % step == 0 && std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end())
      ++m.n_moe_layers;
  const double n_dense = static_cast<double>(m.n_layers - m.n_moe_layers), n_moe = static_cast<double>(m.n_moe_layers);
  const double ff = n_dense <= 0 ? 0 : static_cast<double>(llama4 ? opt("intermediate_size_mlp", 16384) : get("intermediate_size"));

  // Attention: GQA q, k, v, o; or MLA's compressed query, latent K/V row, its up-projection, o.
  double attn = 0, attn_replicated = 0;
  m.kv_lora_rank = opt("kv_lora_rank", 0);
  if (m.mla()) {
    m.rope_dim = get("qk_rope_head_dim");
    const int64_t nope = get("qk_nope_head_dim");
    m.v_head_dim = get("v_head_dim");
    m.head_dim = nope + m.rope_dim;
    m.n_kv_heads = m.n_heads;
    const double q_lora = static_cast<double>(opt("q_lora_rank", 0)), qk = H * static_cast<double>(m.head_dim);
    const double kv_lora = static_cast<double>(m.kv_lora_rank), v = static_cast<double>(m.v_head_dim);
    // The down-projections to q_lora and to the latent row have no heads: every TP rank holds them.
    attn_replicated = (q_lora > 0 ? d * q_lora : 0) + d * (kv_lora + static_cast<double>(m.rope_dim));
    attn = (q_lora > 0 ? q_lora * qk : d * qk) + kv_lora * H * static_cast<double>(nope + m.v_head_dim) + H * v * d;
  } else {
    const double q = H * static_cast<double>(m.head_dim), kv = static_cast<double>(m.n_kv_heads * m.head_dim);
    attn = d * q + 2 * d * kv + q * d;
  }
  const bool tied = j.value("tie_word_embeddings", false);
  const double layers = static_cast<double>(m.n_layers) * attn + n_dense * 3 * d * ff;  // split across TP
  const double routers = n_moe * d * static_cast<double>(m.n_experts) + static_cast<double>(m.n_layers) * attn_replicated;
  m.split_bytes = layers * wb;
  m.replicated_bytes = routers * wb;
  m.embedding_bytes = vocab * d * wb;
  m.output_bytes = vocab * d * wb;
  m.tied_output = tied;
  m.vocab = static_cast<int64_t>(vocab);
  m.matmul_flops_per_token = 2 * (layers + routers);  // (the cost model divides all of it over TP ranks)
  m.output_flops = 2 * vocab * d;
  m.ff = static_cast<int64_t>(ff);
  if (m.moe()) {
    m.expert_bytes = 3 * d * static_cast<double>(moe_ff) * wb;
    m.expert_flops = 6 * d * static_cast<double>(moe_ff);
    m.shared_bytes = n_moe * 3 * d * static_cast<double>(shared_ff) * wb;
    m.shared_flops = n_moe * 6 * d * static_cast<double>(shared_ff);
    m.ff = std::max(m.ff, m.n_used * moe_ff + shared_ff);
  }
  return m;
}

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
  for (auto [key, field] : {std::pair{"compute_efficiency", &h.compute_efficiency}, {"bandwidth_efficiency", &h.bandwidth_efficiency}}) {
    *field = positive(j, key, where, false, 1);
    FP_CHECK(*field > 0 && *field <= 1, where, ": field '", key, "' is a fraction of the peak in (0, 1], got ", *field);
  }
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
    h.collective_us = positive(l, "collective_us", where + " interconnect", false, 0);
    if (l.contains("overlaps_compute")) {
      FP_CHECK(l["overlaps_compute"].is_boolean(), where, " interconnect: field 'overlaps_compute' must be true or false");
      h.link_overlaps = l["overlaps_compute"].get<bool>();
    }
  }
  return h;
}

double ring_all_reduce_seconds(double bytes, int ranks, const PlanHardware& hw) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return hw.collective_us * 1e-6 + 2 * (n - 1) / n * bytes / (hw.link_gbps * 1e9) + 2 * (n - 1) * hw.link_latency_us * 1e-6;
}

double ring_all_gather_seconds(double bytes, int ranks, const PlanHardware& hw) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return hw.collective_us * 1e-6 + (n - 1) / n * bytes / (hw.link_gbps * 1e9) + (n - 1) * hw.link_latency_us * 1e-6;
}

double all_to_all_seconds(double bytes_leaving, int ranks, const PlanHardware& hw) {
  if (ranks <= 1) return 0;
  return hw.collective_us * 1e-6 + bytes_leaving / (hw.link_gbps * 1e9) + (ranks - 1) * hw.link_latency_us * 1e-6;
}

double expected_distinct_experts(int64_t experts, int64_t used, double tokens) {
  if (experts <= 0) return 0;
  const double e = static_cast<double>(experts);
  return e * (1 - std::pow(1 - static_cast<double>(used) / e, tokens));
}

std::vector<Layout> enumerate_layouts(const PlanModel& m, int n) {
  std::vector<Layout> out;
  for (int t = 1; t <= n; ++t) {
    if (n % t != 0) continue;
    const int g = n / t;
    out.push_back({tp_dp_name(t, g), t, g, 1, false});
    if (g > 1) out.push_back({"CP" + std::to_string(g) + (t > 1 ? "xTP" + std::to_string(t) : ""), t, g, 1, true});
  }
  if (!m.moe() || n == 1) return out;
  const std::string ep = "+EP" + std::to_string(n);
  for (int t = 1; t <= n; ++t) {
    if (n % t != 0) continue;
    const int g = n / t;
    const std::string tp = t > 1 ? "xTP" + std::to_string(t) : "";
    out.push_back({g == 1 ? "TP" + std::to_string(t) + ep : "DP" + std::to_string(g) + tp + "-attn" + ep, t, g, n, false});
    if (g > 1) out.push_back({"CP" + std::to_string(g) + tp + "-attn" + ep, t, g, n, true});
  }
  return out;
}

std::vector<LayoutPlan> plan_layouts(const PlanModel& m, const PlanHardware& hw, const PlanWorkload& w) {
  FP_CHECK(m.n_layers > 0 && m.dim > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0, "plan: model '", m.name,
           "' has no layers or heads");
  FP_CHECK(!m.moe() || (m.n_used >= 1 && m.n_used <= m.n_experts && m.n_moe_layers <= m.n_layers), "plan: model '", m.name,
           "' has ", m.n_used, " of ", m.n_experts, " experts per token on ", m.n_moe_layers, " layers");
  FP_CHECK(w.input_len >= 1 && w.output_len >= 1, "plan: input and output lengths must be at least 1");
  FP_CHECK(m.window >= 0 && m.n_window_layers >= 0 && m.n_window_layers <= m.n_layers && (m.window > 0) == (m.n_window_layers > 0),
           "plan: model '", m.name, "' has a window of ", m.window, " on ", m.n_window_layers, " of ", m.n_layers, " layers");
  const double L = static_cast<double>(m.n_layers), H = static_cast<double>(m.n_heads);
  const double in = static_cast<double>(w.input_len), seq = static_cast<double>(w.input_len + w.output_len);
  const double ctx = in + static_cast<double>(w.output_len) / 2;  // mean context during decode
  // Sliding-window layers keep and attend to at most `window` positions (see the top): their
  // share of the layers, and the positions a layer holds / attends to, as fractions of the
  // full-attention layers' (1 without windows).
  const double win = static_cast<double>(m.window), L_win = static_cast<double>(m.n_window_layers);
  auto layer_share = [&](double full, double windowed) { return m.window > 0 ? ((L - L_win) * full + L_win * windowed) / L : full; };
  const double seq_held = layer_share(seq, std::min(seq, win));  // KV positions per layer, per sequence
  const double ctx_read = layer_share(ctx, std::min(ctx, win));  // positions a decode step reads per layer
  // Prefill: query i attends to min(i, window) positions; over a prompt of `in` tokens (causal).
  const double prefill_pairs = layer_share(in * in / 2, in <= win ? in * in / 2 : in * win - win * win / 2);
  // Attention FLOPs per query token per context position: QK^T and PV, 2 FLOPs a multiply-add.
  // MLA prefill expands the latent rows to per-head K (nope + rope) and V; decode attends over the
  // latent rows themselves (scores over kv_lora + rope, values over kv_lora).
  const double hd = static_cast<double>(m.head_dim);
  const double attn_prefill = m.mla() ? 2 * L * H * (hd + static_cast<double>(m.v_head_dim)) : 4 * L * H * hd;
  const double attn_decode =
      m.mla() ? 2 * L * H * static_cast<double>(2 * m.kv_lora_rank + m.rope_dim) : 4 * L * H * hd;
  std::vector<LayoutPlan> out;
  for (const Layout& l : enumerate_layouts(m, hw.devices)) {
    LayoutPlan p;
    p.layout = l;
    const std::string at = l.name + ": ";
    if (m.n_heads % l.tp != 0 || m.n_kv_heads % l.tp != 0) {
      p.why_not = "TP=" + std::to_string(l.tp) + " does not divide the " + std::to_string(m.n_heads) + " heads / " +
                  std::to_string(m.n_kv_heads) + " KV heads";
      out.push_back(p);
      continue;
    }
    if (m.moe() && m.n_experts % l.ep != 0) {
      p.why_not = "EP=" + std::to_string(l.ep) + " does not divide the " + std::to_string(m.n_experts) + " experts";
      out.push_back(p);
      continue;
    }
    const double weights = resident_weight_bytes(m, l);
    const double prompt = l.cp ? in / l.groups : in;  // tokens a group prefills at once
    const double activations =
        prompt * (4 * static_cast<double>(m.dim) + 2 * static_cast<double>(m.ff) / l.tp) * hw.activation_bytes;
    p.weight_gib = weights / kGiB;
    p.activation_gib = activations / kGiB;
    // One position of every layer.
    const double per_position = m.mla() ? L * static_cast<double>(m.kv_lora_rank + m.rope_dim) * hw.kv_bytes
                                        : 2 * L * static_cast<double>(m.n_kv_heads / l.tp * m.head_dim) * hw.kv_bytes;
    p.kv_bytes_per_token = per_position;
    const double available = (hw.memory_gib - hw.reserved_gib) * kGiB;
    const double free_bytes = available - weights - activations;
    if (free_bytes <= 0) {
      p.why_not = "weights " + gib(weights) + " + activations " + gib(activations) + " per device, " + gib(available) +
                  " available (short by " + gib(-free_bytes) + ")";
      out.push_back(p);
      continue;
    }
    // Per sequence at the workload's length: full layers hold every position, windowed ones their window.
    const double seq_bytes = per_position * seq_held;
    p.max_sequences = static_cast<int64_t>(std::floor(free_bytes / seq_bytes));
    if (m.window > 0) p.kv_bytes_per_token = seq_bytes / seq;  // a sequence's KV over its tokens
    p.kv_capacity_tokens = static_cast<int64_t>(std::floor(free_bytes / p.kv_bytes_per_token));
    if (p.max_sequences < 1) {
      p.why_not = "the KV cache holds " + std::to_string(p.kv_capacity_tokens) + " tokens per group, one sequence needs " +
                  std::to_string(w.input_len + w.output_len) + " (short by " +
                  std::to_string(w.input_len + w.output_len - p.kv_capacity_tokens) + " tokens)";
      out.push_back(p);
      continue;
    }
    p.fits = true;
    // Prefill: one prompt per group, groups in parallel; CP: one prompt over the groups, each
    // chunk attending to the earlier ones (balanced, so the causal work splits evenly).
    StepShape pf;
    pf.tokens = prompt;
    pf.all_tokens = l.cp ? in : in * l.groups;
    pf.attn_flops = attn_prefill * prefill_pairs / (l.cp ? l.groups : 1);
    pf.kv_gather = l.cp ? in * per_position / L : 0;
    pf.logit_rows = l.ep > 1 && !l.cp ? l.groups : 1;  // each prompt's last token (EP: every group's)
    p.prefill = step_cost(m, l, hw, pf);
    p.prefill.batch = 1;
    p.prefill.tokens_per_s = (l.cp ? in : in * l.groups) / p.prefill.seconds;
    if (p.prefill.overlapped_s > 0) p.prefill.overlapped_tokens_per_s = (l.cp ? in : in * l.groups) / p.prefill.overlapped_s;
    if (l.cp) {  // prefill only
      out.push_back(p);
      continue;
    }
    // Decode: every group steps its share of the sequences, reading its weights once, the
    // experts its tokens touch, and each sequence's KV.
    for (int c : w.concurrency) {
      const int64_t want = (c + l.groups - 1) / l.groups;
      StepShape s;
      const int64_t batch = std::min<int64_t>(want, p.max_sequences);
      s.tokens = static_cast<double>(batch);
      s.all_tokens = std::min(static_cast<double>(c), s.tokens * l.groups);  // sequences stepping together
      s.attn_flops = attn_decode * s.tokens * ctx_read;
      s.kv_read = s.tokens * ctx_read * per_position;
      s.logit_rows = l.ep > 1 ? s.all_tokens : s.tokens;
      PhaseCost d = step_cost(m, l, hw, s);
      d.batch = batch;
      d.kv_capped = batch < want;
      d.tokens_per_s = s.all_tokens / d.seconds;
      if (d.overlapped_s > 0) d.overlapped_tokens_per_s = s.all_tokens / d.overlapped_s;
      p.decode.push_back(d);
    }
    out.push_back(p);
  }
  return out;
}

const LayoutPlan* best_prefill(const std::vector<LayoutPlan>& plans) {
  const LayoutPlan* best = nullptr;
  for (const LayoutPlan& p : plans)
    if (p.fits && (!best || p.prefill.tokens_per_s > best->prefill.tokens_per_s)) best = &p;
  return best;
}

const LayoutPlan* best_decode(const std::vector<LayoutPlan>& plans, size_t i) {
  const LayoutPlan* best = nullptr;
  for (const LayoutPlan& p : plans)
    if (p.fits && i < p.decode.size() && (!best || p.decode[i].tokens_per_s > best->decode[i].tokens_per_s)) best = &p;
  return best;
}

std::string explain_best(const std::vector<LayoutPlan>& plans, const LayoutPlan& best, bool decode, size_t i) {
  auto cost = [&](const LayoutPlan& p) -> const PhaseCost& { return decode ? p.decode[i] : p.prefill; };
  const LayoutPlan* next = nullptr;
  for (const LayoutPlan& p : plans)
    if (&p != &best && p.fits && (!decode || i < p.decode.size()) &&
        (!next || cost(p).tokens_per_s > cost(*next).tokens_per_s))
      next = &p;
  if (!next) return "";
  const PhaseCost &a = cost(best), &b = cost(*next);
  // Compare per token: layouts step different numbers of tokens (groups, KV caps, CP).
  auto tokens = [](const PhaseCost& c) { return c.tokens_per_s * c.seconds; };
  const double ta = tokens(a), tb = tokens(b);
  const double comm_saved = b.comm_s / tb - a.comm_s / ta;
  const double roof_saved = std::max(b.compute_s, b.memory_s) / tb - std::max(a.compute_s, a.memory_s) / ta;
  std::string lead;
  if (comm_saved > 0 && comm_saved >= roof_saved) lead = "less communication per token";
  else if (roof_saved > 0) lead = b.compute_s >= b.memory_s ? "less compute per token" : "less memory traffic per token";
  else lead = "more tokens per step";
  std::string s = best.layout.name + " rather than " + next->layout.name +
                  fmt(" (%.1f vs %.1f tok/s): ", a.tokens_per_s, b.tokens_per_s) + lead +
                  fmt("; per step of %.0f vs %.0f tokens: communication %.3f vs %.3f ms,", ta, tb, a.comm_s * 1e3, b.comm_s * 1e3) +
                  fmt(" compute %.3f vs %.3f ms, memory %.3f vs %.3f ms", a.compute_s * 1e3, b.compute_s * 1e3, a.memory_s * 1e3,
                      b.memory_s * 1e3);
  return s;
}

}  // namespace fp
