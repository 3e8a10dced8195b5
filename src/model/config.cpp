// model/config.cpp — validation, description and RoPE frequencies of a ModelConfig.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace fp {

void ModelConfig::validate(const std::string& where) const {
  auto need = [&](bool ok, const char* field, int64_t v, const char* expect) {
    if (!ok) fail(where, ": ", field, " = ", v, " (", expect, ")");
  };
  need(n_vocab > 0, "vocab size", n_vocab, "must be positive");
  need(dim > 0, "hidden size", dim, "must be positive");
  need(n_layers > 0, "layer count", n_layers, "must be positive");
  need(n_heads > 0, "attention head count", n_heads, "must be positive");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "kv head count", n_kv_heads, "must divide the head count");
  need(head_dim > 0 && head_dim % 2 == 0, "head dim", head_dim, "must be positive and even");
  need(rot_dim > 0 && rot_dim <= head_dim && rot_dim % 2 == 0, "rope dimension count", rot_dim, "must be even and <= head dim");
  need(hidden_dim > 0, "feed-forward length", hidden_dim, "must be positive");
  need(max_context > 0, "context length", max_context, "must be positive");
  FP_CHECK(rms_eps > 0 && std::isfinite(rms_eps), where, ": rms norm epsilon ", rms_eps, " must be positive");
  FP_CHECK(rope_theta > 0 && std::isfinite(rope_theta), where, ": rope theta ", rope_theta, " must be positive");
  for (auto [v, what] : {std::pair{residual_scale, "residual multiplier"}, std::pair{logit_scale, "logits scaling"},
                         std::pair{embed_scale, "embedding multiplier"}})
    FP_CHECK(v > 0 && std::isfinite(v), where, ": ", what, " ", v, " must be positive");
  FP_CHECK(attn_scale >= 0 && std::isfinite(attn_scale), where, ": attention multiplier ", attn_scale, " must be positive");
  FP_CHECK(rope_scaling.factor > 0, where, ": rope scaling factor ", rope_scaling.factor, " must be positive");
  if (rope_scaling.type == "yarn")
    need(rope_scaling.original_context > 0, "yarn original context length", rope_scaling.original_context, "must be positive");
  if (rope_scaling.type == "longrope") {
    need(rope_scaling.original_context > 0, "LongRoPE original context length", rope_scaling.original_context, "must be positive");
    for (const auto* f : {&rope_scaling.short_factor, &rope_scaling.long_factor}) {
      const char* which = f == &rope_scaling.short_factor ? "LongRoPE short_factor length" : "LongRoPE long_factor length";
      need(static_cast<int64_t>(f->size()) == rot_dim / 2, which, static_cast<int64_t>(f->size()),
           ("must be half the rotated dimensions, " + std::to_string(rot_dim / 2)).c_str());
      for (float v : *f)
        FP_CHECK(std::isfinite(v) && v > 0, where, ": LongRoPE factor ", v, " must be positive");
    }
    FP_CHECK(std::isfinite(rope_scaling.attn_factor) && rope_scaling.attn_factor > 0, where, ": LongRoPE attention factor ",
             rope_scaling.attn_factor, " must be positive");
  }
  if (moe.n_experts > 0) {
    need(moe.n_used >= 1 && moe.n_used <= moe.n_experts, "experts per token", moe.n_used,
         ("must be in [1, expert count " + std::to_string(moe.n_experts) + "]").c_str());
    need(moe.ff > 0, "expert feed-forward length", moe.ff, "must be positive");
    need(moe.n_shared >= 0, "shared expert count", moe.n_shared, "must not be negative");
    need(moe.shared_ff >= 0, "shared expert feed-forward length", moe.shared_ff, "must not be negative");
    need(moe.sparse_step >= 1, "decoder sparse step", moe.sparse_step, "must be positive");
    need(moe.first_dense >= 0 && moe.first_dense <= n_layers, "leading dense layer count", moe.first_dense, "must be in [0, layers]");
    need(moe.n_group >= 1 && moe.n_experts % moe.n_group == 0, "expert group count", moe.n_group,
         ("must divide the expert count " + std::to_string(moe.n_experts)).c_str());
    need(moe.topk_group >= 1 && moe.topk_group <= moe.n_group, "groups per token (topk_group)", moe.topk_group,
         "must be in [1, expert group count]");
    need(moe.n_used <= moe.topk_group * (moe.n_experts / moe.n_group), "experts per token", moe.n_used,
         "must not exceed the experts of the selected groups");
    FP_CHECK(moe.scoring == "softmax" || moe.scoring == "sigmoid", where, ": expert scoring function '", moe.scoring,
             "' (must be softmax or sigmoid)");
    FP_CHECK(std::isfinite(moe.scale) && moe.scale > 0, where, ": routed scaling factor ", moe.scale, " must be positive");
    if (moe.group_score == "top2sum" && moe.n_group > 1)
      need(moe.n_experts / moe.n_group >= 2, "experts per group", moe.n_experts / moe.n_group, "must be >= 2 for top-2 group scores");
  }
  if (!nope_layers.empty())
    need(static_cast<int64_t>(nope_layers.size()) == n_layers, "no-RoPE layer list length", static_cast<int64_t>(nope_layers.size()),
         "must equal the layer count");
  if (sliding_window > 0)
    need(static_cast<int64_t>(swa_layers.size()) == n_layers, "sliding-window layer list length",
         static_cast<int64_t>(swa_layers.size()), "must equal the layer count");
  need(sliding_window >= 0, "sliding window", sliding_window, "must not be negative");
  need(attention_chunk >= 0, "attention chunk size", attention_chunk, "must not be negative");
  if (attention_chunk > 0)
    need(static_cast<int64_t>(chunked_layers.size()) == n_layers, "chunked-attention layer list length",
         static_cast<int64_t>(chunked_layers.size()), "must equal the layer count");
  FP_CHECK(std::isfinite(nope_temp_floor) && nope_temp_floor >= 0 && std::isfinite(nope_temp_scale), where,
           ": attention temperature tuning floor ", nope_temp_floor, " / scale ", nope_temp_scale, " must be finite, the floor >= 0");
  FP_CHECK(std::isfinite(embed_scale) && embed_scale > 0, where, ": embedding scale ", embed_scale, " must be positive");
  FP_CHECK(std::isfinite(attn_scale) && attn_scale >= 0, where, ": attention scale ", attn_scale, " must be positive");
  FP_CHECK(std::isfinite(rope_theta_swa) && rope_theta_swa >= 0, where, ": sliding-window rope theta ", rope_theta_swa,
           " must be positive");
  for (float cap : {attn_softcap, final_softcap})
    FP_CHECK(std::isfinite(cap) && cap >= 0, where, ": logit soft-capping ", cap, " must be positive (0: off)");
  if (moe.swiglu_clamped)
    FP_CHECK(std::isfinite(moe.swiglu_limit) && moe.swiglu_limit > 0 && std::isfinite(moe.swiglu_alpha), where,
             ": swiglu_limit ", moe.swiglu_limit, " / swiglu_alpha ", moe.swiglu_alpha, " must be finite (limit positive)");
  if (mla.kv_lora_rank > 0) {
    need(rot_dim < head_dim, "qk rope head dim", rot_dim, "must be smaller than the query/key head dim (nope + rope)");
    need(v_head_dim > 0, "value head dim", v_head_dim, "must be positive");
    need(mla.q_lora_rank >= 0, "q_lora_rank", mla.q_lora_rank, "must not be negative");
  }
}

bool MoeConfig::is_moe_layer(int64_t l) const {
  if (n_experts <= 0 || l < first_dense) return false;
  for (int64_t d : dense_layers)
    if (d == l) return false;
  return (l + 1) % sparse_step == 0;
}

std::string ModelConfig::describe() const {
  std::ostringstream os;
  os << "arch " << arch << " (" << source << "), vocab " << n_vocab << ", dim " << dim << ", layers " << n_layers
     << ", heads " << n_heads << " (kv " << n_kv_heads << ", head dim " << head_dim << "), ffn " << hidden_dim
     << ", context " << max_context << ", rope " << (rope_style == RopeStyle::NeoX ? "neox" : "adjacent-pairs")
     << " theta " << rope_theta << " dims " << rot_dim;
  if (rope_scaling.type == "longrope")
    os << " scaling longrope (" << (rope_scaling.use_long ? "long" : "short") << " factors, original context "
       << rope_scaling.original_context << ", cos/sin x" << rope_scaling.attn_factor << ")";
  else if (rope_scaling.type != "none")
    os << " scaling " << rope_scaling.type << " x" << rope_scaling.factor;
  os << ", rms eps " << rms_eps << (tied_output ? ", tied output" : ", untied output");
  if (qkv_bias) os << ", qkv bias";
  if (qk_norm) os << (qk_norm_full ? ", q/k norm over the whole projection" : ", q/k norm") << (qk_norm_after_rope ? " after RoPE" : "");
  if (!pre_norms) os << ", no norm before the sublayers";
  if (o_bias) os << ", output bias";
  if (attn_sinks) os << ", attention sinks";
  if (sliding_window > 0) {
    int64_t n = 0;
    for (bool b : swa_layers) n += b;
    os << ", sliding window " << sliding_window << " on " << n << " of " << n_layers << " layers";
  }
  if (rope_theta_swa > 0) os << " (sliding layers theta " << rope_theta_swa << ", unscaled)";
  if (attention_chunk > 0) {
    int64_t n = 0;
    for (bool b : chunked_layers) n += b;
    os << ", attention chunks of " << attention_chunk << " on " << n << " of " << n_layers << " layers";
  }
  if (qk_l2_norm) os << ", q/k L2 norm after RoPE";
  if (nope_temp_floor > 0) os << ", NoPE query temperature (floor " << nope_temp_floor << ", scale " << nope_temp_scale << ")";
  if (moe.scale_input) os << ", router score on the expert input";
  if (!nope_layers.empty()) {
    int64_t n = 0;
    for (bool b : nope_layers) n += b;
    os << ", no RoPE on " << n << " of " << n_layers << " layers";
  }
  if (embed_scale != 1.0f) os << ", embeddings x" << embed_scale;
  if (residual_scale != 1.0f)
    os << ", sublayer outputs x" << residual_scale << (residual_folded ? " (folded into the embedding scale and the norms' eps)" : "");
  if (logit_scale != 1.0f) os << ", logits / " << logit_scale;
  if (attn_scale > 0) os << ", attention scale " << attn_scale;
  if (post_norms) os << ", post-attention/FFN norms";
  if (gelu_ffn) os << ", GeGLU FFN";
  if (attn_softcap > 0) os << ", scores soft-capped at " << attn_softcap;
  if (final_softcap > 0) os << ", logits soft-capped at " << final_softcap;
  if (mla.kv_lora_rank > 0)
    os << ", MLA (q_lora " << mla.q_lora_rank << ", kv_lora " << mla.kv_lora_rank << ", nope " << head_dim - rot_dim
       << ", rope " << rot_dim << ", v " << v_head_dim << ")";
  if (moe.n_experts > 0) {
    os << ", MoE " << moe.n_experts << " experts top-" << moe.n_used << " (ff " << moe.ff << ", " << moe.scoring;
    if (moe.has_bias) os << " +bias";
    if (moe.router_bias) os << ", router bias";
    if (moe.expert_bias) os << ", expert biases";
    if (moe.swiglu_clamped) os << ", clamped swiglu (alpha " << moe.swiglu_alpha << ", limit " << moe.swiglu_limit << ")";
    if (moe.n_group > 1) os << ", groups " << moe.topk_group << "/" << moe.n_group << " by " << moe.group_score;
    if (moe.norm_topk) os << ", normalised";
    if (moe.scale != 1.0f) os << ", scale " << moe.scale;
    if (moe.n_shared) os << ", " << moe.n_shared << " shared";
    if (moe.shared_ff > 0) os << " (ff " << moe.shared_ff << ")";
    if (moe.n_shared && moe.shared_gate) os << " behind a sigmoid gate";
    if (moe.first_dense) os << ", first " << moe.first_dense << " dense";
    if (moe.sparse_step > 1) os << ", every " << moe.sparse_step << "th layer";
    if (!moe.dense_layers.empty()) os << ", " << moe.dense_layers.size() << " mlp-only layers";
    os << ")";
  }
  return os.str();
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  std::vector<float> f(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    double inv = std::pow(static_cast<double>(rope_theta), -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    if (rope_scaling.type == "linear") {
      inv /= rope_scaling.factor;
    } else if (rope_scaling.type == "longrope") {
      inv /= (rope_scaling.use_long ? rope_scaling.long_factor : rope_scaling.short_factor)[static_cast<size_t>(i)];
    } else if (rope_scaling.type == "llama3") {
      // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
      double old_ctx = static_cast<double>(rope_scaling.original_context);
      double low_wl = old_ctx / rope_scaling.low_freq_factor, high_wl = old_ctx / rope_scaling.high_freq_factor;
      double wl = 2 * M_PI / inv;
      if (wl > low_wl) {
        inv /= rope_scaling.factor;
      } else if (wl >= high_wl && high_wl < low_wl) {  // (Llama 4 Scout: low == high, no band)
        double smooth = (old_ctx / wl - rope_scaling.low_freq_factor) /
                        (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        inv = (1 - smooth) * inv / rope_scaling.factor + smooth * inv;
      }
    } else if (rope_scaling.type == "yarn") {
      // Dimensions that rotate fewer than beta_slow times over the original context are
      // interpolated (slowed by `factor`), more than beta_fast kept, the band between blended.
      const double rd = static_cast<double>(rot_dim), L = static_cast<double>(rope_scaling.original_context);
      auto corr = [&](double rot) { return rd * std::log(L / (rot * 2 * M_PI)) / (2 * std::log(static_cast<double>(rope_theta))); };
      double low = corr(rope_scaling.beta_fast), high = corr(rope_scaling.beta_slow);
      if (rope_scaling.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(0.0, low);
      high = std::min(rd - 1, high);
      if (low == high) high += 0.001;
      double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      double extrap = 1 - ramp;
      inv = inv / rope_scaling.factor * (1 - extrap) + inv * extrap;
    }
    f[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return f;
}

std::vector<float> ModelConfig::rope_inv_freq_swa() const {
  if (rope_theta_swa <= 0) return rope_inv_freq();
  ModelConfig plain = *this;
  plain.rope_theta = rope_theta_swa;
  plain.rope_scaling = RopeScaling{};
  return plain.rope_inv_freq();
}

}  // namespace fp
