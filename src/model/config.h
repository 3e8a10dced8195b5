// model/config.h — what an architecture needs to know about a model, whatever file it came
// from: dimensions, attention layout, RoPE and its scaling, normalisation, output tying.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace fp {

struct RopeScaling {
  std::string type = "none";  // "none", "linear", "llama3", "yarn", "longrope"
  float factor = 1.0f;
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3
  int64_t original_context = 0;                            // llama3 / yarn
  // YaRN: correction range (beta_fast / beta_slow rotations), the factor cos/sin are multiplied
  // by (HF attention_factor; 1 for llama.cpp, which cancels it), and the softmax-scale factor
  // mscale^2 with mscale = 1 + log_multiplier * ln(factor) (DeepSeek: 0.1 * mscale_all_dim).
  float beta_fast = 32.0f, beta_slow = 1.0f;
  bool truncate = true;  // YaRN: round the correction range outwards (HF's default; gpt-oss says false)
  float attn_factor = 1.0f;
  float log_multiplier = 0.0f;
  // LongRoPE (Phi-3.5, Phi-4-mini): per-frequency divisors for contexts up to original_context
  // (short) and beyond it (long); cos/sin times attn_factor with either. Which set a model uses is
  // fixed when it is loaded (use_long, from the longest sequence it will serve: LoadOptions::
  // max_model_len), so every cached key is rotated the same way (docs/design.md, "LongRoPE").
  std::vector<float> short_factor, long_factor;
  bool use_long = false;
};

// Mixture-of-Experts FFN (qwen3moe, qwen2moe, mixtral, glm4moe, gpt-oss, deepseek2). n_experts == 0:
// every layer is dense.
struct MoeConfig {
  int64_t n_experts = 0, n_used = 0;  // routed experts, experts per token
  int64_t ff = 0;                      // width of one routed expert
  int64_t n_shared = 0;                // shared experts (their FFN is n_shared * ff wide, or shared_ff)
  int64_t shared_ff = 0;               // Qwen2-MoE: the shared expert's own width (0: n_shared * ff)
  bool shared_gate = false;            // Qwen2-MoE: the shared expert's output times sigmoid(gate · x)
  int64_t first_dense = 0;             // DeepSeek first_k_dense_replace
  int64_t sparse_step = 1;             // Qwen decoder_sparse_step
  std::vector<int64_t> dense_layers;   // Qwen mlp_only_layers
  std::string scoring = "softmax";     // or "sigmoid"
  bool norm_topk = false;
  float scale = 1.0f;                  // routed_scaling_factor
  int64_t n_group = 1, topk_group = 1; // group-limited routing
  std::string group_score = "max";     // "max" (V2) or "top2sum" (V3)
  bool has_bias = false;               // e_score_correction_bias / exp_probs_b
  // gpt-oss: a bias on the router's logits and on each expert's projections, and the clamped
  // SwiGLU (kernels/ops_moe.h, MoeActivation::SwigluClamped).
  bool router_bias = false, expert_bias = false;
  bool swiglu_clamped = false;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  // Llama 4: the router's score (sigmoid of the top-1 logit) multiplies the expert's input
  // instead of its output; the shared expert takes the unscaled input (model/moe_layers.cpp).
  bool scale_input = false;
  bool is_moe_layer(int64_t l) const;
  int64_t shared_width() const { return shared_ff > 0 ? shared_ff : n_shared * ff; }
};

// Multi-head latent attention (deepseek2): head_dim = qk_nope + rot_dim, v_head_dim = v.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: q = attn_q · h (no query compression)
  int64_t kv_lora_rank = 0; // 0: not MLA
};

struct ModelConfig {
  std::string arch;    // "llama", "qwen2", "qwen3"
  std::string name;    // general.name or the directory name
  std::string source;  // "gguf", "safetensors", "llama2c"
  int64_t n_vocab = 0, dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, v_head_dim = 0;
  int64_t hidden_dim = 0;  // FFN width
  int64_t max_context = 0;
  int64_t rot_dim = 0;  // RoPE dimensions per head (<= head_dim)
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::Adjacent;
  RopeScaling rope_scaling;
  float rms_eps = 1e-5f;
  bool tied_output = false;  // output projection is the embedding table
  bool qkv_bias = false;     // Qwen2
  bool qk_norm = false;      // Qwen3: RMSNorm over each head of q and k before RoPE
  // gpt-oss: a bias on the attention output, a learned sink logit per head (AttentionArgs::sinks),
  // and sliding-window attention (AttentionArgs::window) on the layers swa_layers marks.
  bool o_bias = false;
  bool attn_sinks = false;
  int64_t sliding_window = 0;
  std::vector<bool> swa_layers;  // [n_layers] when sliding_window > 0
  int64_t window_of(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(swa_layers.size()) && swa_layers[static_cast<size_t>(layer)]
               ? sliding_window : 0;
  }
  // OLMo 2: no norm before the attention and the FFN (only post_norms after them), and q/k
  // normalised over the whole projection (every head together) instead of per head.
  bool pre_norms = true;
  bool qk_norm_full = false;
  // Hunyuan: q and k normed per head after RoPE instead of before it.
  bool qk_norm_after_rope = false;
  // SmolLM3: the layers whose q and k are not rotated (NoPE; empty: every layer rotates).
  std::vector<bool> nope_layers;
  bool rotates(int64_t layer) const {
    return layer >= static_cast<int64_t>(nope_layers.size()) || !nope_layers[static_cast<size_t>(layer)];
  }
  // Llama 4: chunked attention (AttentionArgs::chunk) on the layers chunked_layers marks (the
  // rotating ones), their q and k L2-normed per head after RoPE (an RMS norm without weights,
  // qk_l2_norm), and the queries of the NoPE layers times 1 + nope_temp_scale * ln(1 +
  // floor((pos + 1) / nope_temp_floor)) (attn_temperature_tuning; nope_temp_floor 0: off).
  int64_t attention_chunk = 0;
  std::vector<bool> chunked_layers;  // [n_layers] when attention_chunk > 0
  int64_t chunk_of(int64_t layer) const {
    return attention_chunk > 0 && layer < static_cast<int64_t>(chunked_layers.size()) && chunked_layers[static_cast<size_t>(layer)]
               ? attention_chunk : 0;
  }
  bool qk_l2_norm = false;
  float nope_temp_floor = 0.0f, nope_temp_scale = 0.0f;
  // The factor on a NoPE layer's queries at position pos (1 without temperature tuning).
  float nope_query_scale(int64_t pos) const {
    if (nope_temp_floor <= 0) return 1.0f;
    return 1.0f + nope_temp_scale * std::log1p(std::floor((static_cast<float>(pos) + 1.0f) / nope_temp_floor));
  }
  // Gemma 2 and 3: the embedding rows times embed_scale (sqrt(dim)), a norm after the attention and
  // after the FFN too ("sandwich": post_attention_norm, post_ffw_norm) before each residual add,
  // the GeGLU FFN (gelu_tanh(gate) * up), scores scaled by attn_scale (query_pre_attn_scalar^-1/2)
  // and the sliding-window layers rotated with their own unscaled base rope_theta_swa.
  float embed_scale = 1.0f;
  float attn_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  bool post_norms = false;
  bool gelu_ffn = false;
  float rope_theta_swa = 0.0f;  // 0: the sliding layers rotate as the others
  // Gemma 2: scores and final logits soft-capped, x -> cap * tanh(x / cap) (0: off).
  float attn_softcap = 0.0f;   // attn_logit_softcapping (AttentionArgs::softcap)
  float final_softcap = 0.0f;  // final_logit_softcapping (SoftcapArgs on the logits)
  // Added to every RMSNorm weight at load: Gemma's checkpoints store w - 1 (its GGUFs have the 1
  // added by the converter).
  float norm_weight_offset = 0.0f;
  float attention_scale() const { return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  // Granite: each sublayer's output times residual_scale before it joins the residual stream,
  // the logits divided by logit_scale (embeddings times embed_scale, scores times attn_scale).
  // RMSNorm ignores its input's scale, so a stream y = x / residual_scale needs no scaling per
  // sublayer: fold_residual_scale() divides embed_scale by it and the norms' eps by its square
  // (the loaders call it; docs/design.md, "Granite"). The Llama class folds 1 / logit_scale into
  // the output norm's weights.
  float residual_scale = 1.0f, logit_scale = 1.0f;
  bool residual_folded = false;
  void fold_residual_scale() {
    if (residual_folded || residual_scale == 1.0f) return;
    embed_scale /= residual_scale;
    rms_eps /= residual_scale * residual_scale;
    residual_folded = true;
  }
  MoeConfig moe;
  MlaConfig mla;
  // Multi-token-prediction layers stored after the n_layers (DeepSeek-V3, GLM-4.5:
  // num_nextn_predict_layers). The forward never runs them; with LoadOptions::mtp the first is
  // loaded as the model's own draft layer (Model::mtp_forward).
  int64_t mtp_layers = 0;

  void validate(const std::string& where) const;  // throws naming `where` and the field
  std::string describe() const;
  // Inverse RoPE frequencies, [rot_dim/2], with linear / llama3 / yarn scaling applied.
  std::vector<float> rope_inv_freq() const;
  // Those of the sliding-window layers where they have their own base (rope_theta_swa, unscaled).
  std::vector<float> rope_inv_freq_swa() const;
};

}  // namespace fp
