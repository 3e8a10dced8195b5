// model/plan_model.cpp — see plan_model.h.
#include "model/plan_model.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "model/model_file.h"

namespace fp {

PlanModel plan_model_from_file(const std::string& path) {
  LoadOptions lo;
  lo.prefault = false;
  lo.weights = WeightMemory::Mapped;  // only sizes are read: nothing copied, nothing repacked
  lo.repack = false;
  auto f = load_model_file(path, lo);
  const ModelConfig& c = f->config;
  PlanModel m;
  m.name = c.name.empty() ? path : c.name;
  m.n_layers = c.n_layers;
  m.dim = c.dim;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.mla.kv_lora_rank > 0 ? c.n_heads : c.n_kv_heads;
  m.head_dim = c.head_dim;
  m.ff = c.hidden_dim;
  m.kv_lora_rank = c.mla.kv_lora_rank;
  m.rope_dim = c.rot_dim;
  m.v_head_dim = c.v_head_dim;
  m.n_experts = c.moe.n_experts;
  m.n_used = c.moe.n_used;
  for (int64_t l = 0; l < c.n_layers; ++l)  // sliding-window (or Llama 4's chunked) layers, all sharing one window
    if (const int64_t w = std::max(c.window_of(l), c.chunk_of(l)); w > 0) m.window = w, ++m.n_window_layers;
  double routed_bytes = 0, routed_flops = 0;
  for (const auto& [name, t] : f->tensors) {
    const double bytes = static_cast<double>(t.nbytes()), flops = 2.0 * static_cast<double>(t.numel());
    const bool layer = name.rfind("blk.", 0) == 0;
    // Layers after the model's (GLM's multi-token-prediction layers) are not run.
    if (layer && std::atoll(name.c_str() + 4) >= c.n_layers) continue;
    if (layer && name.find("_exps") != std::string::npos) {
      routed_bytes += bytes;
      routed_flops += flops;
    } else if (layer && name.find("_shexp") != std::string::npos) {
      m.shared_bytes += bytes;
      if (t.ndim == 2) m.shared_flops += flops;
    } else if (name == "token_embd.weight") {
      m.embedding_bytes = bytes;
      if (c.tied_output) {
        m.output_bytes = bytes;
        m.output_flops = flops;
      }
    } else if (name == "output.weight") {
      m.output_bytes = bytes;
      m.output_flops = flops;
    } else {
      const bool router = name.find("ffn_gate_inp") != std::string::npos;
      if (router && t.ndim == 2) ++m.n_moe_layers;
      (layer && t.ndim == 2 && !router ? m.split_bytes : m.replicated_bytes) += bytes;
      if (t.ndim == 2) m.matmul_flops_per_token += flops;
    }
  }
  m.tied_output = c.tied_output;
  m.vocab = c.n_vocab;
  if (m.moe()) {
    FP_CHECK(m.n_moe_layers > 0, path, ": ", c.arch, " has ", m.n_experts, " experts but no router tensors (ffn_gate_inp)");
    const double n = static_cast<double>(m.n_moe_layers * m.n_experts);
    m.expert_bytes = routed_bytes / n;
    m.expert_flops = routed_flops / n;
    m.ff = std::max(m.ff, m.n_used * c.moe.ff + c.moe.shared_width());
  }
  return m;
}

}  // namespace fp
