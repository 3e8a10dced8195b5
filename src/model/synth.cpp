// model/synth.cpp — random weights in Hugging Face layout, written as GGUF (with llama.cpp's
// q/k row permutation for Llama, so RoPE rotates adjacent pairs) or as safetensors.
#include "model/synth.h"

#include "model/lora.h"

#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/hash.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/model_file.h"
#include "model/tensor_names.h"

namespace fp {
namespace {

struct HfTensor {
  std::vector<int64_t> shape;  // row-major [out, in] for matrices
  std::vector<float> data;
  bool matrix = false;         // a 2-D weight that takes --type
  // How the values are drawn (for lazy generation): 0 matrix N(0, sd), 1 vector base + N(0, sd), 2 N(0, 1).
  int kind = 0;
  float base = 0.0f, sd = 1.0f;
};

// Box-Muller over a 64-bit Mersenne Twister: the same values on every platform.
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  float operator()() {
    double u1 = (static_cast<double>(rng_() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = static_cast<double>(rng_() >> 11) / 9007199254740992.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
 private:
  std::mt19937_64 rng_;
};

uint64_t name_hash(const std::string& s) { return fnv1a64(s); }

// synth --arch names: the dense ones, and Hugging Face model_type names for the MoE ones.
std::string canonical_arch(const std::string& arch) {
  if (arch == "qwen3_moe" || arch == "qwen3moe") return "qwen3moe";
  if (arch == "qwen2_moe" || arch == "qwen2moe") return "qwen2moe";
  if (arch == "mixtral") return "mixtral";
  if (arch == "granitemoe" || arch == "granitemoeshared") return "granitemoe";
  if (arch == "minimax_m2" || arch == "minimax-m2") return "minimax-m2";
  if (arch == "ernie4_5_moe" || arch == "ernie4_5-moe") return "ernie4_5-moe";
  if (arch == "hunyuan_v1_dense" || arch == "hunyuan-dense") return "hunyuan-dense";
  if (arch == "hunyuan_v1_moe" || arch == "hunyuan-moe") return "hunyuan-moe";
  if (arch == "llama4" || arch == "llama4_text") return "llama4";
  if (arch == "deepseek_v3" || arch == "deepseek_v2") return "deepseek2";
  if (arch == "glm4_moe" || arch == "glm4moe") return "glm4moe";
  if (arch == "gpt_oss" || arch == "gpt-oss") return "gpt-oss";
  if (arch == "gemma3" || arch == "gemma3_text") return "gemma3";
  if (arch == "mistral") return "llama";  // a Llama with a window on every layer (MistralForCausalLM)
  FP_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma2" || arch == "phi3" || arch == "smollm3" ||
               arch == "olmo2" || arch == "glm4" || arch == "granite" || arch == "seed_oss" || arch == "ernie4_5" || arch == "exaone4" || arch == "olmo3" ||
                   arch == "hunyuan-dense",
           "synth: --arch '", arch,
           "' is not one of llama, mistral, qwen2, qwen3, phi3, smollm3, olmo2, glm4, granite, seed_oss, ernie4_5, ernie4_5_moe, exaone4, olmo3, hunyuan_v1_dense, hunyuan_v1_moe, llama4_text, granitemoe, granitemoeshared, minimax_m2, qwen2_moe, qwen3_moe, mixtral, deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, gemma2, gemma3");
  return arch;
}

// MoE / MLA keys (Hugging Face names) with small defaults; the same values go into config.json.
template <class GetI>
void synth_moe_config(ModelConfig& c, const std::string& arch_in, const nlohmann::json& j, GetI geti) {
  auto getz = [&](const char* k, int64_t def) {  // non-negative; null means 0
    if (!j.contains(k) || j[k].is_null()) return def;
    FP_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() >= 0, "synth --config: '", k, "' should be a non-negative integer, found ", j[k].dump());
    return j[k].get<int64_t>();
  };
  MoeConfig& e = c.moe;
  e.n_used = geti("num_experts_per_tok", 2);
  e.ff = geti("moe_intermediate_size", std::max<int64_t>(c.hidden_dim / 4, 8));
  if (c.arch == "mixtral") {  // every layer sparse; softmax over all experts, the top k renormalised
    e.n_experts = geti("num_local_experts", 4);
    e.ff = c.hidden_dim;
    e.norm_topk = true;
    return;
  }
  if (c.arch == "llama4") {  // Llama4TextConfig: top-1 experts and one shared expert of intermediate_size
    e.n_experts = geti("num_local_experts", 4);
    e.n_used = geti("num_experts_per_tok", 1);
    FP_CHECK(e.n_used == 1, "synth: llama4's router scales the expert's input: top-1 routing only");
    e.ff = e.shared_ff = c.hidden_dim;
    e.n_shared = 1;
    e.scoring = "sigmoid";
    e.scale_input = true;
    e.sparse_step = geti("interleave_moe_layer_step", 1);
    return;
  }
  if (c.arch == "hunyuan-moe") {  // HunYuanMoEV1Config: every layer sparse, experts and one shared MLP of intermediate_size
    e.n_experts = geti("num_experts", 4);
    e.n_used = geti("moe_topk", 2);
    e.ff = c.hidden_dim;
    e.n_shared = 1;
    e.shared_ff = c.hidden_dim;
    e.norm_topk = true;
    return;
  }
  if (c.arch == "ernie4_5-moe") {  // Ernie4_5_MoeConfig's keys: a softmax router with a selection bias, shared experts
    e.n_experts = geti("moe_num_experts", 8);
    e.n_used = geti("moe_k", 2);
    e.ff = geti("moe_intermediate_size", std::max<int64_t>(c.hidden_dim / 4, 8));
    e.n_shared = getz("moe_num_shared_experts", 1);
    e.first_dense = getz("moe_layer_start_index", 1);
    e.sparse_step = geti("moe_layer_interval", 1);
    const int64_t end = j.value("moe_layer_end_index", int64_t{-1});
    for (int64_t l = end < 0 ? c.n_layers : end + 1; l < c.n_layers; ++l) e.dense_layers.push_back(l);
    e.norm_topk = true;
    e.has_bias = true;
    return;
  }
  if (c.arch == "minimax-m2") {  // Mixtral's experts, GLM-4.5's router without groups or a scale
    e.n_experts = geti("num_local_experts", 8);
    e.ff = c.hidden_dim;
    e.norm_topk = true;
    e.scoring = "sigmoid";
    e.has_bias = true;
    e.group_score = "top2sum";
    return;
  }
  if (c.arch == "granitemoe") {  // Mixtral's routing and experts; GraniteMoeShared: one ungated shared expert
    e.n_experts = geti("num_local_experts", 4);
    e.ff = c.hidden_dim;
    e.norm_topk = true;
    e.shared_ff = getz("shared_intermediate_size", arch_in == "granitemoeshared" ? 2 * c.hidden_dim : 0);
    e.n_shared = e.shared_ff > 0 ? 1 : 0;
    return;
  }
  if (c.arch == "qwen2moe") {  // one shared expert of its own width behind a sigmoid gate
    e.shared_ff = getz("shared_expert_intermediate_size", 2 * e.ff);
    e.n_shared = e.shared_ff > 0 ? 1 : 0;
    e.shared_gate = true;
  }
  if (c.arch == "qwen3moe" || c.arch == "qwen2moe") {
    e.n_experts = geti("num_experts", 8);
    e.norm_topk = j.value("norm_topk_prob", c.arch == "qwen3moe");
    e.sparse_step = geti("decoder_sparse_step", 1);
    if (j.contains("mlp_only_layers")) e.dense_layers = j["mlp_only_layers"].get<std::vector<int64_t>>();
    return;
  }
  if (c.arch == "gpt-oss") {  // a softmax over the top-k router logits, biases everywhere, clamped SwiGLU
    e.n_experts = geti("num_local_experts", 4);
    e.ff = c.hidden_dim;
    e.norm_topk = true;
    e.router_bias = e.expert_bias = e.swiglu_clamped = true;
    e.swiglu_alpha = j.value("swiglu_alpha", 1.702f);
    e.swiglu_limit = j.value("swiglu_limit", 7.0f);
    c.qkv_bias = c.o_bias = c.attn_sinks = true;
    c.sliding_window = j.value("sliding_window", int64_t{0});
    if (c.sliding_window > 0) {
      if (j.contains("layer_types"))
        for (auto& t : j["layer_types"]) c.swa_layers.push_back(t.get<std::string>() == "sliding_attention");
      else
        for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back(l % 2 == 0);
    }
    if (c.rope_scaling.type == "yarn") {
      auto& rs = j.contains("rope_scaling") ? j["rope_scaling"] : j["rope_parameters"];
      c.rope_scaling.original_context = rs.value("original_max_position_embeddings", int64_t{4096});
      c.rope_scaling.beta_fast = rs.value("beta_fast", 32.0f);
      c.rope_scaling.beta_slow = rs.value("beta_slow", 1.0f);
      c.rope_scaling.truncate = rs.value("truncate", true);
      c.rope_scaling.attn_factor = c.rope_scaling.factor > 1 ? 0.1f * std::log(c.rope_scaling.factor) + 1.0f : 1.0f;
    }
    return;
  }
  if (c.arch == "glm4moe") {  // DeepSeek-V3's router over GQA attention
    e.n_experts = geti("n_routed_experts", 8);
    e.n_shared = getz("n_shared_experts", 1);
    e.first_dense = getz("first_k_dense_replace", 1);
    e.scale = j.value("routed_scaling_factor", 1.0f);
    e.norm_topk = j.value("norm_topk_prob", true);
    e.scoring = "sigmoid";
    e.has_bias = true;
    e.group_score = "top2sum";
    e.n_group = geti("n_group", 1);
    e.topk_group = geti("topk_group", 1);
    return;
  }
  const bool v3 = arch_in == "deepseek_v3";
  e.n_experts = geti("n_routed_experts", 8);
  e.n_shared = getz("n_shared_experts", 1);
  e.first_dense = getz("first_k_dense_replace", 1);
  e.scale = j.value("routed_scaling_factor", v3 ? 2.5f : 1.0f);
  e.norm_topk = j.value("norm_topk_prob", v3);
  e.scoring = v3 ? "sigmoid" : "softmax";
  e.has_bias = v3;
  e.group_score = v3 ? "top2sum" : "max";
  const bool grouped = v3 || j.value("topk_method", std::string("greedy")) == "group_limited_greedy";
  e.n_group = grouped ? geti("n_group", 1) : 1;
  e.topk_group = grouped ? geti("topk_group", e.n_group) : 1;
  c.mla.q_lora_rank = getz("q_lora_rank", v3 ? 32 : 0);
  c.mla.kv_lora_rank = geti("kv_lora_rank", 32);
  c.rot_dim = geti("qk_rope_head_dim", 16);
  c.head_dim = geti("qk_nope_head_dim", 32) + c.rot_dim;
  c.v_head_dim = geti("v_head_dim", 32);
  c.n_kv_heads = c.n_heads;
  c.rope_style = RopeStyle::Adjacent;
  if (c.rope_scaling.type == "yarn") {
    auto& rs = j["rope_scaling"];
    c.rope_scaling.original_context = rs.value("original_max_position_embeddings", int64_t{4096});
    c.rope_scaling.beta_fast = rs.value("beta_fast", 32.0f);
    c.rope_scaling.beta_slow = rs.value("beta_slow", 1.0f);
    const float f = c.rope_scaling.factor;
    auto get_mscale = [f](float m) { return f <= 1 ? 1.0f : 0.1f * m * std::log(f) + 1.0f; };
    const float ms = rs.value("mscale", 0.0f), ms_all = rs.value("mscale_all_dim", 0.0f);
    c.rope_scaling.attn_factor = ms != 0 && ms_all != 0 ? get_mscale(ms) / get_mscale(ms_all) : get_mscale(1.0f);
    c.rope_scaling.log_multiplier = 0.1f * ms_all;
  }
}

ModelConfig config_from_json(const std::string& arch_in, const nlohmann::json& j) {
  const std::string arch = canonical_arch(arch_in);
  ModelConfig c;
  c.arch = arch;
  auto geti = [&](const char* k, int64_t def) {
    if (!j.contains(k)) return def;
    FP_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() > 0, "synth --config: '", k, "' should be a positive integer, found ", j[k].dump());
    return j[k].get<int64_t>();
  };
  c.dim = geti("hidden_size", 64);
  c.hidden_dim = geti("intermediate_size", 4 * c.dim);
  c.n_layers = geti("num_hidden_layers", 2);
  c.n_heads = geti("num_attention_heads", 4);
  c.n_kv_heads = geti("num_key_value_heads", c.n_heads);
  c.head_dim = geti("head_dim", c.dim / c.n_heads);
  c.v_head_dim = c.rot_dim = c.head_dim;
  c.n_vocab = geti("vocab_size", 512);
  c.max_context = geti("max_position_embeddings", 512);
  c.rms_eps = j.value("rms_norm_eps", 1e-6f);
  c.rope_theta = j.value("rope_theta", 10000.0f);
  c.tied_output = j.value("tie_word_embeddings", false);
  c.qkv_bias = arch == "qwen2" || (arch == "qwen2moe" && j.value("qkv_bias", true)) || (arch == "seed_oss" && j.value("attention_bias", true)) ||
               ((arch == "glm4moe" || arch == "glm4") && j.value("attention_bias", true));
  c.qk_norm = arch == "qwen3" || arch == "qwen3moe" || (arch == "glm4moe" && j.value("use_qk_norm", false));
  if (arch == "glm4moe") c.rot_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * j.value("partial_rotary_factor", 0.5));
  if (arch == "minimax-m2") {  // MiniMaxM2Config: q/k norms over the whole projection, RoPE on the first rotary_dim
    c.qk_norm = c.qk_norm_full = true;
    c.rot_dim = geti("rotary_dim", c.head_dim / 2);
  }
  if (arch_in == "mistral" || arch == "mixtral") {  // MistralConfig's / MixtralConfig's window, on every layer
    c.sliding_window = j.contains("sliding_window") && !j["sliding_window"].is_null() ? j["sliding_window"].get<int64_t>() : 0;
    c.swa_layers.assign(static_cast<size_t>(c.sliding_window > 0 ? c.n_layers : 0), true);
  }
  if (arch == "granite" || arch == "granitemoe") {  // GraniteConfig's multipliers (kept as the file says; the loaders fold the residual one)
    c.embed_scale = j.value("embedding_multiplier", 1.0f);
    c.residual_scale = j.value("residual_multiplier", 1.0f);
    c.attn_scale = j.value("attention_multiplier", 1.0f);
    c.logit_scale = j.value("logits_scaling", 1.0f);
  }
  if (arch == "glm4") {  // Glm4Config: sandwich norms, the first half of each head rotated in adjacent pairs
    c.post_norms = true;
    c.rope_style = RopeStyle::Adjacent;
    c.rot_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * j.value("partial_rotary_factor", 0.5));
  }
  if (arch == "ernie4_5" || arch == "ernie4_5-moe") {  // Ernie4_5Config: adjacent rotary pairs, tied by default
    c.rope_style = RopeStyle::Adjacent;
    c.tied_output = j.value("tie_word_embeddings", true);
  }
  if (arch == "hunyuan-dense" || arch == "hunyuan-moe") c.qk_norm = c.qk_norm_after_rope = true;  // HunYuan*V1Config: q/k norms after RoPE
  if (arch == "exaone4") {  // Exaone4Config: OLMo 2's norms, per-head q/k norms; global layers without RoPE beside windowed ones
    c.pre_norms = false;
    c.post_norms = c.qk_norm = true;
    c.sliding_window = j.value("sliding_window", int64_t{0});
    const int64_t pattern = geti("sliding_window_pattern", 4);
    for (int64_t l = 0; l < c.n_layers && c.sliding_window > 0; ++l) {
      c.swa_layers.push_back((l + 1) % pattern != 0);
      c.nope_layers.push_back((l + 1) % pattern == 0);
    }
  }
  if (arch == "olmo3") {  // Olmo3Config: OLMo 2's layers, a window on three layers of four, those rotating unscaled
    c.sliding_window = j.value("sliding_window", int64_t{4096});
    for (int64_t l = 0; l < c.n_layers && c.sliding_window > 0; ++l) c.swa_layers.push_back((l + 1) % 4 != 0);
    c.rope_theta_swa = c.rope_theta;
  }
  if (arch == "olmo2" || arch == "olmo3") {  // Olmo2Config: norms after the sublayers, q/k norms over the whole projection
    c.pre_norms = false;
    c.post_norms = c.qk_norm = c.qk_norm_full = true;
  }
  if (arch == "smollm3") {  // SmolLM3Config's keys: no_rope_layers (1: rotates), else every fourth layer NoPE
    if (j.contains("no_rope_layers"))
      for (auto& v : j["no_rope_layers"]) c.nope_layers.push_back(v.get<int>() == 0);
    else
      for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % geti("no_rope_layer_interval", 4) == 0);
  }
  if (arch == "phi3") {  // Phi3Config's keys: partial rotation, a window on every layer
    c.rot_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * j.value("partial_rotary_factor", 1.0));
    c.sliding_window = j.contains("sliding_window") && !j["sliding_window"].is_null() ? j["sliding_window"].get<int64_t>() : 0;
    c.swa_layers.assign(static_cast<size_t>(c.sliding_window > 0 ? c.n_layers : 0), true);
  }
  const char* rope_key = j.contains("rope_scaling") ? "rope_scaling" : "rope_parameters";  // transformers v5 spelling
  if (arch == "phi3" && j.contains(rope_key) && j[rope_key].is_object()) {
    read_hf_longrope(c, j, j[rope_key], "synth --config");
    c.rope_scaling.use_long = c.rope_scaling.type == "longrope" && c.max_context > c.rope_scaling.original_context;
  }
  if (c.rope_scaling.type == "longrope") {
    // read above
  } else if ((arch == "hunyuan-dense" || arch == "hunyuan-moe") && j.contains(rope_key) && j[rope_key].is_object() &&
             j[rope_key].value("type", j[rope_key].value("rope_type", std::string())) == "dynamic") {
    // HunYuanDenseV1Config's NTK alpha: a static base rope_theta * alpha^(head_dim / (head_dim - 2))
    const double alpha = j[rope_key].value("alpha", 1.0), hd = static_cast<double>(c.head_dim);
    c.rope_theta = static_cast<float>(static_cast<double>(c.rope_theta) * std::pow(alpha, hd / (hd - 2)));
  } else if (j.contains(rope_key) && j[rope_key].is_object() && j[rope_key].value("rope_type", std::string()) != "default") {
    auto& rs = j[rope_key];
    c.rope_scaling.type = rs.value("rope_type", rs.value("type", std::string("none")));
    c.rope_scaling.factor = rs.value("factor", 1.0f);
    c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0f);
    c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0f);
    c.rope_scaling.original_context = rs.value("original_max_position_embeddings", int64_t{8192});
    const bool yarn_llama_class = arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" || arch == "olmo3";
    FP_CHECK(c.rope_scaling.type == "linear" || c.rope_scaling.type == "llama3" ||
                 (c.rope_scaling.type == "yarn" && (arch == "deepseek2" || arch == "gpt-oss" || yarn_llama_class)),
             "synth: rope_scaling type '", c.rope_scaling.type,
             "' is not supported (linear, llama3; yarn for deepseek, gpt-oss, llama, qwen2, qwen3, qwen3_moe)");
    if (c.rope_scaling.type == "yarn" && yarn_llama_class) {  // transformers' YaRN: cos/sin times attention_factor
      RopeScaling& y = c.rope_scaling;
      y.original_context = rs.value("original_max_position_embeddings", c.max_context);
      y.beta_fast = rs.value("beta_fast", 32.0f);
      y.beta_slow = rs.value("beta_slow", 1.0f);
      y.truncate = rs.value("truncate", true);
      y.attn_factor = rs.value("attention_factor", y.factor > 1 ? 0.1f * std::log(y.factor) + 1.0f : 1.0f);
    }
  }
  if (arch == "qwen3moe" || arch == "qwen2moe" || arch == "mixtral" || arch == "deepseek2" || arch == "glm4moe" || arch == "gpt-oss" ||
      arch == "granitemoe" || arch == "minimax-m2" || arch == "ernie4_5-moe" || arch == "hunyuan-moe" || arch == "llama4")
    synth_moe_config(c, arch_in, j, geti);
  if (arch == "llama4") {  // Llama4TextConfig's keys (model_file.cpp, load_hf_llama4)
    c.rope_style = RopeStyle::Adjacent;
    c.hidden_dim = geti("intermediate_size_mlp", 2 * c.hidden_dim);  // the dense layers' width
    if (j.contains("no_rope_layers"))
      for (auto& v : j["no_rope_layers"]) c.nope_layers.push_back(v.get<int>() == 0);
    else
      for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % geti("no_rope_layer_interval", 4) == 0);
    c.attention_chunk = j.contains("attention_chunk_size") && j["attention_chunk_size"].is_null() ? 0 : geti("attention_chunk_size", 8192);
    for (int64_t l = 0; l < c.n_layers && c.attention_chunk > 0; ++l) c.chunked_layers.push_back(c.rotates(l));
    c.qk_l2_norm = j.value("use_qk_norm", true);
    if (j.value("attn_temperature_tuning", true)) {
      c.nope_temp_floor = static_cast<float>(geti("floor_scale", 8192));
      c.nope_temp_scale = j.value("attn_scale", 0.1f);
    }
  }
  if (arch == "gemma2" || arch == "gemma3") {  // Gemma2Config's / Gemma3TextConfig's keys (model_file.cpp, load_hf_gemma)
    const bool gemma2 = arch == "gemma2";
    c.post_norms = c.gelu_ffn = true;
    c.qk_norm = !gemma2;
    c.tied_output = j.value("tie_word_embeddings", true);
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(geti("query_pre_attn_scalar", c.head_dim)));
    c.norm_weight_offset = 1.0f;
    c.sliding_window = j.value("sliding_window", int64_t{0});
    if (c.sliding_window > 0) {
      if (j.contains("layer_types"))
        for (auto& t : j["layer_types"]) c.swa_layers.push_back(t.get<std::string>() == "sliding_attention");
      else
        for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back((l + 1) % (gemma2 ? 2 : 6) != 0);
    }
    if (gemma2) {
      auto cap = [&](const char* k, float def) { return j.contains(k) ? (j[k].is_null() ? 0.0f : j[k].get<float>()) : def; };
      c.attn_softcap = cap("attn_logit_softcapping", 50.0f);
      c.final_softcap = cap("final_logit_softcapping", 30.0f);
    } else {
      c.rope_theta_swa = j.value("rope_local_base_freq", 10000.0f);
    }
  }
  c.validate("synth --config");
  return c;
}

// Counter-based normal draws: value i comes from splitmix64(key + i) alone, so a tensor fills in
// parallel chunks with the same values at any thread count (--fast-fill, for benchmark models of
// billions of parameters; the default Mersenne Twister stream is what the golden files were made from).
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void fill_tensor_fast(const std::string& name, HfTensor& t, uint64_t seed, int64_t n) {
  const uint64_t key = seed ^ name_hash(name);
  thread_pool().parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t r = splitmix64(key + static_cast<uint64_t>(i));
      const float u1 = (static_cast<float>(r >> 40) + 1.0f) / 16777217.0f;  // (0, 1]
      const float u2 = static_cast<float>((r >> 16) & 0xffffff) / 16777216.0f;
      const float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
      float& v = t.data[static_cast<size_t>(i)];
      v = t.kind == 0 ? z * t.sd : t.kind == 1 ? t.base + z * t.sd : z;
    }
  });
}

// Draws t's values (the same ones whether made up front or lazily).
void fill_tensor(const std::string& name, HfTensor& t, uint64_t seed, bool fast = false) {
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n));
  if (fast) return fill_tensor_fast(name, t, seed, n);
  Normal rnd(seed ^ name_hash(name));
  if (t.kind == 0)
    for (auto& v : t.data) v = rnd() * t.sd;
  else if (t.kind == 1)
    for (auto& v : t.data) v = t.base + rnd() * t.sd;
  else
    for (auto& v : t.data) v = rnd();
}

// With lazy, only shapes and how to draw them (fill_tensor draws later): for models too big
// to hold in memory as f32. `extra_layers` multi-token-prediction layers after the model's
// (DeepSeek-V3's and GLM-4.5's): a decoder layer and the MTP tensors each.
std::map<std::string, HfTensor> make_weights(const ModelConfig& c, uint64_t seed, bool lazy = false, int64_t extra_layers = 0) {
  std::map<std::string, HfTensor> w;
  auto mat = [&](const std::string& name, int64_t out, int64_t in) {
    HfTensor t{{out, in}, {}, true, 0, 0.0f, 1.0f / std::sqrt(static_cast<float>(in))};
    if (!lazy) fill_tensor(name, t, seed);
    w[name] = std::move(t);
  };
  auto vec = [&](const std::string& name, int64_t n, float base, float sd) {
    HfTensor t{{n}, {}, false, 1, base, sd};
    if (!lazy) fill_tensor(name, t, seed);
    w[name] = std::move(t);
  };
  int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  auto ffn = [&](const std::string& p, int64_t width) {  // p: "...mlp." or "...experts.E."
    mat(p + "gate_proj.weight", width, c.dim);
    mat(p + "up_proj.weight", width, c.dim);
    mat(p + "down_proj.weight", c.dim, width);
  };
  auto moe = [&](const std::string& p) {  // p: "model.layers.N."
    if (c.arch == "mixtral" || c.arch == "minimax-m2") {  // its checkpoints' names: block_sparse_moe, experts' w1 (gate), w3 (up), w2 (down)
      mat(p + "block_sparse_moe.gate.weight", c.moe.n_experts, c.dim);
      w[p + "block_sparse_moe.gate.weight"].matrix = false;
      if (c.moe.has_bias) vec(p + "block_sparse_moe.e_score_correction_bias", c.moe.n_experts, 0.0f, 0.1f);  // MiniMax-M2
      for (int64_t e = 0; e < c.moe.n_experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        mat(x + "w1.weight", c.moe.ff, c.dim);
        mat(x + "w3.weight", c.moe.ff, c.dim);
        mat(x + "w2.weight", c.dim, c.moe.ff);
      }
      return;
    }
    if (c.arch == "granitemoe") {  // canonical per-expert tensors; the writers stack them as each format does
      mat(p + "block_sparse_moe.router.layer.weight", c.moe.n_experts, c.dim);
      w[p + "block_sparse_moe.router.layer.weight"].matrix = false;
      for (int64_t e = 0; e < c.moe.n_experts; ++e) ffn(p + "mlp.experts." + std::to_string(e) + ".", c.moe.ff);
      if (c.moe.n_shared > 0) ffn(p + "mlp.shared_experts.", c.moe.shared_width());
      return;
    }
    if (c.arch == "llama4") {  // its names under feed_forward; canonical per-expert tensors, stacked by the writer
      mat(p + "feed_forward.router.weight", c.moe.n_experts, c.dim);
      w[p + "feed_forward.router.weight"].matrix = false;
      for (int64_t e = 0; e < c.moe.n_experts; ++e) ffn(p + "feed_forward.experts." + std::to_string(e) + ".", c.moe.ff);
      ffn(p + "feed_forward.shared_expert.", c.moe.shared_width());
      return;
    }
    if (c.arch == "hunyuan-moe") {  // its names: the router mlp.gate.wg, the shared expert mlp.shared_mlp
      mat(p + "mlp.gate.wg.weight", c.moe.n_experts, c.dim);
      w[p + "mlp.gate.wg.weight"].matrix = false;
      for (int64_t e = 0; e < c.moe.n_experts; ++e) ffn(p + "mlp.experts." + std::to_string(e) + ".", c.moe.ff);
      ffn(p + "mlp.shared_mlp.", c.moe.shared_width());
      return;
    }
    mat(p + "mlp.gate.weight", c.moe.n_experts, c.dim);
    w[p + "mlp.gate.weight"].matrix = false;  // routers stay in full precision
    if (c.moe.has_bias && c.arch == "ernie4_5-moe") {  // ERNIE 4.5: [1, n_experts] (one expert group)
      vec(p + "mlp.moe_statics.e_score_correction_bias", c.moe.n_experts, 0.0f, 0.1f);
      w[p + "mlp.moe_statics.e_score_correction_bias"].shape = {1, c.moe.n_experts};
    } else if (c.moe.has_bias) {
      vec(p + "mlp.gate.e_score_correction_bias", c.moe.n_experts, 0.0f, 0.1f);
    }
    for (int64_t e = 0; e < c.moe.n_experts; ++e) ffn(p + "mlp.experts." + std::to_string(e) + ".", c.moe.ff);
    if (c.moe.shared_gate && c.moe.n_shared > 0) {  // Qwen2-MoE
      ffn(p + "mlp.shared_expert.", c.moe.shared_width());
      mat(p + "mlp.shared_expert_gate.weight", 1, c.dim);
      w[p + "mlp.shared_expert_gate.weight"].matrix = false;
    } else if (c.moe.n_shared > 0) {
      ffn(p + "mlp.shared_experts.", c.moe.shared_width());
    }
  };
  {
    HfTensor t{{c.n_vocab, c.dim}, {}, true, 2, 0.0f, 1.0f};
    if (!lazy) fill_tensor("model.embed_tokens.weight", t, seed);
    w["model.embed_tokens.weight"] = std::move(t);
  }
  // Norm weights near 1; Gemma's checkpoints store w - 1 (near 0; the loaders add the 1 back).
  const float norm_base = 1.0f - c.norm_weight_offset, norm_sd = c.norm_weight_offset != 0 ? 0.1f : 0.02f;
  vec("model.norm.weight", c.dim, norm_base, norm_sd);
  if (!c.tied_output) mat("lm_head.weight", c.n_vocab, c.dim);
  for (int64_t l = 0; l < c.n_layers + extra_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    if (c.arch == "deepseek2") {  // MLA attention
      const int64_t L = c.mla.kv_lora_rank, nope = c.head_dim - c.rot_dim;
      vec(p + "input_layernorm.weight", c.dim, 1.0f, 0.02f);
      vec(p + "post_attention_layernorm.weight", c.dim, 1.0f, 0.02f);
      if (c.mla.q_lora_rank > 0) {
        mat(p + "self_attn.q_a_proj.weight", c.mla.q_lora_rank, c.dim);
        vec(p + "self_attn.q_a_layernorm.weight", c.mla.q_lora_rank, 1.0f, 0.02f);
        mat(p + "self_attn.q_b_proj.weight", q, c.mla.q_lora_rank);
      } else {
        mat(p + "self_attn.q_proj.weight", q, c.dim);
      }
      mat(p + "self_attn.kv_a_proj_with_mqa.weight", L + c.rot_dim, c.dim);
      vec(p + "self_attn.kv_a_layernorm.weight", L, 1.0f, 0.02f);
      mat(p + "self_attn.kv_b_proj.weight", c.n_heads * (nope + c.v_head_dim), L);
      mat(p + "self_attn.o_proj.weight", c.dim, c.n_heads * c.v_head_dim);
      if (c.moe.is_moe_layer(l)) moe(p);
      else ffn(p + "mlp.", c.hidden_dim);
      continue;
    }
    if (c.arch == "gpt-oss") {  // canonical per-expert tensors; the writers stack them as each format does
      mat(p + "mlp.router.weight", c.moe.n_experts, c.dim);
      w[p + "mlp.router.weight"].matrix = false;  // the router stays in full precision
      vec(p + "mlp.router.bias", c.moe.n_experts, 0.0f, 0.5f);
      for (int64_t e = 0; e < c.moe.n_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        ffn(x, c.moe.ff);
        vec(x + "gate_proj.bias", c.moe.ff, 0.0f, 0.5f);
        vec(x + "up_proj.bias", c.moe.ff, 0.0f, 0.5f);
        vec(x + "down_proj.bias", c.dim, 0.0f, 0.1f);
      }
      vec(p + "self_attn.o_proj.bias", c.dim, 0.0f, 0.1f);
      vec(p + "self_attn.sinks", c.n_heads, 0.0f, 1.0f);
    }
    if (c.pre_norms) vec(p + "input_layernorm.weight", c.dim, norm_base, norm_sd);
    vec(p + "post_attention_layernorm.weight", c.dim, norm_base, norm_sd);
    if (c.arch == "glm4") {  // GLM-4's names: a norm after the attention and after the MLP
      vec(p + "post_self_attn_layernorm.weight", c.dim, norm_base, norm_sd);
      vec(p + "post_mlp_layernorm.weight", c.dim, norm_base, norm_sd);
    } else if (c.post_norms) {  // Gemma: before and after the FFN; OLMo 2: after it only
      if (c.pre_norms) vec(p + "pre_feedforward_layernorm.weight", c.dim, norm_base, norm_sd);
      vec(p + "post_feedforward_layernorm.weight", c.dim, norm_base, norm_sd);
    }
    if (c.arch == "phi3") {  // q, k, v in one matrix; gate and up in another (gate first)
      mat(p + "self_attn.qkv_proj.weight", q + 2 * kv, c.dim);
      mat(p + "mlp.gate_up_proj.weight", 2 * c.hidden_dim, c.dim);
      mat(p + "mlp.down_proj.weight", c.dim, c.hidden_dim);
    } else {
      if (c.arch == "glm4") {  // gate and up in one matrix (gate first), as Phi-3
        mat(p + "mlp.gate_up_proj.weight", 2 * c.hidden_dim, c.dim);
        mat(p + "mlp.down_proj.weight", c.dim, c.hidden_dim);
      }
      mat(p + "self_attn.q_proj.weight", q, c.dim);
      mat(p + "self_attn.k_proj.weight", kv, c.dim);
      mat(p + "self_attn.v_proj.weight", kv, c.dim);
    }
    mat(p + "self_attn.o_proj.weight", c.dim, q);
    if ((c.arch == "qwen3moe" || c.arch == "qwen2moe" || c.arch == "mixtral" || c.arch == "glm4moe" || c.arch == "granitemoe" ||
         c.arch == "minimax-m2" || c.arch == "ernie4_5-moe" || c.arch == "hunyuan-moe" || c.arch == "llama4") &&
        c.moe.is_moe_layer(l))
      moe(p);
    else if (c.arch != "gpt-oss" && c.arch != "phi3" && c.arch != "glm4") ffn(p + (c.arch == "llama4" ? "feed_forward." : "mlp."), c.hidden_dim);
    if (c.qkv_bias) {
      vec(p + "self_attn.q_proj.bias", q, 0.0f, 0.1f);
      vec(p + "self_attn.k_proj.bias", kv, 0.0f, 0.1f);
      vec(p + "self_attn.v_proj.bias", kv, 0.0f, 0.1f);
    }
    if (c.qk_norm) {
      const bool hunyuan = c.arch == "hunyuan-dense" || c.arch == "hunyuan-moe";  // its names: query_layernorm, key_layernorm
      vec(p + (hunyuan ? "self_attn.query_layernorm.weight" : "self_attn.q_norm.weight"), c.qk_norm_full ? q : c.head_dim, norm_base, norm_sd);
      vec(p + (hunyuan ? "self_attn.key_layernorm.weight" : "self_attn.k_norm.weight"), c.qk_norm_full ? kv : c.head_dim, norm_base, norm_sd);
    }
  }
  // A multi-token-prediction layer's own tensors beside its decoder layer (DeepSeek-V3 names):
  // the input projection of [enorm(embedding); hnorm(hidden)], and its head's norm and matrix.
  for (int64_t l = c.n_layers; l < c.n_layers + extra_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    mat(p + "eh_proj.weight", c.dim, 2 * c.dim);
    vec(p + "enorm.weight", c.dim, 1.0f, 0.02f);
    vec(p + "hnorm.weight", c.dim, 1.0f, 0.02f);
    vec(p + "shared_head.norm.weight", c.dim, 1.0f, 0.02f);
    mat(p + "shared_head.head.weight", c.n_vocab, c.dim);
  }
  return w;
}

// The tensor's name in a GGUF file of this architecture: the canonical name, except GLM-4.5's
// norm before the FFN, which llama.cpp calls post_attention_norm (Gemma 3's names: tensor_names.h).
std::string gguf_name(const std::string& hf, const ModelConfig& c) {
  std::string n = c.arch == "gemma2" || c.arch == "gemma3" || c.arch == "olmo2" || c.arch == "olmo3" || c.arch == "exaone4"
                      ? canonical_from_hf_gemma(hf)
                                                                                                    : canonical_from_hf(hf);
  FP_CHECK(!n.empty(), "synth: no GGUF name for '", hf, "'");
  if ((c.arch == "glm4moe" || c.arch == "gpt-oss" || c.arch == "seed_oss") && n.ends_with(".ffn_norm.weight"))
    n = n.substr(0, n.size() - std::string("ffn_norm.weight").size()) + "post_attention_norm.weight";
  return n;
}

// llama.cpp's converter reorders each head's rows from NeoX halves to interleaved pairs.
std::vector<float> permute_rows_for_adjacent_rope(const HfTensor& t, int64_t n_heads) {
  return rope_pair_rows(t.data, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 1, n_heads, true);
}

std::vector<uint8_t> encode_rows(DType type, const float* data, int64_t rows, int64_t cols) {
  int64_t rb = row_bytes(type, cols);
  std::vector<uint8_t> out(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, data + r * cols, out.data() + r * rb, cols);
  return out;
}

void add_synth_vocab(GgufWriter& g, int64_t n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
  }
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  for (char ch : letters) tokens.push_back(std::string("\xe2\x96\x81") + ch), types.push_back(1);
  for (char ch : letters) tokens.push_back(std::string(1, ch)), types.push_back(1);
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < n_vocab; ++i) tokens.push_back("<extra_" + std::to_string(i) + ">"), types.push_back(5);
  tokens.resize(static_cast<size_t>(n_vocab));
  types.resize(static_cast<size_t>(n_vocab));
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  g.set_string("tokenizer.ggml.model", "llama");
  g.set_string_array("tokenizer.ggml.tokens", tokens);
  g.set_f32_array("tokenizer.ggml.scores", scores);
  g.set_i32_array("tokenizer.ggml.token_type", types);
  g.set_u32("tokenizer.ggml.bos_token_id", 1);
  g.set_u32("tokenizer.ggml.eos_token_id", 2);
  g.set_u32("tokenizer.ggml.unknown_token_id", 0);
}

// DeepSeek's router keys, which GLM-4.5's config.json shares.
void hf_deepseek_router_keys(nlohmann::json& cfg, const MoeConfig& e) {
  cfg["n_routed_experts"] = e.n_experts;
  cfg["n_shared_experts"] = e.n_shared;
  cfg["first_k_dense_replace"] = e.first_dense;
  cfg["routed_scaling_factor"] = e.scale;
  cfg["n_group"] = e.n_group;
  cfg["topk_group"] = e.topk_group;
  cfg["hidden_act"] = "silu";
}

// config.json keys of the MoE architectures, every one written (transformers' defaults differ).
void hf_moe_config(nlohmann::json& cfg, const ModelConfig& c, const std::string& arch_in) {
  const MoeConfig& e = c.moe;
  cfg["num_experts_per_tok"] = e.n_used;
  if (c.arch == "mixtral") {  // experts as wide as intermediate_size, the top k always renormalised
    cfg["architectures"] = {"MixtralForCausalLM"};
    cfg["model_type"] = "mixtral";
    cfg["num_local_experts"] = e.n_experts;
    cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    return;
  }
  cfg["moe_intermediate_size"] = e.ff;
  cfg["norm_topk_prob"] = e.norm_topk;
  if (c.arch == "qwen3moe" || c.arch == "qwen2moe") {
    const bool q2 = c.arch == "qwen2moe";
    cfg["architectures"] = {q2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM"};
    cfg["model_type"] = q2 ? "qwen2_moe" : "qwen3_moe";
    if (q2) {
      cfg["shared_expert_intermediate_size"] = e.shared_width();
      cfg["qkv_bias"] = c.qkv_bias;
      cfg["use_sliding_window"] = false;
    }
    cfg["num_experts"] = e.n_experts;
    cfg["decoder_sparse_step"] = e.sparse_step;
    cfg["mlp_only_layers"] = e.dense_layers;
    return;
  }
  if (c.arch == "glm4moe") {
    cfg["architectures"] = {"Glm4MoeForCausalLM"};
    cfg["model_type"] = "glm4_moe";
    hf_deepseek_router_keys(cfg, e);
    cfg["attention_bias"] = c.qkv_bias;
    cfg["use_qk_norm"] = c.qk_norm;
    cfg["partial_rotary_factor"] = static_cast<double>(c.rot_dim) / static_cast<double>(c.head_dim);
    return;
  }
  const bool v3 = arch_in == "deepseek_v3";
  cfg["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  cfg["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  hf_deepseek_router_keys(cfg, e);
  if (!v3) {
    cfg["topk_method"] = e.n_group > 1 ? "group_limited_greedy" : "greedy";
    cfg["scoring_func"] = "softmax";
  }
  cfg["q_lora_rank"] = c.mla.q_lora_rank > 0 ? nlohmann::json(c.mla.q_lora_rank) : nlohmann::json(nullptr);
  cfg["kv_lora_rank"] = c.mla.kv_lora_rank;
  cfg["qk_rope_head_dim"] = c.rot_dim;
  cfg["qk_nope_head_dim"] = c.head_dim - c.rot_dim;
  cfg["v_head_dim"] = c.v_head_dim;
  cfg["head_dim"] = c.rot_dim;  // transformers' DeepSeek configs: head_dim is the rotary dim
  cfg["rope_interleave"] = true;
  cfg["attention_bias"] = false;
}

// gpt-oss's checkpoint layout of the experts (transformers' GptOssExperts): per layer
// gate_up_proj [E, dim, 2ff] (x · W, gate and up interleaved by column), gate_up_proj_bias [E, 2ff]
// (interleaved), down_proj [E, ff, dim], down_proj_bias [E, dim]; with MXFP4, OpenAI's blocks and
// scales instead of the two matrices: gate_up_proj_blocks [E, 2ff, dim/32, 16] (rows = outputs,
// element 2k in the low nibble of byte k, 2k + 1 in the high) and _scales [E, 2ff, dim/32] (E8M0).
void add_gpt_oss_experts(SafetensorsWriter& st, const std::map<std::string, HfTensor>& w, const ModelConfig& c, DType type) {
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim;
  auto get = [&](const std::string& n) -> const std::vector<float>& { return w.at(n).data; };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<float> gu(static_cast<size_t>(E * dim * 2 * ff)), gub(static_cast<size_t>(E * 2 * ff));
    std::vector<float> dn(static_cast<size_t>(E * ff * dim)), dnb(static_cast<size_t>(E * dim));
    // rows as outputs (the MXFP4 layout): [E, 2ff, dim] interleaved, [E, dim, ff]
    std::vector<float> gu_rows(gu.size()), dn_rows(dn.size());
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      const auto &g = get(x + "gate_proj.weight"), &u = get(x + "up_proj.weight"), &d = get(x + "down_proj.weight");
      const auto &gb = get(x + "gate_proj.bias"), &ub = get(x + "up_proj.bias"), &db = get(x + "down_proj.bias");
      for (int64_t j = 0; j < ff; ++j) {
        gub[static_cast<size_t>(e * 2 * ff + 2 * j)] = gb[static_cast<size_t>(j)];
        gub[static_cast<size_t>(e * 2 * ff + 2 * j + 1)] = ub[static_cast<size_t>(j)];
        for (int64_t i = 0; i < dim; ++i) {
          const float gv = g[static_cast<size_t>(j * dim + i)], uv = u[static_cast<size_t>(j * dim + i)];
          gu[static_cast<size_t>((e * dim + i) * 2 * ff + 2 * j)] = gv;
          gu[static_cast<size_t>((e * dim + i) * 2 * ff + 2 * j + 1)] = uv;
          gu_rows[static_cast<size_t>((e * 2 * ff + 2 * j) * dim + i)] = gv;
          gu_rows[static_cast<size_t>((e * 2 * ff + 2 * j + 1) * dim + i)] = uv;
        }
      }
      for (int64_t i = 0; i < dim; ++i) {
        dnb[static_cast<size_t>(e * dim + i)] = db[static_cast<size_t>(i)];
        for (int64_t j = 0; j < ff; ++j) {
          dn[static_cast<size_t>((e * ff + j) * dim + i)] = d[static_cast<size_t>(i * ff + j)];
          dn_rows[static_cast<size_t>((e * dim + i) * ff + j)] = d[static_cast<size_t>(i * ff + j)];
        }
      }
    }
    const DType bias_type = type == DType::MXFP4 || type == DType::F8_E4M3 ? DType::F32 : type;
    st.add(p + "gate_up_proj_bias", bias_type, {E, 2 * ff}, encode_rows(bias_type, gub.data(), 1, E * 2 * ff));
    st.add(p + "down_proj_bias", bias_type, {E, dim}, encode_rows(bias_type, dnb.data(), 1, E * dim));
    if (type != DType::MXFP4) {
      const DType ty = type == DType::F8_E4M3 ? DType::F32 : type;
      st.add(p + "gate_up_proj", ty, {E, dim, 2 * ff}, encode_rows(ty, gu.data(), E * dim, 2 * ff));
      st.add(p + "down_proj", ty, {E, ff, dim}, encode_rows(ty, dn.data(), E * ff, dim));
      continue;
    }
    FP_CHECK(dim % 32 == 0 && ff % 32 == 0, "synth: MXFP4 gpt_oss needs hidden_size and intermediate_size multiples of 32");
    auto blocks_and_scales = [&](const std::string& name, const std::vector<float>& rows, int64_t n_rows, int64_t in) {
      const int64_t nb = in / 32;
      std::vector<BlockMXFP4> q(static_cast<size_t>(n_rows * nb));
      quantize_row(DType::MXFP4, rows.data(), q.data(), n_rows * in);
      std::vector<uint8_t> blocks(static_cast<size_t>(n_rows * nb * 16)), scales(static_cast<size_t>(n_rows * nb));
      for (size_t b = 0; b < q.size(); ++b) {
        scales[b] = q[b].e;
        uint8_t v[32];
        for (int k = 0; k < 16; ++k) v[k] = q[b].qs[k] & 15, v[k + 16] = q[b].qs[k] >> 4;
        for (int k = 0; k < 16; ++k) blocks[b * 16 + static_cast<size_t>(k)] = static_cast<uint8_t>(v[2 * k] | (v[2 * k + 1] << 4));
      }
      st.add(p + name + "_blocks", DType::U8, {E, n_rows / E, nb, 16}, std::move(blocks));
      st.add(p + name + "_scales", DType::U8, {E, n_rows / E, nb}, std::move(scales));
    };
    blocks_and_scales("gate_up_proj", gu_rows, E * 2 * ff, dim);
    blocks_and_scales("down_proj", dn_rows, E * dim, ff);
  }
}

// GraniteMoe's checkpoint layout of the experts: per layer block_sparse_moe.input_linear
// [E, 2 ff, dim] (each expert's gate rows, then its up rows) and output_linear [E, dim, ff];
// GraniteMoeShared's shared_mlp.input_linear [2 sh, dim] and output_linear [dim, sh].
void add_granite_moe_experts(SafetensorsWriter& st, const std::map<std::string, HfTensor>& w, const ModelConfig& c, DType type) {
  FP_CHECK(type == DType::F32 || type == DType::F16 || type == DType::BF16, "synth: GraniteMoe checkpoints here are F32, F16 or BF16, not ",
           dtype_name(type));
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim;
  auto get = [&](const std::string& n) -> const std::vector<float>& { return w.at(n).data; };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<float> in, out;
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      for (const char* k : {"gate_proj.weight", "up_proj.weight"}) in.insert(in.end(), get(x + k).begin(), get(x + k).end());
      out.insert(out.end(), get(x + "down_proj.weight").begin(), get(x + "down_proj.weight").end());
    }
    st.add(p + "block_sparse_moe.input_linear.weight", type, {E, 2 * ff, dim}, encode_rows(type, in.data(), E * 2 * ff, dim));
    st.add(p + "block_sparse_moe.output_linear.weight", type, {E, dim, ff}, encode_rows(type, out.data(), E * dim, ff));
    if (c.moe.n_shared == 0) continue;
    const int64_t sh = c.moe.shared_width();
    const std::string x = p + "mlp.shared_experts.";
    std::vector<float> sin = get(x + "gate_proj.weight");
    sin.insert(sin.end(), get(x + "up_proj.weight").begin(), get(x + "up_proj.weight").end());
    st.add(p + "shared_mlp.input_linear.weight", type, {2 * sh, dim}, encode_rows(type, sin.data(), 2 * sh, dim));
    st.add(p + "shared_mlp.output_linear.weight", type, {dim, sh}, encode_rows(type, get(x + "down_proj.weight").data(), dim, sh));
  }
}

// Llama 4's checkpoint layout of the experts (transformers' Llama4TextExperts): per sparse layer
// feed_forward.experts.gate_up_proj [E, dim, 2ff] (x · W; gate the first ff columns, up the rest)
// and down_proj [E, ff, dim].
void add_llama4_experts(SafetensorsWriter& st, const std::map<std::string, HfTensor>& w, const ModelConfig& c, DType type) {
  FP_CHECK(type == DType::F32 || type == DType::F16 || type == DType::BF16, "synth: Llama 4 checkpoints here are F32, F16 or BF16, not ",
           dtype_name(type));
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.moe.is_moe_layer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".feed_forward.experts.";
    std::vector<float> gu(static_cast<size_t>(E * dim * 2 * ff)), dn(static_cast<size_t>(E * ff * dim));
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      const std::vector<float>&g = w.at(x + "gate_proj.weight").data, &u = w.at(x + "up_proj.weight").data,
                         &d = w.at(x + "down_proj.weight").data;
      for (int64_t i = 0; i < dim; ++i)
        for (int64_t k = 0; k < ff; ++k) {
          gu[static_cast<size_t>((e * dim + i) * 2 * ff + k)] = g[static_cast<size_t>(k * dim + i)];
          gu[static_cast<size_t>((e * dim + i) * 2 * ff + ff + k)] = u[static_cast<size_t>(k * dim + i)];
          dn[static_cast<size_t>((e * ff + k) * dim + i)] = d[static_cast<size_t>(i * ff + k)];
        }
    }
    st.add(p + "gate_up_proj", type, {E, dim, 2 * ff}, encode_rows(type, gu.data(), E * dim, 2 * ff));
    st.add(p + "down_proj", type, {E, ff, dim}, encode_rows(type, dn.data(), E * ff, dim));
  }
}

// config.json of a gpt-oss model (transformers' GptOssConfig keys; rope_parameters always
// written, since transformers' default is YaRN x32).
void hf_gpt_oss_config(nlohmann::json& cfg, const ModelConfig& c, DType type) {
  cfg["architectures"] = {"GptOssForCausalLM"};
  cfg["model_type"] = "gpt_oss";
  cfg["num_local_experts"] = c.moe.n_experts;
  cfg["num_experts_per_tok"] = c.moe.n_used;
  cfg["experts_per_token"] = c.moe.n_used;
  cfg["swiglu_alpha"] = c.moe.swiglu_alpha;
  cfg["swiglu_limit"] = c.moe.swiglu_limit;
  cfg["attention_bias"] = true;
  cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  std::vector<std::string> types;
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
  cfg["layer_types"] = types;
  const RopeScaling& rs = c.rope_scaling;
  nlohmann::json rp = {{"rope_theta", c.rope_theta}};
  if (rs.type == "yarn") {
    rp["rope_type"] = "yarn";
    rp["factor"] = rs.factor;
    rp["beta_fast"] = rs.beta_fast;
    rp["beta_slow"] = rs.beta_slow;
    rp["truncate"] = rs.truncate;
    rp["original_max_position_embeddings"] = rs.original_context;
  } else {
    rp["rope_type"] = "default";
  }
  cfg.erase("rope_scaling");
  cfg["rope_parameters"] = rp;
  if (type == DType::MXFP4)
    cfg["quantization_config"] = {{"quant_method", "mxfp4"},
                                  {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"}}};
}

// config.json of a Gemma 2 model or a Gemma 3 text model (transformers' Gemma2Config /
// Gemma3TextConfig keys, every one written).
void hf_gemma_config(nlohmann::json& cfg, const ModelConfig& c) {
  const bool gemma2 = c.arch == "gemma2";
  cfg["architectures"] = {gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
  cfg["model_type"] = gemma2 ? "gemma2" : "gemma3_text";
  cfg["hidden_activation"] = "gelu_pytorch_tanh";
  cfg["query_pre_attn_scalar"] = static_cast<int64_t>(std::llround(1.0 / (static_cast<double>(c.attn_scale) * c.attn_scale)));
  cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  std::vector<std::string> types;
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
  cfg["layer_types"] = types;
  if (!gemma2) cfg["rope_local_base_freq"] = c.rope_theta_swa;
  auto cap = [](float v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  cfg["final_logit_softcapping"] = cap(c.final_softcap);
  cfg["attn_logit_softcapping"] = cap(c.attn_softcap);
  cfg["attention_bias"] = false;
}

// general.architecture of a GGUF of this model: llama.cpp writes Mixtral as a llama with experts.
// llama.cpp writes Mixtral as a llama with experts and OLMo 3 as an olmo2 with a window.
std::string gguf_arch(const ModelConfig& c) { return c.arch == "mixtral" ? "llama" : c.arch == "olmo3" ? "olmo2" : c.arch; }

// Whether llama.cpp's converter permutes this architecture's q/k rows into adjacent pairs.
bool gguf_adjacent_rope(const ModelConfig& c) { return gguf_permutes_qk(c.arch); }

// MoE / MLA keys as llama.cpp's converters write them.
void add_moe_metadata(GgufWriter& g, const ModelConfig& c) {
  const std::string a = gguf_arch(c) + ".";
  const MoeConfig& e = c.moe;
  g.set_u32(a + "expert_count", static_cast<uint32_t>(e.n_experts));
  g.set_u32(a + "expert_used_count", static_cast<uint32_t>(e.n_used));
  g.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(e.ff));
  g.set_bool(a + "expert_weights_norm", e.norm_topk);
  if (c.arch == "qwen3moe") return;
  if (c.arch == "mixtral") {
    FP_CHECK(e.norm_topk, "synth: Mixtral renormalises its top-k weights");
    FP_CHECK(c.sliding_window == 0, "synth: GGUF llama (Mixtral) has no sliding window; write a safetensors directory");
    return;
  }
  if (c.arch == "qwen2moe") {
    g.set_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(e.shared_width()));
    return;
  }
  if (c.arch == "minimax-m2") {  // llama.cpp's MiniMax-M2: sigmoid scores with a selection bias, top k renormalised
    FP_CHECK(e.norm_topk && e.scoring == "sigmoid" && e.has_bias && e.n_group == 1 && e.scale == 1.0f,
             "synth: GGUF minimax-m2 routes by sigmoid scores with a bias, renormalised, no groups or scale");
    g.set_u32(a + "expert_gating_func", 2);
    return;
  }
  if (c.arch == "granitemoe") {  // llama.cpp's GraniteMoe: softmax, top k renormalised; the shared expert's width
    FP_CHECK(e.norm_topk, "synth: GraniteMoe renormalises its top-k weights");
    if (e.n_shared > 0) g.set_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(e.shared_width()));
    return;
  }
  if (c.arch == "llama4") {
    // llama.cpp's Llama 4: sigmoid top-1 scores on the expert input beside a shared expert of the
    // experts' width, sparse every interleave_moe_layer_step-th layer; chunks of 8192, NoPE every
    // fourth layer with the temperature floor 8192 and scale 0.1, and q/k L2 norms unless 128
    // experts (Maverick) are all fixed there, so a config that differs cannot be written as GGUF.
    g.set_u32(a + "interleave_moe_layer_step", static_cast<uint32_t>(e.sparse_step));
    FP_CHECK(e.dense_layers.empty() && e.first_dense == 0, "synth: GGUF llama4 says which layers are sparse by interleave_moe_layer_step only");
    FP_CHECK(c.attention_chunk == 8192 && c.nope_temp_floor == 8192.0f && c.nope_temp_scale == 0.1f,
             "synth: GGUF llama4 attends in chunks of 8192 with the temperature floor 8192 and scale 0.1 (llama.cpp's values)");
    for (int64_t l = 0; l < c.n_layers; ++l)
      FP_CHECK(c.rotates(l) == ((l + 1) % 4 != 0) && (c.chunk_of(l) > 0) == c.rotates(l),
               "synth: GGUF llama4 leaves out RoPE (and chunks) on every fourth layer only (llama.cpp's pattern)");
    FP_CHECK(c.qk_l2_norm == (e.n_experts != 128), "synth: GGUF llama4 norms q/k unless the model has 128 experts (llama.cpp's rule)");
    return;
  }
  if (c.arch == "gpt-oss") {
    if (c.sliding_window > 0) g.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    for (int64_t l = 0; l < c.n_layers && c.sliding_window > 0; ++l)  // llama.cpp's pattern: the even layers
      FP_CHECK(c.swa_layers[static_cast<size_t>(l)] == (l % 2 == 0), "synth: GGUF gpt-oss slides the window on the even layers only");
    FP_CHECK(e.swiglu_alpha == 1.702f && e.swiglu_limit == 7.0f, "synth: GGUF gpt-oss has swiglu_alpha 1.702 and swiglu_limit 7");
    const RopeScaling& rs = c.rope_scaling;
    if (rs.type == "yarn") {
      FP_CHECK(rs.truncate, "synth: GGUF yarn rounds the correction range (ggml); write \"truncate\": true or a safetensors directory");
      g.set_string(a + "rope.scaling.type", "yarn");
      g.set_f32(a + "rope.scaling.factor", rs.factor);
      g.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(rs.original_context));
      g.set_f32(a + "rope.scaling.yarn_beta_fast", rs.beta_fast);
      g.set_f32(a + "rope.scaling.yarn_beta_slow", rs.beta_slow);
    }
    return;
  }
  FP_CHECK(e.scoring == "sigmoid" || e.group_score == "max", "synth: GGUF cannot express this routing");
  g.set_u32(a + "leading_dense_block_count", static_cast<uint32_t>(e.first_dense));
  g.set_u32(a + "expert_shared_count", static_cast<uint32_t>(e.n_shared));
  g.set_f32(a + "expert_weights_scale", e.scale);
  g.set_u32(a + "expert_gating_func", e.scoring == "sigmoid" ? 2 : 1);
  g.set_u32(a + "expert_group_count", static_cast<uint32_t>(e.n_group));
  g.set_u32(a + "expert_group_used_count", static_cast<uint32_t>(e.topk_group));
  if (c.arch != "deepseek2") return;
  g.set_u32(a + "attention.q_lora_rank", static_cast<uint32_t>(c.mla.q_lora_rank));
  g.set_u32(a + "attention.kv_lora_rank", static_cast<uint32_t>(c.mla.kv_lora_rank));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "yarn") {
    // llama.cpp leaves cos/sin unscaled: only mscale == mscale_all_dim (attention factor 1) fits.
    FP_CHECK(std::fabs(rs.attn_factor - 1.0f) < 1e-6f, "synth: GGUF yarn needs mscale == mscale_all_dim (attention factor ",
             rs.attn_factor, ")");
    g.set_string(a + "rope.scaling.type", "yarn");
    g.set_f32(a + "rope.scaling.factor", rs.factor);
    g.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(rs.original_context));
    g.set_f32(a + "rope.scaling.yarn_log_multiplier", rs.log_multiplier);
    g.set_f32(a + "rope.scaling.yarn_beta_fast", rs.beta_fast);
    g.set_f32(a + "rope.scaling.yarn_beta_slow", rs.beta_slow);
  } else {
    g.set_f32(a + "rope.scaling.yarn_log_multiplier", 0.0f);
  }
}

// Gemma 2 and 3 as llama.cpp's GGUFs describe them: the window (and Gemma 2's caps) are keys;
// the pattern (Gemma 2: the even layers slide; Gemma 3: every sixth layer global), Gemma 3's
// sliding layers' RoPE base (10000) and the attention scale (1/sqrt(head_dim)) are fixed there,
// so a config that differs cannot be written as GGUF.
void add_gemma_metadata(GgufWriter& g, const ModelConfig& c) {
  const bool gemma2 = c.arch == "gemma2";
  const std::string a = c.arch + ".";
  if (gemma2) {
    FP_CHECK(c.sliding_window > 0, "synth: GGUF gemma2 always slides a window (4096 when the key is absent)");
    FP_CHECK(c.attn_softcap > 0 && c.final_softcap > 0, "synth: GGUF gemma2 always soft-caps scores and logits");
    g.set_f32(a + "attn_logit_softcapping", c.attn_softcap);
    g.set_f32(a + "final_logit_softcapping", c.final_softcap);
  }
  if (c.sliding_window > 0) {
    g.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    for (int64_t l = 0; l < c.n_layers; ++l)
      FP_CHECK(c.swa_layers[static_cast<size_t>(l)] == (gemma2 ? l % 2 == 0 : (l + 1) % 6 != 0),
               gemma2 ? "synth: GGUF gemma2 slides the window on the even layers (llama.cpp's pattern)"
                      : "synth: GGUF gemma3 slides the window on five layers of every six (llama.cpp's pattern)");
    FP_CHECK(gemma2 || c.rope_theta_swa == 10000.0f, "synth: GGUF gemma3's sliding layers rotate with base 10000");
  }
  FP_CHECK(std::fabs(c.attn_scale * std::sqrt(static_cast<float>(c.head_dim)) - 1.0f) < 1e-6f || c.n_layers == (gemma2 ? 46 : 62),
           "synth: GGUF ", c.arch, " scales the attention by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim)");
}

// What a GGUF stores beyond the checkpoint's value: Gemma's converter adds the 1 of its norms.
float gguf_value_offset(const std::string& gguf_name, const ModelConfig& c) {
  return gguf_name.ends_with("norm.weight") ? c.norm_weight_offset : 0.0f;
}

// Canonical GGUF names and layout: routed experts stacked into [n_expert, out, in]; with
// split_kv_b, attn_kv_b becomes llama.cpp's attn_k_b [H, kv_lora, nope] and attn_v_b [H, v, kv_lora].
std::map<std::string, HfTensor> gguf_layout(const std::map<std::string, HfTensor>& w, const ModelConfig& c, bool split_kv_b) {
  std::map<std::string, HfTensor> out;
  for (auto& [name, t] : w) {
    std::string gn = gguf_name(name, c);
    if (size_t at = gn.find("_exps."); at != std::string::npos) {
      const bool bias = gn.ends_with(".bias");  // gpt-oss's expert biases stack into [E, out]
      const std::string suffix = bias ? ".bias" : ".weight";
      const std::string stacked = gn.substr(0, at + 5) + suffix;
      const int64_t e = std::stoll(gn.substr(at + 6, gn.size() - at - 6 - suffix.size()));
      HfTensor& st = out[stacked];
      const int64_t per = bias ? t.shape[0] : t.shape[0] * t.shape[1];
      if (st.data.empty()) {
        st = bias ? HfTensor{{c.moe.n_experts, t.shape[0]}, std::vector<float>(static_cast<size_t>(c.moe.n_experts * per)), false}
                  : HfTensor{{c.moe.n_experts, t.shape[0], t.shape[1]}, std::vector<float>(static_cast<size_t>(c.moe.n_experts * per)), true};
      }
      std::copy(t.data.begin(), t.data.end(), st.data.begin() + e * per);
      continue;
    }
    if (split_kv_b && gn.ends_with("attn_kv_b.weight")) {
      const int64_t H = c.n_heads, L = c.mla.kv_lora_rank, nope = c.head_dim - c.rot_dim, v = c.v_head_dim;
      HfTensor kb{{H, L, nope}, std::vector<float>(static_cast<size_t>(H * L * nope)), true};
      HfTensor vb{{H, v, L}, std::vector<float>(static_cast<size_t>(H * v * L)), true};
      for (int64_t h = 0; h < H; ++h) {
        const float* head = t.data.data() + h * (nope + v) * L;
        for (int64_t j = 0; j < nope; ++j)
          for (int64_t k = 0; k < L; ++k) kb.data[static_cast<size_t>((h * L + k) * nope + j)] = head[j * L + k];
        std::copy(head + nope * L, head + (nope + v) * L, vb.data.begin() + h * v * L);
      }
      const std::string base = gn.substr(0, gn.size() - std::string("attn_kv_b.weight").size());
      out[base + "attn_k_b.weight"] = std::move(kb);
      out[base + "attn_v_b.weight"] = std::move(vb);
      continue;
    }
    out[gn] = t;
    if (gn.ends_with("exp_probs_b.bias")) out[gn].shape = {c.moe.n_experts};  // llama.cpp squeezes ERNIE's [1, E]
    if (gn.ends_with("ffn_gate_inp_shexp.weight")) out[gn].shape = {c.dim};  // Qwen2-MoE's gate: a [dim] vector in GGUF
  }
  return out;
}

// The type a GGUF tensor is written in: matrices in the asked type, norms and biases F32; MXFP4
// for the experts only, as gpt-oss ships (the rest F32).
DType gguf_type_of(const std::string& gguf_name, bool matrix, DType asked) {
  if (!matrix) return DType::F32;
  if (asked == DType::MXFP4 && gguf_name.find("_exps.") == std::string::npos) return DType::F32;
  return asked;
}

// Writes the GGUF tensor by tensor, drawing each one just before it is written, so a model far
// larger than memory as f32 (the DeepSeek-V2-Lite-shaped benchmark model) can be made. Same
// tensors, names and values as the in-memory path. The metadata comes from `g` (no tensors);
// `f32_extras` are small F32 tensors computed from the config (rope_freqs.weight), written as given.
void write_gguf_streaming(const SynthOptions& o, const ModelConfig& c, const GgufWriter& g,
                          std::map<std::string, HfTensor>& w, const std::map<std::string, std::vector<float>>& f32_extras) {
  struct Part {
    std::string src;
    int how = 0;  // 0 as is, 1/2 Llama q/k rows permuted, 3 attn_k_b / 4 attn_v_b out of kv_b
  };
  struct Entry {
    std::vector<int64_t> shape;
    bool matrix = false;
    std::vector<Part> parts;
    const std::vector<float>* values = nullptr;  // an F32 extra, written as is
  };
  std::map<std::string, Entry> plan;  // GGUF name order, as the in-memory writer's std::map
  for (auto& [gn, v] : f32_extras) plan[gn] = Entry{{static_cast<int64_t>(v.size())}, false, {}, &v};
  const int64_t H = c.n_heads, L = c.mla.kv_lora_rank, nope = c.head_dim - c.rot_dim, vd = c.v_head_dim;
  for (auto& [name, t] : w) {
    const std::string gn = gguf_name(name, c);
    if (size_t at = gn.find("_exps."); at != std::string::npos) {
      const bool bias = gn.ends_with(".bias");  // gpt-oss's expert biases stack into [E, out]
      const std::string suffix = bias ? ".bias" : ".weight";
      Entry& e = plan[gn.substr(0, at + 5) + suffix];
      e.shape = bias ? std::vector<int64_t>{c.moe.n_experts, t.shape[0]} : std::vector<int64_t>{c.moe.n_experts, t.shape[0], t.shape[1]};
      e.matrix = !bias;
      e.parts.resize(static_cast<size_t>(c.moe.n_experts));
      e.parts[static_cast<size_t>(std::stoll(gn.substr(at + 6, gn.size() - at - 6 - suffix.size())))] = Part{name, 0};
    } else if (o.split_kv_b && gn.ends_with("attn_kv_b.weight")) {
      const std::string base = gn.substr(0, gn.size() - std::string("attn_kv_b.weight").size());
      plan[base + "attn_k_b.weight"] = Entry{{H, L, nope}, true, {Part{name, 3}}};
      plan[base + "attn_v_b.weight"] = Entry{{H, vd, L}, true, {Part{name, 4}}};
    } else {
      int how = 0;
      if (gguf_adjacent_rope(c) && gn.find("attn_q.weight") != std::string::npos) how = 1;
      if (gguf_adjacent_rope(c) && gn.find("attn_k.weight") != std::string::npos) how = 2;
      const bool vector = gn.ends_with("ffn_gate_inp_shexp.weight");  // Qwen2-MoE's [1, dim] gate: a [dim] vector in GGUF
      plan[gn] = Entry{vector ? std::vector<int64_t>{c.dim} : t.shape, t.matrix, {Part{name, how}}};
    }
  }
  // Metadata with alignment 1 has no padding after it; the alignment value is then patched to 32.
  std::vector<uint8_t> head = g.to_bytes(1);
  const size_t kAlignValueAt = 4 + 4 + 8 + 8 + 8 + std::string("general.alignment").size() + 4;
  const uint32_t align = 32;
  std::memcpy(head.data() + kAlignValueAt, &align, 4);
  const uint64_t n_tensors = plan.size();
  std::memcpy(head.data() + 8, &n_tensors, 8);
  auto put = [&head](const void* p, size_t n) { head.insert(head.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); };
  uint64_t off = 0;
  for (auto& [gn, e] : plan) {
    const uint64_t len = gn.size();
    put(&len, 8);
    put(gn.data(), gn.size());
    const uint32_t nd = static_cast<uint32_t>(e.shape.size());
    put(&nd, 4);
    for (auto it = e.shape.rbegin(); it != e.shape.rend(); ++it) put(&*it, 8);
    const DType ty = gguf_type_of(gn, e.matrix, o.type);
    const uint32_t tid = static_cast<uint32_t>(ty);
    put(&tid, 4);
    put(&off, 8);
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < e.shape.size(); ++i) rows *= e.shape[i];
    off += (static_cast<uint64_t>(rows * row_bytes(ty, e.shape.back())) + align - 1) / align * align;
  }
  head.resize((head.size() + align - 1) / align * align, 0);
  std::ofstream out(o.out, std::ios::binary);
  FP_CHECK(out, o.out, ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
  for (auto& [gn, e] : plan) {
    const DType ty = gguf_type_of(gn, e.matrix, o.type);
    FP_CHECK(ty != DType::F8_E4M3, "synth: GGUF has no FP8 type (write a safetensors directory for F8_E4M3)");
    const int64_t cols = e.shape.back();
    FP_CHECK(cols % dtype_info(ty).block_elems == 0, "synth: tensor '", gn, "' rows have ", cols,
             " values, not a multiple of the ", dtype_name(ty), " block size ", dtype_info(ty).block_elems);
    uint64_t written = 0;
    if (e.values) {
      out.write(reinterpret_cast<const char*>(e.values->data()), static_cast<std::streamsize>(e.values->size() * 4));
      written += e.values->size() * 4;
    }
    for (const Part& part : e.parts) {
      HfTensor& t = w.at(part.src);
      fill_tensor(part.src, t, o.seed, o.fast_fill);
      if (!t.matrix && (o.type == DType::F16 || o.type == DType::BF16)) {  // as the in-memory path rounds them
        std::vector<uint8_t> tmp(t.data.size() * 2);
        quantize_row(o.type, t.data.data(), tmp.data(), static_cast<int64_t>(t.data.size()));
        dequantize_row(o.type, tmp.data(), t.data.data(), static_cast<int64_t>(t.data.size()));
      }
      std::vector<float> data;
      if (part.how == 1 || part.how == 2) {
        data = permute_rows_for_adjacent_rope(t, part.how == 1 ? c.n_heads : c.n_kv_heads);
      } else if (part.how == 3 || part.how == 4) {
        data.resize(static_cast<size_t>(H * L * (part.how == 3 ? nope : vd)));
        for (int64_t h = 0; h < H; ++h) {
          const float* hd = t.data.data() + h * (nope + vd) * L;
          if (part.how == 3)
            for (int64_t j = 0; j < nope; ++j)
              for (int64_t k = 0; k < L; ++k) data[static_cast<size_t>((h * L + k) * nope + j)] = hd[j * L + k];
          else
            std::copy(hd + nope * L, hd + (nope + vd) * L, data.begin() + h * vd * L);
        }
      } else {
        data = std::move(t.data);
      }
      if (const float shift = gguf_value_offset(gn, c); shift != 0)
        for (float& x : data) x += shift;
      t.data = std::vector<float>();
      auto bytes = encode_rows(ty, data.data(), static_cast<int64_t>(data.size()) / cols, cols);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      written += bytes.size();
    }
    static const char zeros[32] = {};
    out.write(zeros, static_cast<std::streamsize>((written + align - 1) / align * align - written));
  }
  out.flush();  // a full disk shows here, not in a destructor that cannot report it
  FP_CHECK(out, o.out, ": write failed: ", std::strerror(errno));
}

}  // namespace

std::string synth_model(const SynthOptions& o) {
  ModelConfig c = config_from_json(o.arch, o.config);
  // Multi-token-prediction layers (DeepSeek-V3, GLM-4.5): written after the model's, as in their
  // checkpoints; a forward does not run them, --speculative-method mtp drafts with the first.
  const int64_t nextn = c.arch == "glm4moe" || c.arch == "deepseek2" ? o.config.value("num_nextn_predict_layers", int64_t{0}) : 0;
  FP_CHECK(nextn >= 0 && nextn <= 4, "synth --config: num_nextn_predict_layers = ", nextn, " (0..4)");
  auto w = make_weights(c, o.seed, /*lazy=*/true, nextn);
  int64_t params = 0;
  for (auto& [n, t] : w) {
    int64_t k = 1;
    for (auto d : t.shape) k *= d;
    params += k;
  }
  bool gguf = o.out.size() > 5 && o.out.compare(o.out.size() - 5, 5, ".gguf") == 0;
  // Large GGUFs are drawn and written tensor by tensor (4 bytes per parameter would not fit).
  const bool stream = gguf && (o.stream || params > (int64_t{1} << 28));
  if (!stream)
    for (auto& [n, t] : w) fill_tensor(n, t, o.seed, o.fast_fill);
  // Norms and biases are F32 in GGUF but take the checkpoint dtype in safetensors: round them
  // through that dtype in both, so the two files hold the same values.
  if (!stream && (o.type == DType::F16 || o.type == DType::BF16))
    for (auto& [n, t] : w)
      if (!t.matrix) {
        std::vector<uint8_t> tmp(t.data.size() * 2);
        quantize_row(o.type, t.data.data(), tmp.data(), static_cast<int64_t>(t.data.size()));
        dequantize_row(o.type, tmp.data(), t.data.data(), static_cast<int64_t>(t.data.size()));
      }

  if (gguf) {
    GgufWriter g;
    std::map<std::string, std::vector<float>> f32_extras;  // streamed: tensors computed here, not drawn
    const std::string a = gguf_arch(c) + ".";
    FP_CHECK(c.arch != "hunyuan-moe", "synth: ", c.arch, " is read from safetensors only here (write a directory, not a .gguf)");
    g.set_string("general.architecture", gguf_arch(c));
    g.set_string("general.name", "synth " + c.arch + " (random weights, seed " + std::to_string(o.seed) + ")");
    g.set_u32(a + "context_length", static_cast<uint32_t>(c.max_context));
    g.set_u32(a + "embedding_length", static_cast<uint32_t>(c.dim));
    g.set_u32(a + "block_count", static_cast<uint32_t>(c.n_layers + nextn));  // llama.cpp counts the MTP layers
    if (nextn > 0) g.set_u32(a + "nextn_predict_layers", static_cast<uint32_t>(nextn));
    g.set_u32(a + "feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
    g.set_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
    g.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
    g.set_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    g.set_u32(a + "attention.value_length", static_cast<uint32_t>(c.v_head_dim));
    if (c.moe.n_experts > 0) add_moe_metadata(g, c);
    if (c.arch == "gemma2" || c.arch == "gemma3") add_gemma_metadata(g, c);
    if (c.arch == "granite" || c.arch == "granitemoe") {  // llama.cpp's keys for Granite's multipliers
      g.set_f32(a + "embedding_scale", c.embed_scale);
      g.set_f32(a + "residual_scale", c.residual_scale);
      g.set_f32(a + "attention.scale", c.attn_scale);
      g.set_f32(a + "logit_scale", c.logit_scale);
    }
    if (c.arch == "phi3" && c.sliding_window > 0) g.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    if (c.arch == "olmo3" && c.sliding_window > 0) {  // llama.cpp's olmo2 keys: the window and its period (three layers of four)
      for (int64_t l = 0; l < c.n_layers; ++l)
        FP_CHECK((c.window_of(l) > 0) == (l % 4 < 3), "synth: GGUF olmo3 slides the window on three layers of four here");
      FP_CHECK(c.rope_theta_swa == c.rope_theta, "synth: GGUF olmo3's sliding layers rotate with the base here");
      g.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
      g.set_u32(a + "attention.sliding_window_pattern", 4);
    }
    if (c.arch == "exaone4") {
      // llama.cpp decides EXAONE 4.0's layers by depth: at 64 layers a window on three of four (the
      // fourth global, without RoPE), at any other depth none, RoPE everywhere.
      for (int64_t l = 0; l < c.n_layers; ++l)
        FP_CHECK(c.n_layers == 64 ? c.sliding_window > 0 && (c.window_of(l) > 0) == (l % 4 < 3) && c.rotates(l) == (l % 4 < 3)
                                  : c.sliding_window == 0 && c.rotates(l),
                 "synth: GGUF exaone4 slides a window on three layers of four at 64 layers only, and none otherwise (llama.cpp's rule)");
      if (c.sliding_window > 0) g.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    }
    for (int64_t l = 0; c.arch == "smollm3" && l < c.n_layers; ++l)
      FP_CHECK(c.rotates(l) == ((l + 1) % 4 != 0), "synth: GGUF smollm3 leaves out RoPE on every fourth layer only (llama.cpp's pattern)");
    g.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.rot_dim));
    g.set_u32(a + "vocab_size", static_cast<uint32_t>(c.n_vocab));
    g.set_f32(a + "rope.freq_base", c.rope_theta);
    g.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    if (c.rope_scaling.type == "linear") {
      g.set_string(a + "rope.scaling.type", "linear");
      g.set_f32(a + "rope.scaling.factor", c.rope_scaling.factor);
    } else if (const RopeScaling& y = c.rope_scaling; y.type == "yarn" && c.arch != "deepseek2" && c.arch != "gpt-oss") {
      // Qwen2.5 / Qwen3 / Llama with YaRN, as llama.cpp's converters write it (ggml scales cos/sin
      // by 1 + 0.1 ln(factor) itself and rounds the correction range).
      FP_CHECK(y.truncate, "synth: GGUF yarn rounds the correction range (ggml); write \"truncate\": true or a safetensors directory");
      FP_CHECK(std::fabs(y.attn_factor - (0.1f * std::log(y.factor) + 1.0f)) < 1e-6f,
               "synth: GGUF yarn scales cos/sin by 1 + 0.1 ln(factor); write a safetensors directory for attention_factor ", y.attn_factor);
      g.set_string(a + "rope.scaling.type", "yarn");
      g.set_f32(a + "rope.scaling.factor", y.factor);
      g.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(y.original_context));
      g.set_f32(a + "rope.scaling.yarn_beta_fast", y.beta_fast);
      g.set_f32(a + "rope.scaling.yarn_beta_slow", y.beta_slow);
    } else if (c.rope_scaling.type == "llama3") {
      // As llama.cpp's converter does: the scaling becomes per-frequency divisors in rope_freqs.weight.
      ModelConfig plain = c;
      plain.rope_scaling = RopeScaling{};
      auto base = plain.rope_inv_freq(), scaled = c.rope_inv_freq();
      std::vector<float> factors(base.size());
      for (size_t i = 0; i < base.size(); ++i) factors[i] = base[i] / scaled[i];
      if (stream) {
        f32_extras["rope_freqs.weight"] = std::move(factors);
      } else {
        std::vector<uint8_t> bytes(factors.size() * 4);
        std::memcpy(bytes.data(), factors.data(), bytes.size());
        g.add_tensor("rope_freqs.weight", DType::F32, {static_cast<int64_t>(factors.size())}, std::move(bytes));
      }
    }
    if (c.rope_scaling.type == "longrope") {
      // As llama.cpp's converter writes LongRoPE: both factor sets as tensors, the attention factor
      // and the original context as keys.
      g.set_f32(a + "rope.scaling.attn_factor", c.rope_scaling.attn_factor);
      g.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(c.rope_scaling.original_context));
      for (auto [name, f] : {std::pair{"rope_factors_long.weight", &c.rope_scaling.long_factor},
                             std::pair{"rope_factors_short.weight", &c.rope_scaling.short_factor}}) {
        if (stream) {
          f32_extras[name] = *f;
        } else {
          std::vector<uint8_t> bytes(f->size() * 4);
          std::memcpy(bytes.data(), f->data(), bytes.size());
          g.add_tensor(name, DType::F32, {static_cast<int64_t>(f->size())}, std::move(bytes));
        }
      }
    }
    if (c.n_vocab >= 3 + 256 + 52) add_synth_vocab(g, c.n_vocab);
    if (stream) {
      write_gguf_streaming(o, c, g, w, f32_extras);
      return "synth: wrote " + o.out + " (" + c.arch + ", " + std::to_string(params) + " parameters, " + dtype_name(o.type) +
             " matrices, streamed)";
    }
    for (auto& [gn, t] : gguf_layout(w, c, o.split_kv_b)) {
      std::vector<float> data = t.data;
      const bool adjacent = gguf_adjacent_rope(c);  // llama.cpp's converters permute these
      if (adjacent && (gn.find("attn_q.weight") != std::string::npos))
        data = permute_rows_for_adjacent_rope(t, c.n_heads);
      if (adjacent && (gn.find("attn_k.weight") != std::string::npos))
        data = permute_rows_for_adjacent_rope(t, c.n_kv_heads);
      if (const float shift = gguf_value_offset(gn, c); shift != 0)
        for (float& x : data) x += shift;
      const DType ty = gguf_type_of(gn, t.matrix, o.type);
      FP_CHECK(ty != DType::F8_E4M3, "synth: GGUF has no FP8 type (write a safetensors directory for F8_E4M3)");
      const int64_t cols = t.shape.back(), rows = static_cast<int64_t>(t.data.size()) / cols;
      FP_CHECK(cols % dtype_info(ty).block_elems == 0, "synth: tensor '", gn, "' rows have ", cols,
               " values, not a multiple of the ", dtype_name(ty), " block size ", dtype_info(ty).block_elems);
      std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
      g.add_tensor(gn, ty, ne, encode_rows(ty, data.data(), rows, cols));
    }
    g.write(o.out);
  } else {
    FP_CHECK(o.type == DType::F32 || o.type == DType::F16 || o.type == DType::BF16 || o.type == DType::F8_E4M3 ||
                 (o.type == DType::MXFP4 && c.arch == "gpt-oss"),
             "synth: safetensors holds F32, F16, BF16 or F8_E4M3 weights (MXFP4 experts for gpt_oss), not ", dtype_name(o.type),
             " (write a .gguf)");
    std::filesystem::create_directories(o.out);
    SafetensorsWriter st;
    if (c.arch == "gpt-oss") add_gpt_oss_experts(st, w, c, o.type);
    if (c.arch == "granitemoe") add_granite_moe_experts(st, w, c, o.type);
    if (c.arch == "llama4") add_llama4_experts(st, w, c, o.type);
    for (auto& [name, t] : w) {
      if (c.arch == "llama4" && name.find(".feed_forward.experts.") != std::string::npos) continue;  // stacked above
      if ((c.arch == "gpt-oss" || c.arch == "granitemoe") && name.find(".mlp.experts.") != std::string::npos) continue;  // stacked above
      if (c.arch == "granitemoe" && name.find(".mlp.shared_experts.") != std::string::npos) continue;
      int64_t rows = t.shape.size() > 1 ? t.shape[0] : 1, cols = t.shape.back();
      if (o.type == DType::F8_E4M3 && t.matrix && name != "model.embed_tokens.weight") {
        // DeepSeek-V3 layout: E4M3 weights with one f32 scale_inv per 128x128 block (amax / 448).
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        // One task per row of 128x128 blocks (its scales, then its values), in parallel.
        std::vector<float> scale(static_cast<size_t>(sr * sc), 0.0f);
        std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
        thread_pool().parallel_for(sr, 1, [&](int64_t b0, int64_t b1) {
          for (int64_t r = b0 * 128; r < std::min(rows, b1 * 128); ++r)
            for (int64_t k = 0; k < cols; ++k) {
              float& s = scale[static_cast<size_t>((r / 128) * sc + k / 128)];
              s = std::max(s, std::fabs(t.data[static_cast<size_t>(r * cols + k)]) / 448.0f);
            }
          for (int64_t i = b0 * sc; i < b1 * sc; ++i)
            if (scale[static_cast<size_t>(i)] == 0) scale[static_cast<size_t>(i)] = 1;
          for (int64_t r = b0 * 128; r < std::min(rows, b1 * 128); ++r)
            for (int64_t k = 0; k < cols; ++k)
              q[static_cast<size_t>(r * cols + k)] =
                  f32_to_fp8e4m3(t.data[static_cast<size_t>(r * cols + k)] / scale[static_cast<size_t>((r / 128) * sc + k / 128)]);
        });
        st.add(name, DType::F8_E4M3, t.shape, std::move(q));
        std::vector<uint8_t> sb(scale.size() * 4);
        std::memcpy(sb.data(), scale.data(), sb.size());
        st.add(name.substr(0, name.size() - 7) + ".weight_scale_inv", DType::F32, {sr, sc}, std::move(sb));
        continue;
      }
      DType ty = o.type == DType::F8_E4M3 || o.type == DType::MXFP4 ? DType::F32 : o.type;
      st.add(name, ty, t.shape, encode_rows(ty, t.data.data(), rows, cols));
    }
    st.write(o.out + "/model.safetensors");
    nlohmann::json cfg = o.config;
    cfg["architectures"] = {c.arch == "llama" ? "LlamaForCausalLM" : c.arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"};
    cfg["model_type"] = c.arch;
    if (o.arch == "mistral") {
      cfg["architectures"] = {"MistralForCausalLM"};
      cfg["model_type"] = "mistral";
      cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    }
    cfg["hidden_size"] = c.dim;
    cfg["intermediate_size"] = c.hidden_dim;
    cfg["num_hidden_layers"] = c.n_layers;
    cfg["num_attention_heads"] = c.n_heads;
    cfg["num_key_value_heads"] = c.n_kv_heads;
    cfg["head_dim"] = c.head_dim;
    cfg["vocab_size"] = c.n_vocab;
    cfg["max_position_embeddings"] = c.max_context;
    cfg["rms_norm_eps"] = c.rms_eps;
    cfg["rope_theta"] = c.rope_theta;
    cfg["tie_word_embeddings"] = c.tied_output;
    cfg["torch_dtype"] = o.type == DType::BF16 ? "bfloat16" : o.type == DType::F16 ? "float16" : "float32";
    if (c.arch == "gpt-oss") hf_gpt_oss_config(cfg, c, o.type);
    else if (c.arch == "gemma2" || c.arch == "gemma3") hf_gemma_config(cfg, c);
    else if (c.arch == "ernie4_5-moe") {
      cfg["architectures"] = {"Ernie4_5_MoeForCausalLM"};
      cfg["model_type"] = "ernie4_5_moe";
      cfg["use_bias"] = false;
      cfg["pad_token_id"] = nullptr;
      cfg["moe_num_experts"] = c.moe.n_experts;
      cfg["moe_k"] = c.moe.n_used;
      cfg["moe_intermediate_size"] = c.moe.ff;
      cfg["moe_num_shared_experts"] = c.moe.n_shared;
      cfg["moe_layer_start_index"] = c.moe.first_dense;
      cfg["moe_layer_interval"] = c.moe.sparse_step;
      int64_t end = c.n_layers - 1;
      while (end >= 0 && !c.moe.is_moe_layer(end)) --end;
      cfg["moe_layer_end_index"] = end;
    }
    else if (c.arch == "minimax-m2") {
      cfg["architectures"] = {"MiniMaxM2ForCausalLM"};
      cfg["model_type"] = "minimax_m2";
      cfg["num_local_experts"] = c.moe.n_experts;
      cfg["num_experts_per_tok"] = c.moe.n_used;
      cfg["rotary_dim"] = c.rot_dim;
      cfg["use_qk_norm"] = true;
      cfg["qk_norm_type"] = "per_layer";
      cfg["scoring_func"] = "sigmoid";
      cfg["use_routing_bias"] = true;
      cfg["attn_type_list"] = std::vector<int>(static_cast<size_t>(c.n_layers), 1);
      cfg["bos_token_id"] = 1;  // MiniMaxM2Config's defaults lie outside a small vocabulary
      cfg["eos_token_id"] = 2;
    }
    else if (c.arch == "granite" || c.arch == "granitemoe") {
      const bool moe = c.arch == "granitemoe", shared = moe && c.moe.n_shared > 0;
      cfg["architectures"] = {!moe ? "GraniteForCausalLM" : shared ? "GraniteMoeSharedForCausalLM" : "GraniteMoeForCausalLM"};
      cfg["model_type"] = !moe ? "granite" : shared ? "granitemoeshared" : "granitemoe";
      if (moe) {
        cfg["num_local_experts"] = c.moe.n_experts;
        cfg["num_experts_per_tok"] = c.moe.n_used;
        if (shared) cfg["shared_intermediate_size"] = c.moe.shared_width();
      }
      cfg["embedding_multiplier"] = c.embed_scale;
      cfg["residual_multiplier"] = c.residual_scale;
      cfg["attention_multiplier"] = c.attn_scale;
      cfg["logits_scaling"] = c.logit_scale;
      cfg["attention_bias"] = false;
      cfg["mlp_bias"] = false;
    }
    else if (c.arch == "glm4") {
      cfg["architectures"] = {"Glm4ForCausalLM"};
      cfg["model_type"] = "glm4";
      cfg["attention_bias"] = c.qkv_bias;
      cfg["partial_rotary_factor"] = static_cast<double>(c.rot_dim) / static_cast<double>(c.head_dim);
      cfg["pad_token_id"] = nullptr;  // Glm4Config's defaults lie outside a small vocabulary
      cfg["eos_token_id"] = 2;
    }
    else if (c.arch == "exaone4") {
      cfg["architectures"] = {"Exaone4ForCausalLM"};
      cfg["model_type"] = "exaone4";
      cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
      std::vector<std::string> types;
      for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
      cfg["layer_types"] = types;
      cfg["bos_token_id"] = 1;
      cfg["eos_token_id"] = 2;
    }
    else if (c.arch == "hunyuan-dense" || c.arch == "hunyuan-moe") {
      const bool moe = c.arch == "hunyuan-moe";
      cfg["architectures"] = {moe ? "HunYuanMoEV1ForCausalLM" : "HunYuanDenseV1ForCausalLM"};
      cfg["model_type"] = moe ? "hunyuan_v1_moe" : "hunyuan_v1_dense";
      if (moe) {
        cfg["num_experts"] = c.moe.n_experts;
        cfg["moe_topk"] = c.moe.n_used;
      }
      cfg["attention_bias"] = false;
      cfg["rope_theta"] = o.config.value("rope_theta", 10000.0);  // the file's base; the alpha scales it
      cfg["use_qk_norm"] = true;
    }
    else if (c.arch == "llama4") {
      cfg["architectures"] = {"Llama4ForCausalLM"};
      cfg["model_type"] = "llama4_text";
      cfg["intermediate_size"] = c.moe.ff;
      cfg["intermediate_size_mlp"] = c.hidden_dim;
      cfg["num_local_experts"] = c.moe.n_experts;
      cfg["num_experts_per_tok"] = c.moe.n_used;
      std::vector<int64_t> sparse;
      std::vector<int> rope;
      std::vector<std::string> types;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        if (c.moe.is_moe_layer(l)) sparse.push_back(l);
        rope.push_back(c.rotates(l) ? 1 : 0);
        types.push_back(c.chunk_of(l) > 0 ? "chunked_attention" : "full_attention");
      }
      cfg["moe_layers"] = sparse;
      cfg["no_rope_layers"] = rope;
      cfg["attention_chunk_size"] = c.attention_chunk > 0 ? nlohmann::json(c.attention_chunk) : nlohmann::json(nullptr);
      cfg["layer_types"] = types;
      cfg["use_qk_norm"] = c.qk_l2_norm;
      cfg["attn_temperature_tuning"] = c.nope_temp_floor > 0;
      cfg["floor_scale"] = c.nope_temp_floor > 0 ? static_cast<int64_t>(c.nope_temp_floor) : 8192;
      cfg["attn_scale"] = c.nope_temp_scale;
      cfg["attention_bias"] = false;
      cfg["hidden_act"] = "silu";
      cfg["pad_token_id"] = nullptr;
      cfg["bos_token_id"] = 1;
      cfg["eos_token_id"] = 2;
    }
    else if (c.arch == "olmo3") {
      cfg["architectures"] = {"Olmo3ForCausalLM"};
      cfg["model_type"] = "olmo3";
      cfg["sliding_window"] = c.sliding_window;
      std::vector<std::string> types;
      for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
      cfg["layer_types"] = types;
      cfg["attention_bias"] = false;
      cfg["pad_token_id"] = nullptr;
    }
    else if (c.arch == "olmo2") {
      cfg["architectures"] = {"Olmo2ForCausalLM"};
      cfg["model_type"] = "olmo2";
      cfg["attention_bias"] = false;
      cfg["pad_token_id"] = nullptr;
    }
    else if (c.arch == "seed_oss") {
      cfg["architectures"] = {"SeedOssForCausalLM"};
      cfg["model_type"] = "seed_oss";
      cfg["attention_bias"] = c.qkv_bias;
      cfg["attention_out_bias"] = false;
      cfg["mlp_bias"] = false;
      cfg["pad_token_id"] = nullptr;  // SeedOssConfig's defaults
      cfg["bos_token_id"] = 1;
      cfg["eos_token_id"] = 2;
    }
    else if (c.arch == "ernie4_5") {
      cfg["architectures"] = {"Ernie4_5ForCausalLM"};
      cfg["model_type"] = "ernie4_5";
      cfg["use_bias"] = false;
      cfg["pad_token_id"] = nullptr;
    }
    else if (c.arch == "smollm3") {
      cfg["architectures"] = {"SmolLM3ForCausalLM"};
      cfg["model_type"] = "smollm3";
      std::vector<int> rope;
      for (int64_t l = 0; l < c.n_layers; ++l) rope.push_back(c.rotates(l) ? 1 : 0);
      cfg["no_rope_layers"] = rope;
      cfg["use_sliding_window"] = false;
      cfg["attention_bias"] = false;
      cfg["mlp_bias"] = false;
      cfg["pad_token_id"] = nullptr;
    }
    else if (c.arch == "phi3") {
      cfg["architectures"] = {"Phi3ForCausalLM"};
      cfg["model_type"] = "phi3";
      cfg["partial_rotary_factor"] = static_cast<double>(c.rot_dim) / static_cast<double>(c.head_dim);
      cfg["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
      cfg["original_max_position_embeddings"] = c.rope_scaling.type == "longrope" ? c.rope_scaling.original_context : c.max_context;
      cfg["attention_bias"] = false;
      cfg["pad_token_id"] = nullptr;  // Phi3Config's defaults (32000) lie outside a small vocabulary
      cfg["bos_token_id"] = 1;
      cfg["eos_token_id"] = 2;
    }
    else if (c.moe.n_experts > 0) hf_moe_config(cfg, c, o.arch);
    std::ofstream(o.out + "/config.json") << cfg.dump(2) << "\n";
    if (!o.tokenizer_json.empty()) std::filesystem::copy_file(o.tokenizer_json, o.out + "/tokenizer.json",
                                                              std::filesystem::copy_options::overwrite_existing);
  }
  return "synth: wrote " + o.out + " (" + c.arch + ", " + std::to_string(params) + " parameters, " +
         dtype_name(o.type) + " matrices)";
}

}  // namespace fp
