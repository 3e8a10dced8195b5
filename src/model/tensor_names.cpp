// model/tensor_names.cpp — the Hugging Face -> canonical tensor name table (and Gemma 3's variant).
#include "model/tensor_names.h"

#include <utility>
#include <vector>

namespace fp {
namespace {

std::string canonical_base(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> layer_map = {
      {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},         {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},         {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
      // Hunyuan's q/k norms (applied after RoPE)
      {"self_attn.query_layernorm.weight", "attn_q_norm.weight"}, {"self_attn.key_layernorm.weight", "attn_k_norm.weight"},
      // gpt-oss: output bias, per-head sinks, a router with a bias; its stacked experts
      // (mlp.experts.gate_up_proj[_blocks|_scales|_bias], down_proj[...]) keep their names under
      // "gptoss." and are split into ffn_{gate,up,down}_exps at load (model_file.cpp)
      {"self_attn.o_proj.bias", "attn_output.bias"},    {"self_attn.sinks", "attn_sinks.weight"},
      {"mlp.router.weight", "ffn_gate_inp.weight"},     {"mlp.router.bias", "ffn_gate_inp.bias"},
      {"mlp.up_proj.weight", "ffn_up.weight"},          {"mlp.down_proj.weight", "ffn_down.weight"},
      // Phi-3 / Phi-4: q, k, v in one matrix and gate, up in another, as llama.cpp's GGUFs keep
      // them (attn_qkv; ffn_up of twice the width, gate first); split into views at load
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"}, {"mlp.gate_up_proj.weight", "ffn_up.weight"},
      // GLM-4 (Glm4ForCausalLM): norms after the attention and after the MLP, as llama.cpp names them
      {"post_self_attn_layernorm.weight", "post_attention_norm.weight"},
      {"post_mlp_layernorm.weight", "post_ffw_norm.weight"},
      // MoE (Qwen3-MoE, DeepSeek): router, selection bias, shared experts
      {"mlp.gate.weight", "ffn_gate_inp.weight"},       {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
      // Qwen2-MoE: one shared expert behind a sigmoid gate
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
      // Mixtral: its router (the experts' w1 / w3 / w2 below)
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      // GraniteMoe: its router; the experts' gate and up in one stack, split at load
      // (model_file.cpp); GraniteMoeShared's shared expert the same
      {"block_sparse_moe.router.layer.weight", "ffn_gate_inp.weight"},
      // MiniMax-M2: Mixtral's names and a selection bias
      {"block_sparse_moe.e_score_correction_bias", "exp_probs_b.bias"},
      // Hunyuan MoE: its router and shared MLP
      {"mlp.gate.wg.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_mlp.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_mlp.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_mlp.down_proj.weight", "ffn_down_shexp.weight"},
      // Llama 4: its router, shared expert and dense layers' MLP under feed_forward (the experts'
      // stacks below)
      {"feed_forward.router.weight", "ffn_gate_inp.weight"},
      {"feed_forward.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"feed_forward.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"feed_forward.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"feed_forward.gate_proj.weight", "ffn_gate.weight"}, {"feed_forward.up_proj.weight", "ffn_up.weight"},
      {"feed_forward.down_proj.weight", "ffn_down.weight"},
      // ERNIE 4.5 MoE: its selection bias
      {"mlp.moe_statics.e_score_correction_bias", "exp_probs_b.bias"},
      {"block_sparse_moe.input_linear.weight", "ffn_gate_up_exps.weight"},
      {"block_sparse_moe.output_linear.weight", "ffn_down_exps.weight"},
      {"shared_mlp.input_linear.weight", "ffn_gate_up_shexp.weight"},
      {"shared_mlp.output_linear.weight", "ffn_down_shexp.weight"},
      // MLA (DeepSeek-V2/V3)
      {"self_attn.q_a_proj.weight", "attn_q_a.weight"}, {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
      {"self_attn.q_b_proj.weight", "attn_q_b.weight"}, {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
      {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"}, {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
      // Multi-token prediction (DeepSeek-V3, GLM-4.5: the layers after num_hidden_layers), as llama.cpp names them
      {"eh_proj.weight", "nextn.eh_proj.weight"},       {"enorm.weight", "nextn.enorm.weight"},
      {"hnorm.weight", "nextn.hnorm.weight"},           {"embed_tokens.weight", "nextn.embed_tokens.weight"},
      {"shared_head.norm.weight", "nextn.shared_head_norm.weight"},
      {"shared_head.head.weight", "nextn.shared_head_head.weight"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    size_t dot = hf.find('.', prefix.size());
    if (dot == std::string::npos) return {};
    std::string layer = hf.substr(prefix.size(), dot - prefix.size()), rest = hf.substr(dot + 1);
    for (auto& [from, to] : layer_map)
      if (rest == from) return "blk." + layer + "." + to;
    // Routed experts stay one 2-D tensor each: mlp.experts.E.gate_proj.weight -> ffn_gate_exps.E.weight
    const std::string ex = "mlp.experts.";
    for (const char* g : {"gate_up_proj", "down_proj"})
      for (const char* suffix : {"", "_bias", "_blocks", "_scales"})
        if (rest == ex + g + suffix) return "blk." + layer + ".gptoss." + g + suffix;
    // Llama 4's stacked experts, transposed and split at load (model_file.cpp); synth's
    // per-expert tensors feed_forward.experts.E.*_proj.weight as the other MoE ones
    for (const char* g : {"gate_up_proj", "down_proj"})
      if (rest == std::string("feed_forward.experts.") + g) return "blk." + layer + ".llama4." + g;
    if (rest.rfind("feed_forward.experts.", 0) == 0) rest = "mlp." + rest.substr(std::string("feed_forward.").size());
    // Mixtral's experts: block_sparse_moe.experts.E.w1 (gate), w3 (up), w2 (down)
    const std::string mx = "block_sparse_moe.experts.";
    if (rest.rfind(mx, 0) == 0) {
      const size_t d2 = rest.find('.', mx.size());
      if (d2 == std::string::npos || d2 == mx.size()) return {};
      const std::string e = rest.substr(mx.size(), d2 - mx.size()), proj = rest.substr(d2 + 1);
      if (e.find_first_not_of("0123456789") != std::string::npos) return {};
      for (auto [w, k] : {std::pair{"w1.weight", "gate"}, std::pair{"w3.weight", "up"}, std::pair{"w2.weight", "down"}})
        if (proj == w) return "blk." + layer + ".ffn_" + k + "_exps." + e + ".weight";
      return {};
    }
    if (rest.rfind(ex, 0) == 0) {
      size_t d2 = rest.find('.', ex.size());
      if (d2 == std::string::npos || d2 == ex.size()) return {};
      std::string e = rest.substr(ex.size(), d2 - ex.size()), proj = rest.substr(d2 + 1);
      if (e.find_first_not_of("0123456789") != std::string::npos) return {};
      for (const char* k : {"gate", "up", "down"}) {
        if (proj == std::string(k) + "_proj.weight") return "blk." + layer + ".ffn_" + k + "_exps." + e + ".weight";
        if (proj == std::string(k) + "_proj.bias") return "blk." + layer + ".ffn_" + k + "_exps." + e + ".bias";  // synth's gpt-oss
      }
    }
  }
  return {};
}

}  // namespace

std::string text_model_name(const std::string& hf) {
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (hf.rfind(p, 0) == 0) return "model." + hf.substr(std::string(p).size());
  if (hf.rfind("language_model.lm_head.", 0) == 0) return hf.substr(std::string("language_model.").size());
  return hf;
}

std::string canonical_from_hf_gemma(const std::string& hf) {
  const std::string name = text_model_name(hf);
  static const std::pair<const char*, const char*> norms[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                                              {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
                                                              {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) == 0) {
    const size_t dot = name.find('.', prefix.size());
    if (dot != std::string::npos)
      for (auto& [from, to] : norms)
        if (name.compare(dot + 1, std::string::npos, from) == 0)
          return "blk." + name.substr(prefix.size(), dot - prefix.size()) + "." + to;
  }
  return canonical_from_hf(name);
}

std::string canonical_from_hf(const std::string& hf) {
  const std::string scale_suffix = "_scale_inv";
  bool scale = hf.ends_with(".weight" + scale_suffix);
  std::string cn = canonical_base(scale ? hf.substr(0, hf.size() - scale_suffix.size()) : hf);
  return cn.empty() || !scale ? cn : cn + scale_suffix;
}

}  // namespace fp
