// model/model_file.cpp — format detection, the three loaders, and shape checks.
#include "model/model_file.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/tensor_names.h"

namespace fp {

const Tensor* ModelFile::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const Tensor& ModelFile::get(const std::string& name) const {
  const Tensor* t = find(name);
  FP_CHECK(t, path, ": missing tensor '", name, "' (", config.arch, " model)");
  return *t;
}

const Tensor& ModelFile::get(const std::string& name, std::initializer_list<int64_t> shape) const {
  const Tensor& t = get(name);
  bool ok = t.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (auto d : shape) ok = ok && t.shape[static_cast<size_t>(i++)] == d;
  if (!ok) {
    Tensor expect = Tensor::view(nullptr, DType::F32, shape);
    fail(path, ": tensor '", name, "' has shape ", t.shape_str(), ", expected ", expect.shape_str(),
         " from the model config");
  }
  return t;
}

float* ModelFile::own_f32(size_t n) {
  auto buf = std::shared_ptr<float[]>(new float[n]());
  owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
  return buf.get();
}

namespace {

// ---------------------------------------------------------------- GGUF
// Gemma 2 and 3 as llama.cpp reads them: norms stored with Gemma's +1 already added by the
// converter, embeddings times sqrt(dim), sandwich norms, GeGLU. Gemma 2: every even layer slides
// a window (4096 when the key is absent), scores and logits soft-capped (50 and 30 when absent).
// Gemma 3: q/k norms; with a sliding window every sixth layer is global (pattern 6) and the
// others rotate with base 10000, unscaled. The attention scale is 1/sqrt(head_dim), except for
// the 27B models' query_pre_attn_scalar = dim / heads (Gemma 2: 46 layers, Gemma 3: 62): GGUF has
// no key for it, so this follows llama.cpp.
void load_gguf_gemma(ModelConfig& c, const GgufFile& g, const std::string& path) {
  const std::string a = c.arch + ".";
  const bool gemma2 = c.arch == "gemma2";
  c.post_norms = c.gelu_ffn = true;
  c.qk_norm = !gemma2;
  c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  if (c.n_layers == (gemma2 ? 46 : 62)) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads));
  if (gemma2) {
    c.attn_softcap = static_cast<float>(g.get_float(a + "attn_logit_softcapping", 50.0));
    c.final_softcap = static_cast<float>(g.get_float(a + "final_logit_softcapping", 30.0));
    c.sliding_window = static_cast<int64_t>(g.get_uint(a + "attention.sliding_window", 4096));
    for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back(l % 2 == 0);
    return;
  }
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    const double v = g.get_float(a + cap, 0.0);
    FP_CHECK(v == 0.0, path, ": ", a, cap, " = ", v, ": Gemma 3 has no logit soft-capping");
  }
  c.sliding_window = static_cast<int64_t>(g.get_uint(a + "attention.sliding_window", 0));
  if (c.sliding_window > 0) {
    for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back((l + 1) % 6 != 0);
    c.rope_theta_swa = 10000.0f;
  }
}

// The first Mixtral GGUFs (llama.cpp before its stacked expert tensors) hold one tensor per
// expert: blk.N.ffn_gate.E.weight becomes blk.N.ffn_gate_exps.E.weight, which the expert loader
// takes one by one (model/moe_layers.cpp).
std::string legacy_mixtral_expert_name(const std::string& name) {
  for (const char* proj : {".ffn_gate.", ".ffn_up.", ".ffn_down."}) {
    const size_t at = name.find(proj);
    if (at == std::string::npos || !name.ends_with(".weight")) continue;
    const size_t e0 = at + std::string(proj).size(), e1 = name.size() - std::string(".weight").size();
    if (e1 <= e0 || name.find_first_not_of("0123456789", e0) != e1) continue;
    const std::string p(proj);
    return name.substr(0, at) + p.substr(0, p.size() - 1) + "_exps." + name.substr(e0);
  }
  return name;
}

void load_gguf(ModelFile& m, const std::string& path) {
  auto g = std::shared_ptr<GgufFile>(GgufFile::open(path).release());
  m.owners.push_back(g);
  m.format = "gguf";
  m.file_bytes = g->file_size();
  ModelConfig& c = m.config;
  c.source = "gguf";
  c.arch = g->get_string("general.architecture");
  c.name = g->get_string("general.name", std::filesystem::path(path).stem().string());
  const std::string a = c.arch + ".";
  // llama.cpp writes Mixtral as a llama with routed experts; ours is the GQA MoE class.
  if (c.arch == "llama" && g->get_uint(a + "expert_count", 0) > 0) c.arch = "mixtral";
  FP_CHECK(c.arch == "llama" || c.arch == "mixtral" || c.arch == "qwen2moe" || c.arch == "glm4" || c.arch == "granite" ||
               c.arch == "granitemoe" || c.arch == "minimax-m2" || c.arch == "seed_oss" || c.arch == "ernie4_5" || c.arch == "ernie4_5-moe" || c.arch == "hunyuan-dense" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "deepseek2" ||
               c.arch == "glm4moe" || c.arch == "gpt-oss" || c.arch == "gemma2" || c.arch == "gemma3" || c.arch == "phi3" ||
               c.arch == "smollm3" || c.arch == "olmo2" || c.arch == "llama4" || c.arch == "exaone4",
           path, ": general.architecture '", c.arch,
           "' is not supported yet (supported: llama (Mixtral with experts), llama4, exaone4, qwen2, qwen3, glm4, granite, granitemoe, seed_oss, ernie4_5, ernie4_5-moe, hunyuan-dense, qwen2moe, qwen3moe, deepseek2, glm4moe, minimax-m2, gpt-oss, gemma2, gemma3, phi3, smollm3, "
           "olmo2)");
  c.dim = static_cast<int64_t>(g->get_uint(a + "embedding_length"));
  c.n_layers = static_cast<int64_t>(g->get_uint(a + "block_count"));
  {
    // llama.cpp counts the multi-token-prediction layers (the last ones, GLM-4.5's) in
    // block_count; the forward runs the layers before them.
    const auto nextn = static_cast<int64_t>(g->get_uint(a + "nextn_predict_layers", 0));
    FP_CHECK(nextn < c.n_layers, path, ": ", a, "nextn_predict_layers = ", nextn, " leaves no layer of the ", c.n_layers,
             " in block_count");
    c.n_layers -= nextn;
    c.mtp_layers = nextn;
  }
  c.hidden_dim = static_cast<int64_t>(g->get_uint(a + "feed_forward_length"));
  c.n_heads = static_cast<int64_t>(g->get_uint(a + "attention.head_count"));
  c.n_kv_heads = static_cast<int64_t>(g->get_uint(a + "attention.head_count_kv", static_cast<uint64_t>(c.n_heads)));
  c.max_context = static_cast<int64_t>(g->get_uint(a + "context_length", 2048));
  FP_CHECK(c.n_heads > 0, path, ": ", a, "attention.head_count is 0");
  c.head_dim = static_cast<int64_t>(g->get_uint(a + "attention.key_length", static_cast<uint64_t>(c.dim / c.n_heads)));
  c.v_head_dim = static_cast<int64_t>(g->get_uint(a + "attention.value_length", static_cast<uint64_t>(c.head_dim)));
  if (c.arch == "deepseek2") {
    // Newer llama.cpp converters write the absorbed-MLA view (key_length = kv_lora + rope, one KV
    // head) and the per-head dims under *_mla; older ones the per-head dims directly.
    c.head_dim = static_cast<int64_t>(g->get_uint(a + "attention.key_length_mla", static_cast<uint64_t>(c.head_dim)));
    c.v_head_dim = static_cast<int64_t>(g->get_uint(a + "attention.value_length_mla", static_cast<uint64_t>(c.v_head_dim)));
    c.n_kv_heads = c.n_heads;
  }
  c.rot_dim = static_cast<int64_t>(g->get_uint(a + "rope.dimension_count", static_cast<uint64_t>(c.head_dim)));
  c.rope_theta = static_cast<float>(g->get_float(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g->get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  // llama.cpp's converters permute Llama q/k rows so that adjacent pairs rotate; Qwen keeps NeoX halves.
  // DeepSeek's GGUF keeps the checkpoint's interleaved (adjacent-pair) rotary layout.
  // GLM-4's checkpoints rotate adjacent pairs themselves (llama.cpp's rope type NORM, no permutation).
  c.rope_style = c.arch == "llama" || c.arch == "mixtral" || c.arch == "granite" || c.arch == "granitemoe" ||
                         c.arch == "deepseek2" || c.arch == "smollm3" || c.arch == "glm4" || c.arch == "ernie4_5" || c.arch == "ernie4_5-moe" ||
                         c.arch == "llama4"  // (Llama 4's checkpoints rotate adjacent pairs: no permutation)
                     ? RopeStyle::Adjacent
                     : RopeStyle::NeoX;
  std::string scaling = g->get_string(a + "rope.scaling.type", "none");
  if (scaling == "linear" || scaling == "yarn") {
    c.rope_scaling.type = scaling;
    c.rope_scaling.factor = static_cast<float>(g->get_float(a + "rope.scaling.factor", 1.0));
    c.rope_scaling.original_context = static_cast<int64_t>(g->get_uint(a + "rope.scaling.original_context_length", 0));
    const bool yarn_llama_class = c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "olmo2";
    FP_CHECK(scaling != "yarn" || c.arch == "deepseek2" || c.arch == "gpt-oss" || yarn_llama_class, path,
             ": rope scaling 'yarn' is not supported for ", c.arch, " yet");
    if (scaling == "yarn" && c.arch != "deepseek2") {
      // gpt-oss, Qwen2.5 / Qwen3 / Llama with YaRN: as transformers (and ggml's rope with
      // ext_factor): cos/sin times 1 + 0.1 ln(factor), no softmax factor. GGUF has no `truncate`:
      // the correction range is rounded, as ggml does.
      RopeScaling& y = c.rope_scaling;
      y.beta_fast = static_cast<float>(g->get_float(a + "rope.scaling.yarn_beta_fast", 32.0));
      y.beta_slow = static_cast<float>(g->get_float(a + "rope.scaling.yarn_beta_slow", 1.0));
      y.attn_factor = y.factor > 1 ? 0.1f * std::log(y.factor) + 1.0f : 1.0f;
    } else if (scaling == "yarn") {
      // llama.cpp: cos/sin unscaled (its attn_factor cancels ggml's), softmax scale times mscale^2.
      c.rope_scaling.log_multiplier = static_cast<float>(g->get_float(a + "rope.scaling.yarn_log_multiplier", 0.1));
      c.rope_scaling.beta_fast = static_cast<float>(g->get_float(a + "rope.scaling.yarn_beta_fast", 32.0));
      c.rope_scaling.beta_slow = static_cast<float>(g->get_float(a + "rope.scaling.yarn_beta_slow", 1.0));
    }
  } else {
    FP_CHECK(scaling == "none", path, ": ", a, "rope.scaling.type '", scaling, "' is not supported");
  }
  c.qkv_bias = c.arch == "qwen2" || c.arch == "qwen2moe";
  c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe";
  if (c.arch == "qwen3moe" || c.arch == "qwen2moe" || c.arch == "mixtral" || c.arch == "deepseek2" || c.arch == "glm4moe" ||
      c.arch == "gpt-oss" || c.arch == "granitemoe" || c.arch == "minimax-m2" || c.arch == "ernie4_5-moe" || c.arch == "llama4") {
    MoeConfig& e = c.moe;
    e.n_experts = static_cast<int64_t>(g->get_uint(a + "expert_count", 0));
    e.n_used = static_cast<int64_t>(g->get_uint(a + "expert_used_count", 0));
    e.ff = static_cast<int64_t>(g->get_uint(a + "expert_feed_forward_length", 0));
    e.n_shared = static_cast<int64_t>(g->get_uint(a + "expert_shared_count", 0));
    e.first_dense = static_cast<int64_t>(g->get_uint(a + "leading_dense_block_count", 0));
    // llama.cpp normalises Qwen3-MoE's top-k weights unconditionally; DeepSeek says so per file.
    e.norm_topk = g->get_bool(a + "expert_weights_norm", c.arch == "qwen3moe" || c.arch == "gpt-oss" || c.arch == "mixtral" ||
                                                             c.arch == "granitemoe" || c.arch == "minimax-m2" ||
                                                             c.arch == "ernie4_5-moe");
    if (c.arch == "mixtral" || c.arch == "granitemoe" || c.arch == "minimax-m2") e.ff = static_cast<int64_t>(g->get_uint(a + "expert_feed_forward_length", static_cast<uint64_t>(c.hidden_dim)));
    if (c.arch == "qwen2moe") {  // Qwen1.5-MoE / Qwen2-MoE: one shared expert of its own width, behind a sigmoid gate
      e.shared_ff = static_cast<int64_t>(g->get_uint(a + "expert_shared_feed_forward_length", 0));
      e.n_shared = e.shared_ff > 0 ? 1 : 0;
      e.shared_gate = true;
    }
    if (c.arch == "granitemoe") {  // GraniteMoeShared: one ungated shared expert of its own width
      e.shared_ff = static_cast<int64_t>(g->get_uint(a + "expert_shared_feed_forward_length", 0));
      e.n_shared = e.shared_ff > 0 ? 1 : 0;
    }
    e.scale = static_cast<float>(g->get_float(a + "expert_weights_scale", 1.0));
    if (c.arch == "llama4") {  // llama.cpp's Llama 4: one shared expert of the experts' width, the sigmoid score on the input
      e.n_shared = 1;
      e.shared_ff = e.ff;
      e.scale_input = true;
      e.sparse_step = static_cast<int64_t>(g->get_uint(a + "interleave_moe_layer_step", 1));
      FP_CHECK(e.sparse_step >= 1, path, ": ", a, "interleave_moe_layer_step is 0");
      FP_CHECK(e.n_used == 1, path, ": ", a, "expert_used_count ", e.n_used, ": Llama 4's router scales the expert's input, read here for top-1 routing only");
    }
    const uint64_t gating = g->get_uint(a + "expert_gating_func", c.arch == "minimax-m2" || c.arch == "llama4" ? 2 : 1);  // (sigmoid)
    FP_CHECK(gating == 1 || gating == 2, path, ": ", a, "expert_gating_func = ", gating, " (1 softmax, 2 sigmoid)");
    e.scoring = gating == 2 ? "sigmoid" : "softmax";
    e.n_group = static_cast<int64_t>(g->get_uint(a + "expert_group_count", 1));
    e.topk_group = static_cast<int64_t>(g->get_uint(a + "expert_group_used_count", static_cast<uint64_t>(e.n_group)));
    e.group_score = gating == 2 ? "top2sum" : "max";
    if (c.arch == "llama4") {  // llama.cpp's routing for Llama 4 whatever the file's other expert keys say
      e.scoring = "sigmoid";
      e.norm_topk = false;
      e.scale = 1.0f;
      e.n_group = e.topk_group = 1;
      e.group_score = "max";
    }
    FP_CHECK(e.n_experts > 0, path, ": ", a, "expert_count is missing or 0");
  }
  if (c.arch == "deepseek2") {
    c.mla.q_lora_rank = static_cast<int64_t>(g->get_uint(a + "attention.q_lora_rank", 0));
    c.mla.kv_lora_rank = static_cast<int64_t>(g->get_uint(a + "attention.kv_lora_rank"));
    FP_CHECK(c.mla.kv_lora_rank > 0, path, ": ", a, "attention.kv_lora_rank must be positive");
  }

  for (auto& ti : g->tensors()) {
    int64_t shape[4];
    int nd = static_cast<int>(ti.ne.size());
    for (int i = 0; i < nd; ++i) shape[i] = ti.ne[static_cast<size_t>(nd - 1 - i)];
    // GLM-4.5's and gpt-oss's GGUFs name the norm before the FFN post_attention_norm (llama.cpp's attn_post_norm).
    std::string name = ti.name;
    if ((c.arch == "glm4moe" || c.arch == "gpt-oss" || c.arch == "seed_oss") && name.ends_with(".post_attention_norm.weight"))
      name = name.substr(0, name.size() - std::string("post_attention_norm.weight").size()) + "ffn_norm.weight";
    if (c.arch == "mixtral") name = legacy_mixtral_expert_name(name);
    m.tensors[name] = Tensor::view(ti.data, ti.type, shape, nd);
  }
  if (c.arch == "gpt-oss") {
    // Every layer is MoE: a softmax over the top-k router logits (bias added), experts with
    // biases and the clamped SwiGLU (llama.cpp's swiglu_oai: alpha 1.702, limit 7); biases on
    // q/k/v/o; a sink per head; the even layers slide a window (llama.cpp's swa pattern 2).
    c.qkv_bias = true;
    c.o_bias = c.attn_sinks = true;
    c.moe.router_bias = c.moe.expert_bias = c.moe.swiglu_clamped = true;
    c.sliding_window = static_cast<int64_t>(g->get_uint(a + "attention.sliding_window", 0));
    if (c.sliding_window > 0)
      for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back(l % 2 == 0);
  }
  if (c.arch == "gemma2" || c.arch == "gemma3") load_gguf_gemma(c, *g, path);
  if (c.arch == "olmo2") {  // norms after the sublayers only; q/k normalised over every head together
    c.pre_norms = false;
    c.post_norms = c.qk_norm = c.qk_norm_full = true;
    // OLMo 3 (llama.cpp writes it as olmo2 with a window): the window on the layers
    // attention.sliding_window_pattern names (a period p: l % p < p - 1, 4 when absent; or one
    // flag per layer), those rotating unscaled (rope.freq_base_swa, else the base), the others
    // with the file's scaling (YaRN).
    if (const auto w = static_cast<int64_t>(g->get_uint(a + "attention.sliding_window", 0)); w > 0) {
      c.sliding_window = w;
      const std::string pk = a + "attention.sliding_window_pattern";
      const GgufValue* pv = g->find(pk);
      if (pv && pv->type == GgufType::ARRAY) {
        const std::vector<double>* flags = g->get_number_array(pk);
        FP_CHECK(flags && static_cast<int64_t>(flags->size()) == c.n_layers, path, ": ", pk, " should hold one flag per layer (",
                 c.n_layers, ")");
        for (double f : *flags) c.swa_layers.push_back(f != 0);
      } else {
        const auto period = static_cast<int64_t>(g->get_uint(pk, 4));
        FP_CHECK(period >= 1, path, ": ", pk, " is 0");
        for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back(l % period < period - 1);
      }
      c.rope_theta_swa = static_cast<float>(g->get_float(a + "rope.freq_base_swa", c.rope_theta));
    }
  }
  if (c.arch == "exaone4") {
    // llama.cpp's EXAONE 4.0: norms after the sublayers only, q/k norms per head. The 64-layer
    // model (32B) slides a window (attention.sliding_window, else 4096) on three layers of four,
    // the fourth global and without RoPE; any other depth (the 1.2B) attends to everything with
    // RoPE on every layer, whatever the file's window says (llama.cpp's rule, by layer count).
    c.pre_norms = false;
    c.post_norms = c.qk_norm = true;
    if (c.n_layers == 64) {
      c.sliding_window = static_cast<int64_t>(g->get_uint(a + "attention.sliding_window", 4096));
      for (int64_t l = 0; l < c.n_layers && c.sliding_window > 0; ++l) {
        c.swa_layers.push_back(l % 4 < 3);
        c.nope_layers.push_back(l % 4 == 3);
      }
    }
    for (const char* b : {"blk.0.attn_q.bias", "blk.0.attn_output.bias"})
      FP_CHECK(!m.find(b), path, ": tensor '", b, "': biases on EXAONE 4.0's projections are not supported");
  }
  if (c.arch == "llama4") {
    // llama.cpp's fixed Llama 4: NoPE on every fourth layer, chunks of 8192 on the others, the
    // NoPE queries' temperature (floor 8192, scale 0.1), q/k L2 norms unless 128 experts
    // (Maverick). attention.sliding_window 0 (MobileLLM's variant) is not read here.
    FP_CHECK(!g->has(a + "attention.sliding_window") || g->get_uint(a + "attention.sliding_window") != 0, path, ": ", a,
             "attention.sliding_window 0 (Llama 4 without chunked attention, MobileLLM) is not supported");
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % 4 == 0);
    c.attention_chunk = 8192;
    for (int64_t l = 0; l < c.n_layers; ++l) c.chunked_layers.push_back(c.rotates(l));
    c.nope_temp_floor = 8192.0f;
    c.nope_temp_scale = 0.1f;
    c.qk_l2_norm = c.moe.n_experts != 128;
    for (const char* b : {"blk.0.attn_q.bias", "blk.0.attn_output.bias"})
      FP_CHECK(!m.find(b), path, ": tensor '", b, "': biases on Llama 4's projections are not supported from GGUF");
  }
  if (c.arch == "smollm3")  // llama.cpp's fixed pattern: no RoPE on every fourth layer
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % 4 == 0);
  if (c.arch == "phi3") {  // every layer windowed when the file says so (Phi-3-mini's 2047)
    const Tensor *lf = m.find("rope_factors_long.weight"), *sf = m.find("rope_factors_short.weight");
    if (lf || sf) {  // LongRoPE (Phi-3.5, Phi-4-mini): llama.cpp's converter writes the factors as tensors
      FP_CHECK(lf && sf, path, ": LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight");
      RopeScaling& r = c.rope_scaling;
      r.type = "longrope";
      for (auto [t, out, name] : {std::tuple{lf, &r.long_factor, "rope_factors_long"}, std::tuple{sf, &r.short_factor, "rope_factors_short"}}) {
        FP_CHECK(t->numel() == c.rot_dim / 2, path, ": ", name, ".weight has ", t->numel(), " values, expected ",
                 c.rot_dim / 2, " (half the rotated dimensions)");
        out->resize(static_cast<size_t>(t->numel()));
        dequantize_row(t->dtype, t->data, out->data(), t->numel());
      }
      r.original_context = static_cast<int64_t>(g->get_uint(a + "rope.scaling.original_context_length", 0));
      FP_CHECK(r.original_context > 0, path, ": LongRoPE needs ", a, "rope.scaling.original_context_length");
      r.attn_factor = static_cast<float>(g->get_float(a + "rope.scaling.attn_factor", 1.0));
      r.factor = static_cast<float>(c.max_context) / static_cast<float>(r.original_context);
    }
    c.sliding_window = static_cast<int64_t>(g->get_uint(a + "attention.sliding_window", 0));
    c.swa_layers.assign(static_cast<size_t>(c.sliding_window > 0 ? c.n_layers : 0), true);
  }
  if (c.arch == "granite" || c.arch == "granitemoe") {
    // Granite 3.x: llama.cpp's keys for its multipliers; RoPE unless rope.scaling.finetuned says
    // false (llama.cpp's switch); no biases here.
    c.embed_scale = static_cast<float>(g->get_float(a + "embedding_scale", 1.0));
    c.residual_scale = static_cast<float>(g->get_float(a + "residual_scale", 1.0));
    c.attn_scale = static_cast<float>(g->get_float(a + "attention.scale", 0.0));
    c.logit_scale = static_cast<float>(g->get_float(a + "logit_scale", 1.0));
    if (!g->get_bool(a + "rope.scaling.finetuned", true)) {
      FP_CHECK(c.arch == "granite", path, ": ", a, "rope.scaling.finetuned false (no RoPE) is not supported for ", c.arch);
      c.nope_layers.assign(static_cast<size_t>(c.n_layers), true);
    }
    for (const char* b : {"blk.0.attn_q.bias", "blk.0.attn_output.bias", "blk.0.ffn_up.bias"})
      FP_CHECK(!m.find(b), path, ": tensor '", b, "': biases on Granite's projections are not supported");
  }
  if (c.arch == "glm4") {  // GLM-4-0414: sandwich norms, q/k/v biases where the file has them
    c.post_norms = true;
    c.qkv_bias = m.find("blk.0.attn_q.bias") != nullptr || m.find("blk.0.attn_qkv.bias") != nullptr;
  }
  if (c.arch == "minimax-m2") c.qk_norm = c.qk_norm_full = true;  // MiniMax-M2: q/k norms over the whole projection
  if (c.arch == "hunyuan-dense") {  // q/k norms per head after RoPE; llama.cpp bakes the NTK alpha into freq_base
    c.qk_norm = c.qk_norm_after_rope = true;
    for (const char* b : {"blk.0.attn_q.bias", "blk.0.attn_output.bias"})
      FP_CHECK(!m.find(b), path, ": tensor '", b, "': biases on Hunyuan's projections are not supported");
  }
  if (c.arch == "seed_oss" || c.arch == "ernie4_5" || c.arch == "ernie4_5-moe") {
    // Seed-OSS: q/k/v biases where the file has them; no output or FFN biases (ERNIE 4.5: none).
    c.qkv_bias = m.find("blk.0.attn_q.bias") != nullptr;
    for (const char* b : {"blk.0.attn_output.bias", "blk.0.ffn_up.bias", "blk.0.ffn_down.bias"})
      FP_CHECK(!m.find(b), path, ": tensor '", b, "': biases on ", c.arch, "'s output and FFN projections are not supported");
  }
  if (c.arch == "glm4moe") {  // optional in GLM-4.5's files: q/k/v biases, per-head q/k norms
    c.qkv_bias = m.find("blk.0.attn_q.bias") != nullptr;
    c.qk_norm = m.find("blk.0.attn_q_norm.weight") != nullptr;
  }
  c.tied_output = m.find("output.weight") == nullptr;
  const Tensor* emb = m.find("token_embd.weight");
  FP_CHECK(emb, path, ": missing tensor 'token_embd.weight'");
  c.n_vocab = static_cast<int64_t>(g->get_uint(a + "vocab_size", static_cast<uint64_t>(emb->dim(0))));
  if (g->has("tokenizer.ggml.model")) m.tokenizer = Tokenizer::from_gguf(*g);
  if (c.arch == "deepseek2" || c.arch == "qwen3moe" || c.arch == "glm4moe" || c.arch == "minimax-m2" || c.arch == "ernie4_5-moe") c.moe.has_bias = m.find("blk." + std::to_string(c.moe.first_dense) + ".exp_probs_b.bias") != nullptr;
  if (m.find("rope_freqs.weight")) m.notes.push_back("rope_freqs.weight present: per-frequency RoPE factors applied");
  for (auto& [k, v] : g->metadata()) m.metadata.emplace_back(k, v.to_string(6));
  m.notes.push_back("GGUF v" + std::to_string(g->version()) + ", " + std::to_string(g->metadata().size()) +
                    " metadata keys, alignment " + std::to_string(g->alignment()));
}

// ---------------------------------------------------------------- llama2.c
void load_llama2c(ModelFile& m, const std::string& path, const LoadOptions& opts) {
  auto f = std::shared_ptr<Llama2cFile>(Llama2cFile::open(path).release());
  m.owners.push_back(f);
  m.format = "llama2c";
  m.file_bytes = std::filesystem::file_size(path);
  const Llama2cConfig& lc = f->config();
  ModelConfig& c = m.config;
  c.source = "llama2c";
  c.arch = "llama";
  c.name = std::filesystem::path(path).stem().string();
  c.n_vocab = lc.vocab_size;
  c.dim = lc.dim;
  c.n_layers = lc.n_layers;
  c.n_heads = lc.n_heads;
  c.n_kv_heads = lc.n_kv_heads;
  c.head_dim = c.v_head_dim = c.rot_dim = lc.dim / lc.n_heads;
  c.hidden_dim = lc.hidden_dim;
  c.max_context = lc.seq_len;
  c.rope_style = RopeStyle::Adjacent;
  c.rms_eps = 1e-5f;
  c.tied_output = lc.shared_classifier;
  for (auto [k, v] : {std::pair<const char*, int32_t>{"dim", lc.dim}, {"hidden_dim", lc.hidden_dim}, {"n_layers", lc.n_layers},
                      {"n_heads", lc.n_heads}, {"n_kv_heads", lc.n_kv_heads}, {"vocab_size", lc.vocab_size}, {"seq_len", lc.seq_len}})
    m.metadata.emplace_back(k, std::to_string(v));
  for (auto& [name, t] : f->tensors()) {
    if (name.rfind("rope.", 0) == 0) continue;  // run.c's precomputed table; we compute RoPE ourselves
    m.tensors[name] = Tensor::view(t.data, DType::F32, t.shape.data(), static_cast<int>(t.shape.size()));
  }
  m.notes.push_back(std::string("llama2.c checkpoint, ") + (lc.version == 0 ? "legacy header" : "version 1 header"));
  std::string tok = opts.tokenizer_path;
  if (tok.empty()) {
    auto dir = std::filesystem::path(path).parent_path();
    for (auto cand : {dir / "tokenizer.bin", dir / ("tok" + std::to_string(lc.vocab_size) + ".bin")})
      if (file_exists(cand.string())) tok = cand.string();
  }
  if (!tok.empty()) {
    m.tokenizer = Tokenizer::from_llama2c(tok, lc.vocab_size);
    m.notes.push_back("tokenizer: " + tok);
  } else {
    m.notes.push_back("no tokenizer.bin found beside the checkpoint (pass --tokenizer)");
  }
}

// ---------------------------------------------------------------- Hugging Face safetensors
// A value for messages and `inspect`: json::dump recurses per nesting level (a hostile config.json
// of deeply nested arrays would overflow the stack), so long or nested values print their type.
std::string short_json(const nlohmann::json& j) {
  if (j.is_primitive()) return j.dump();
  bool flat = j.size() <= 16;
  for (auto it = j.begin(); flat && it != j.end(); ++it) flat = it->is_primitive();
  return flat ? j.dump() : std::string("(") + j.type_name() + " of " + std::to_string(j.size()) + ")";
}
bool json_bool(const nlohmann::json& j, const std::string& key, const std::string& file, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  FP_CHECK(it->is_boolean(), file, ": field '", key, "' should be true or false, found ", short_json(*it));
  return it->get<bool>();
}
std::string string_field(const nlohmann::json& j, const std::string& key, const std::string& file, const std::string& def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  FP_CHECK(it->is_string(), file, ": field '", key, "' should be a string, found ", short_json(*it));
  return it->get<std::string>();
}
int64_t json_int(const nlohmann::json& j, const std::string& key, const std::string& file, int64_t def = -1) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    FP_CHECK(def >= 0, file, ": missing field '", key, "'");
    return def;
  }
  FP_CHECK(it->is_number_integer(), file, ": field '", key, "' should be an integer, found ", short_json(*it));
  return it->get<int64_t>();
}
double json_num(const nlohmann::json& j, const std::string& key, const std::string& file, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  FP_CHECK(it->is_number(), file, ": field '", key, "' should be a number, found ", short_json(*it));
  return it->get<double>();
}

// MoE and MLA fields of a Qwen2-MoE / Qwen3-MoE / Mixtral / DeepSeek-V2 / DeepSeek-V3 / GLM-4.5
// (Glm4Moe) config.json.
void load_hf_moe(ModelConfig& c, const nlohmann::json& j, const std::string& cfg_path, const std::string& arch_cls) {
  MoeConfig& e = c.moe;
  if (c.arch == "llama4") {
    // Llama 4: sparse layers every interleave_moe_layer_step-th (or those moe_layers lists), each
    // a top-1 router whose sigmoid score multiplies the chosen expert's input, beside one shared
    // expert; experts and the shared one intermediate_size wide (the dense layers' width is
    // intermediate_size_mlp, read with the attention's keys).
    e.n_experts = json_int(j, "num_local_experts", cfg_path, 16);
    e.n_used = json_int(j, "num_experts_per_tok", cfg_path, 1);
    FP_CHECK(e.n_used == 1, cfg_path, ": num_experts_per_tok ", e.n_used,
             ": Llama 4's router scales the expert's input, read here for top-1 routing only");
    e.ff = e.shared_ff = c.hidden_dim;
    e.n_shared = 1;
    e.scoring = "sigmoid";
    e.scale_input = true;
    if (auto ml = j.find("moe_layers"); ml != j.end() && !ml->is_null()) {
      FP_CHECK(ml->is_array(), cfg_path, ": field 'moe_layers' should be a list of layer indices");
      std::vector<bool> sparse(static_cast<size_t>(c.n_layers), false);
      for (auto& v : *ml) {
        FP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.n_layers, cfg_path, ": moe_layers holds ",
                 short_json(v), ", not a layer index below num_hidden_layers (", c.n_layers, ")");
        sparse[v.get<size_t>()] = true;
      }
      for (int64_t l = 0; l < c.n_layers; ++l)
        if (!sparse[static_cast<size_t>(l)]) e.dense_layers.push_back(l);
    } else {
      e.sparse_step = json_int(j, "interleave_moe_layer_step", cfg_path, 1);
      FP_CHECK(e.sparse_step >= 1, cfg_path, ": interleave_moe_layer_step ", e.sparse_step, " must be positive");
    }
    return;
  }
  if (c.arch == "hunyuan-moe") {
    // Hunyuan-A13B (as transformers runs it): every layer sparse, a softmax over the experts with
    // the top k renormalised, experts and one ungated shared MLP all intermediate_size wide.
    // num_experts and moe_topk may be per-layer lists: equal entries only.
    auto one_value = [&](const char* key) {
      auto it = j.find(key);
      FP_CHECK(it != j.end() && !it->is_null(), cfg_path, ": missing field '", key, "'");
      if (!it->is_array()) return json_int(j, key, cfg_path);
      FP_CHECK(!it->empty() && (*it)[0].is_number_integer(), cfg_path, ": field '", key, "' should hold integers");
      for (auto& v : *it)
        FP_CHECK(v == (*it)[0], cfg_path, ": field '", key, "' differs between layers (", short_json(*it), "): not supported");
      return (*it)[0].get<int64_t>();
    };
    e.n_experts = one_value("num_experts");
    e.n_used = one_value("moe_topk");
    e.ff = c.hidden_dim;
    e.n_shared = 1;
    e.shared_ff = c.hidden_dim;
    e.norm_topk = true;
    e.scoring = "softmax";
    return;
  }
  if (c.arch == "ernie4_5-moe") {
    // ERNIE 4.5 MoE: a softmax over the experts, chosen with a selection bias
    // (moe_statics.e_score_correction_bias), the chosen probabilities renormalised; shared experts
    // of moe_intermediate_size each; sparse layers from moe_layer_start_index to
    // moe_layer_end_index (-1: the last), every moe_layer_interval-th.
    auto key = [&](const char* name, const char* alias) { return j.contains(name) ? name : alias; };
    e.n_experts = json_int(j, key("moe_num_experts", "num_experts"), cfg_path);
    e.n_used = json_int(j, key("moe_k", "num_experts_per_tok"), cfg_path);
    e.ff = json_int(j, "moe_intermediate_size", cfg_path);
    e.n_shared = json_int(j, "moe_num_shared_experts", cfg_path, 2);  // Ernie4_5_MoeConfig's default
    e.first_dense = json_int(j, "moe_layer_start_index", cfg_path, 1);
    e.sparse_step = json_int(j, "moe_layer_interval", cfg_path, 1);
    const double end = json_num(j, "moe_layer_end_index", cfg_path, -1);
    FP_CHECK(end == -1 || (end >= 0 && end < static_cast<double>(c.n_layers) && end == std::floor(end)), cfg_path,
             ": moe_layer_end_index ", end, " should be a layer index below num_hidden_layers (", c.n_layers, ") or -1");
    for (int64_t l = end < 0 ? c.n_layers : static_cast<int64_t>(end) + 1; l < c.n_layers; ++l) e.dense_layers.push_back(l);
    e.norm_topk = true;
    e.scoring = "softmax";
    e.has_bias = true;
    return;
  }
  e.n_used = json_int(j, "num_experts_per_tok", cfg_path);
  if (c.arch == "mixtral" || c.arch == "granitemoe") {
    // Softmax over every expert, the top k renormalised (GraniteMoe: a softmax over the top-k
    // logits, the same); experts as wide as intermediate_size.
    e.n_experts = json_int(j, "num_local_experts", cfg_path);
    e.ff = c.hidden_dim;
    e.norm_topk = true;
    if (c.arch == "granitemoe") {  // GraniteMoeShared: one ungated shared expert (shared_mlp) of its own width
      e.shared_ff = json_int(j, "shared_intermediate_size", cfg_path, 0);
      e.n_shared = e.shared_ff > 0 ? 1 : 0;
    }
    return;
  }
  if (c.arch == "minimax-m2") {
    // MiniMax-M2: Mixtral's checkpoint names, DeepSeek-V3's router without groups or a scale
    // (sigmoid scores, a selection bias, the top k renormalised), experts as wide as
    // intermediate_size, every layer sparse, no shared expert.
    e.n_experts = json_int(j, "num_local_experts", cfg_path);
    e.ff = c.hidden_dim;
    const std::string scoring = string_field(j, "scoring_func", cfg_path, "sigmoid");
    FP_CHECK(scoring == "sigmoid", cfg_path, ": scoring_func '", scoring, "' is not supported for MiniMax-M2 (sigmoid)");
    FP_CHECK(json_bool(j, "use_routing_bias", cfg_path, true), cfg_path, ": use_routing_bias false is not supported for MiniMax-M2");
    FP_CHECK(json_int(j, "shared_intermediate_size", cfg_path, 0) == 0, cfg_path,
             ": shared_intermediate_size (a shared expert) is not supported for MiniMax-M2");
    e.scoring = "sigmoid";
    e.has_bias = true;
    e.norm_topk = true;
    e.group_score = "top2sum";
    return;
  }
  e.ff = json_int(j, "moe_intermediate_size", cfg_path);
  e.norm_topk = json_bool(j, "norm_topk_prob", cfg_path, false);
  if (c.arch == "qwen2moe") {  // one shared expert of its own width, scaled by sigmoid(shared_expert_gate · x)
    e.shared_ff = json_int(j, "shared_expert_intermediate_size", cfg_path, 0);
    e.n_shared = e.shared_ff > 0 ? 1 : 0;
    e.shared_gate = true;
  }
  if (c.arch == "qwen3moe" || c.arch == "qwen2moe") {
    e.n_experts = json_int(j, "num_experts", cfg_path);
    e.sparse_step = json_int(j, "decoder_sparse_step", cfg_path, 1);
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      FP_CHECK(it->is_array(), cfg_path, ": field 'mlp_only_layers' should be an array of layer indices");
      for (auto& v : *it) {
        FP_CHECK(v.is_number_integer(), cfg_path, ": mlp_only_layers holds ", short_json(v), ", not a layer index");
        e.dense_layers.push_back(v.get<int64_t>());
      }
    }
    return;
  }
  if (c.arch == "glm4moe") {  // DeepSeek-V3's router (sigmoid, selection bias, top-2-sum groups), GQA attention
    e.n_experts = json_int(j, "n_routed_experts", cfg_path);
    e.n_shared = json_int(j, "n_shared_experts", cfg_path, 1);
    e.first_dense = json_int(j, "first_k_dense_replace", cfg_path, 1);
    e.scale = static_cast<float>(json_num(j, "routed_scaling_factor", cfg_path, 1.0));
    e.norm_topk = json_bool(j, "norm_topk_prob", cfg_path, true);
    e.scoring = "sigmoid";
    e.has_bias = true;
    e.n_group = json_int(j, "n_group", cfg_path, 1);
    e.topk_group = json_int(j, "topk_group", cfg_path, 1);
    e.group_score = "top2sum";
    return;
  }
  const bool v3 = arch_cls == "DeepseekV3ForCausalLM";
  e.n_experts = json_int(j, "n_routed_experts", cfg_path);
  e.n_shared = json_int(j, "n_shared_experts", cfg_path, 0);
  e.first_dense = json_int(j, "first_k_dense_replace", cfg_path, 0);
  e.scale = static_cast<float>(json_num(j, "routed_scaling_factor", cfg_path, 1.0));
  e.scoring = v3 ? "sigmoid" : string_field(j, "scoring_func", cfg_path, "softmax");
  e.has_bias = v3;
  const std::string method = string_field(j, "topk_method", cfg_path, v3 ? "noaux_tc" : "greedy");
  if (v3 || method == "group_limited_greedy") {
    e.n_group = json_int(j, "n_group", cfg_path, 1);
    e.topk_group = json_int(j, "topk_group", cfg_path, e.n_group);
  }
  e.group_score = v3 ? "top2sum" : "max";
  FP_CHECK(v3 || method == "greedy" || method == "group_limited_greedy", cfg_path, ": topk_method '", method,
           "' is not supported for DeepSeek-V2 (greedy, group_limited_greedy)");
  const int64_t q_lora = json_int(j, "q_lora_rank", cfg_path, 0);  // null: no query compression
  c.mla.q_lora_rank = q_lora;
  c.mla.kv_lora_rank = json_int(j, "kv_lora_rank", cfg_path);
  const int64_t nope = json_int(j, "qk_nope_head_dim", cfg_path), rope = json_int(j, "qk_rope_head_dim", cfg_path);
  c.head_dim = nope + rope;
  c.rot_dim = rope;
  c.v_head_dim = json_int(j, "v_head_dim", cfg_path);
  c.n_kv_heads = c.n_heads;
  // DeepSeek stores the rotary dims as interleaved pairs (V3 unless rope_interleave is false).
  c.rope_style = !v3 || json_bool(j, "rope_interleave", cfg_path, true) ? RopeStyle::Adjacent : RopeStyle::NeoX;
}

// sliding_window and the layers it applies to: layer_types, else every layer but the last of each
// `pattern` (gpt-oss: 2, the even layers; Gemma 3: 6).
void read_sliding_layers(ModelConfig& c, const nlohmann::json& j, const std::string& cfg_path, int64_t pattern,
                         int64_t default_window = 0) {
  // default_window: the class's window where the key is absent (null turns it off).
  c.sliding_window = j.contains("sliding_window") ? json_int(j, "sliding_window", cfg_path, 0) : default_window;
  if (c.sliding_window <= 0) return;
  auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    FP_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.n_layers, cfg_path,
             ": layer_types should list one type per layer (", c.n_layers, ")");
    for (auto& t : *lt) {
      FP_CHECK(t == "sliding_attention" || t == "full_attention", cfg_path, ": layer_types holds ", short_json(t),
               " (sliding_attention or full_attention)");
      c.swa_layers.push_back(t == "sliding_attention");
    }
    return;
  }
  FP_CHECK(pattern >= 1, cfg_path, ": sliding_window_pattern ", pattern, " must be positive");
  for (int64_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back((l + 1) % pattern != 0);
}

// gpt-oss (GptOssForCausalLM): every layer MoE (softmax over the top-k router logits, a bias on
// the router and on each expert's projections, the clamped SwiGLU), biases on q/k/v/o, a sink per
// head, a sliding window on the layers layer_types marks (by default the even ones).
void load_hf_gpt_oss(ModelConfig& c, const nlohmann::json& j, const std::string& cfg_path) {
  MoeConfig& e = c.moe;
  e.n_experts = json_int(j, "num_local_experts", cfg_path);
  e.n_used = json_int(j, "num_experts_per_tok", cfg_path, json_int(j, "experts_per_token", cfg_path, 4));
  e.ff = c.hidden_dim;
  e.norm_topk = true;
  e.router_bias = e.expert_bias = e.swiglu_clamped = true;
  e.swiglu_alpha = static_cast<float>(json_num(j, "swiglu_alpha", cfg_path, 1.702));
  e.swiglu_limit = static_cast<float>(json_num(j, "swiglu_limit", cfg_path, 7.0));
  c.qkv_bias = c.o_bias = json_bool(j, "attention_bias", cfg_path, true);
  c.attn_sinks = true;
  read_sliding_layers(c, j, cfg_path, 2);  // by default the even layers
}

// Llama 4's attention and layer keys (its MoE keys: load_hf_moe). Rotary pairs adjacent (the
// checkpoint's complex view); no_rope_layers[l] is 1 where layer l rotates (default: all but
// every no_rope_layer_interval-th); the rotating layers attend in chunks of attention_chunk_size
// (layer_types "chunked_attention"; null: none) with q and k L2-normed after RoPE (use_qk_norm);
// the others scale their queries with the position (attn_temperature_tuning: floor_scale,
// attn_scale). The dense layers are intermediate_size_mlp wide.
void load_hf_llama4(ModelConfig& c, const nlohmann::json& j, const std::string& cfg_path) {
  const std::string act = string_field(j, "hidden_act", cfg_path, "silu");
  FP_CHECK(act == "silu", cfg_path, ": hidden_act '", act, "' is not supported for Llama 4 (silu)");
  c.rope_style = RopeStyle::Adjacent;
  c.qkv_bias = c.o_bias = json_bool(j, "attention_bias", cfg_path, false);
  c.hidden_dim = json_int(j, "intermediate_size_mlp", cfg_path, 16384);
  const int64_t every = json_int(j, "no_rope_layer_interval", cfg_path, 4);
  FP_CHECK(every >= 1, cfg_path, ": no_rope_layer_interval ", every, " must be positive");
  auto nr = j.find("no_rope_layers");
  if (nr != j.end() && !nr->is_null() && !nr->empty()) {
    FP_CHECK(nr->is_array() && static_cast<int64_t>(nr->size()) >= c.n_layers, cfg_path,
             ": no_rope_layers should list a 0 or 1 for each of the ", c.n_layers, " layers");
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const nlohmann::json& v = (*nr)[static_cast<size_t>(l)];
      FP_CHECK(v.is_number_integer() && (v == 0 || v == 1), cfg_path, ": no_rope_layers holds ", short_json(v), " (0 or 1)");
      c.nope_layers.push_back(v == 0);
    }
  } else {
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % every == 0);
  }
  const auto chunk_key = j.find("attention_chunk_size");  // null: no chunked layers
  c.attention_chunk = chunk_key != j.end() && chunk_key->is_null() ? 0 : json_int(j, "attention_chunk_size", cfg_path, 8192);
  FP_CHECK(c.attention_chunk >= 0, cfg_path, ": attention_chunk_size ", c.attention_chunk, " must not be negative");
  if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    FP_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.n_layers, cfg_path, ": layer_types should name one type per layer (",
             c.n_layers, ")");
    for (auto& t : *lt) {
      FP_CHECK(t == "chunked_attention" || t == "full_attention", cfg_path, ": layer_types holds ", short_json(t),
               " (chunked_attention or full_attention)");
      c.chunked_layers.push_back(t == "chunked_attention");
    }
  } else {
    for (int64_t l = 0; l < c.n_layers; ++l) c.chunked_layers.push_back(c.rotates(l));
  }
  bool any_chunked = false;
  for (bool b : c.chunked_layers) any_chunked = any_chunked || b;
  if (c.attention_chunk == 0 || !any_chunked) c.attention_chunk = 0, c.chunked_layers.clear();
  c.qk_l2_norm = json_bool(j, "use_qk_norm", cfg_path, true);
  // attn_temperature_tuning: true / false (older configs: a number, nonzero for on)
  bool tuning = true;
  if (auto at = j.find("attn_temperature_tuning"); at != j.end() && !at->is_null()) {
    FP_CHECK(at->is_boolean() || at->is_number(), cfg_path, ": field 'attn_temperature_tuning' should be true or false, found ",
             short_json(*at));
    tuning = at->is_boolean() ? at->get<bool>() : at->get<double>() != 0;
  }
  if (tuning) {
    c.nope_temp_floor = static_cast<float>(json_num(j, "floor_scale", cfg_path, 8192));
    c.nope_temp_scale = static_cast<float>(json_num(j, "attn_scale", cfg_path, 0.1));
    FP_CHECK(c.nope_temp_floor > 0, cfg_path, ": floor_scale ", c.nope_temp_floor, " must be positive");
  }
}

// dst[c][r] = src[r][c] for a rows x cols block of T, rows src_stride / columns dst_stride
// elements apart, in 32 x 32 tiles (both sides' cache lines used whole).
template <class T>
void transpose_tiles(const T* src, int64_t src_stride, T* dst, int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t c0 = 0; c0 < cols; c0 += 32)
      for (int64_t r = r0; r < std::min(rows, r0 + 32); ++r)
        for (int64_t k = c0; k < std::min(cols, c0 + 32); ++k) dst[k * dst_stride + r] = src[r * src_stride + k];
}
void transpose_elements(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                        int64_t element_bytes) {
  if (element_bytes == 2)
    transpose_tiles(reinterpret_cast<const uint16_t*>(src), src_stride, reinterpret_cast<uint16_t*>(dst), dst_stride, rows, cols);
  else
    transpose_tiles(reinterpret_cast<const uint32_t*>(src), src_stride, reinterpret_cast<uint32_t*>(dst), dst_stride, rows, cols);
}

// Llama 4's stacked experts (blk.N.llama4.*, tensor_names.cpp) as the canonical stacks
// ffn_{gate,up,down}_exps.weight [E, out, in]: gate_up_proj [E, dim, 2ff] (x · W: transposed; gate
// the first ff columns, up the rest) and down_proj [E, ff, dim], transposed into owned copies, an
// expert per task. (Every expert, on every rank: expert parallel then keeps its own, as with
// gpt-oss's; transposing only the rank's experts is not done.) Layers whose experts come one
// tensor each (feed_forward.experts.E.*_proj.weight) are read as they are.
void split_llama4_experts(ModelFile& m) {
  const ModelConfig& c = m.config;
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", g = p + "llama4.";
    if (!c.moe.is_moe_layer(l)) continue;
    if (!m.find(g + "gate_up_proj") && m.find(p + "ffn_gate_exps.0.weight")) continue;  // one tensor per expert
    const Tensor* gu = m.find(g + "gate_up_proj");
    const Tensor* dn = m.find(g + "down_proj");
    FP_CHECK(gu && dn, m.path, ": missing tensor 'model.layers.", l, ".feed_forward.experts.", gu ? "down_proj" : "gate_up_proj",
             "' (Llama 4 experts of a sparse layer)");
    FP_CHECK(gu->ndim == 3 && gu->dim(0) == E && gu->dim(1) == dim && gu->dim(2) == 2 * ff, m.path, ": tensor '", g,
             "gate_up_proj' has shape ", gu->shape_str(), ", not [", E, ", ", dim, ", ", 2 * ff, "] as the config implies");
    FP_CHECK(dn->ndim == 3 && dn->dim(0) == E && dn->dim(1) == ff && dn->dim(2) == dim, m.path, ": tensor '", g,
             "down_proj' has shape ", dn->shape_str(), ", not [", E, ", ", ff, ", ", dim, "] as the config implies");
    FP_CHECK(gu->dtype == DType::F32 || gu->dtype == DType::F16 || gu->dtype == DType::BF16, m.path,
             ": Llama 4 expert weights should be F32, F16 or BF16, found ", dtype_name(gu->dtype));
    FP_CHECK(dn->dtype == gu->dtype, m.path, ": gate_up_proj and down_proj of layer ", l, " differ in dtype");
    const int64_t es = dtype_info(gu->dtype).block_bytes;
    auto bytes = [&](int64_t n) { return reinterpret_cast<uint8_t*>(m.own_f32(static_cast<size_t>((n + 3) / 4))); };
    uint8_t* gate = bytes(E * ff * dim * es);
    uint8_t* up = bytes(E * ff * dim * es);
    uint8_t* down = bytes(E * dim * ff * es);
    const auto* src = static_cast<const uint8_t*>(gu->data);
    const auto* dsrc = static_cast<const uint8_t*>(dn->data);
    thread_pool().parallel_for(E, 1, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        const uint8_t* from = src + e * dim * 2 * ff * es;  // [dim, 2ff]
        transpose_elements(from, 2 * ff, gate + e * ff * dim * es, dim, dim, ff, es);
        transpose_elements(from + ff * es, 2 * ff, up + e * ff * dim * es, dim, dim, ff, es);
        transpose_elements(dsrc + e * ff * dim * es, dim, down + e * dim * ff * es, ff, ff, dim, es);  // [ff, dim] -> [dim, ff]
      }
    });
    m.tensors[p + "ffn_gate_exps.weight"] = Tensor::view(gate, gu->dtype, {E, ff, dim});
    m.tensors[p + "ffn_up_exps.weight"] = Tensor::view(up, gu->dtype, {E, ff, dim});
    m.tensors[p + "ffn_down_exps.weight"] = Tensor::view(down, gu->dtype, {E, dim, ff});
    m.tensors.erase(g + "gate_up_proj");
    m.tensors.erase(g + "down_proj");
  }
  for (auto it = m.tensors.begin(); it != m.tensors.end();)  // stacks on a dense layer, or other names, are unexpected
    if (it->first.find(".llama4.") != std::string::npos) {
      m.notes.push_back("ignored tensor '" + it->first + "'");
      it = m.tensors.erase(it);
    } else {
      ++it;
    }
}

// gpt-oss's stacked experts (blk.N.gptoss.*, tensor_names.cpp) as the canonical stacks
// ffn_{gate,up,down}_exps.{weight,bias} [E, out, in] that load_moe_layer reads:
//  - plain (BF16/F16/F32) gate_up_proj [E, dim, 2ff] (x · W: transposed) with gate and up
//    interleaved (gate = even columns), down_proj [E, ff, dim]: transposed into owned copies;
//  - MXFP4 (OpenAI's checkpoints) gate_up_proj_blocks [E, 2ff, dim/32, 16] + _scales [E, 2ff,
//    dim/32] (rows = outputs; even rows gate), down_proj_blocks [E, dim, ff/32, 16]: each block
//    rewritten as a BlockMXFP4 (the scale byte, then nibbles with element j low and j + 16 high,
//    where the checkpoint packs elements 2j low and 2j + 1 high);
//  - gate_up_proj_bias [E, 2ff] split (interleaved), down_proj_bias [E, dim] kept.
void split_gpt_oss_experts(ModelFile& m) {
  const ModelConfig& c = m.config;
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim;
  auto take = [&](const std::string& name) -> const Tensor& {
    const Tensor* t = m.find(name);
    FP_CHECK(t, m.path, ": missing tensor '", name, "' (gpt-oss experts)");
    return *t;
  };
  auto shape_is = [&](const std::string& name, const Tensor& t, std::initializer_list<int64_t> want) {
    bool ok = t.ndim == static_cast<int>(want.size());
    int i = 0;
    for (int64_t d : want) ok = ok && t.shape[static_cast<size_t>(i++)] == d;
    FP_CHECK(ok, m.path, ": tensor '", name, "' has shape ", t.shape_str(), ", not the one the config implies");
  };
  auto bytes = [&](int64_t n) { return reinterpret_cast<uint8_t*>(m.own_f32(static_cast<size_t>((n + 3) / 4))); };
  auto floats = [&](const Tensor& t, int64_t i) {  // element i of a plain tensor as f32
    float v;
    dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + i * dtype_info(t.dtype).block_bytes, &v, 1);
    return v;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", g = p + "gptoss.";
    std::vector<std::string> done;
    if (m.find(g + "gate_up_proj_blocks")) {
      FP_CHECK(dim % 32 == 0 && ff % 32 == 0, m.path, ": MXFP4 experts need hidden and expert widths that are multiples of 32");
      const Tensor &gub = take(g + "gate_up_proj_blocks"), &gus = take(g + "gate_up_proj_scales");
      const Tensor &db = take(g + "down_proj_blocks"), &ds = take(g + "down_proj_scales");
      shape_is(g + "gate_up_proj_blocks", gub, {E, 2 * ff, dim / 32, 16});
      shape_is(g + "gate_up_proj_scales", gus, {E, 2 * ff, dim / 32});
      shape_is(g + "down_proj_blocks", db, {E, dim, ff / 32, 16});
      shape_is(g + "down_proj_scales", ds, {E, dim, ff / 32});
      for (const Tensor* t : {&gub, &gus, &db, &ds})
        FP_CHECK(t->dtype == DType::U8 || t->dtype == DType::I8, m.path, ": gpt-oss MXFP4 blocks and scales should be U8, found ",
                 dtype_name(t->dtype));
      // The reads below stay inside these tensors: one byte per element, as many as the shapes say.
      FP_CHECK(gub.nbytes() == E * 2 * ff * dim / 2 && gus.nbytes() == E * 2 * ff * dim / 32 && db.nbytes() == E * dim * ff / 2 &&
                   ds.nbytes() == E * dim * ff / 32,
               m.path, ": gpt-oss MXFP4 blocks/scales of layer ", l, " do not hold the bytes their shapes imply");
      // rows [E * rows_out] of `in` values: source row r of the checkpoint -> destination row.
      auto convert = [&](const Tensor& blocks, const Tensor& scales, int64_t src_row, BlockMXFP4* dst, int64_t in) {
        const int64_t nb = in / 32;
        const auto* qs = static_cast<const uint8_t*>(blocks.data) + src_row * nb * 16;
        const auto* sc = static_cast<const uint8_t*>(scales.data) + src_row * nb;
        for (int64_t b = 0; b < nb; ++b) {
          dst[b].e = sc[b];
          uint8_t v[32];
          for (int k = 0; k < 16; ++k) v[2 * k] = qs[b * 16 + k] & 15, v[2 * k + 1] = qs[b * 16 + k] >> 4;
          for (int k = 0; k < 16; ++k) dst[b].qs[k] = static_cast<uint8_t>(v[k] | (v[k + 16] << 4));
        }
      };
      const int64_t in_row = dim / 32, down_row = ff / 32;
      auto* gate = reinterpret_cast<BlockMXFP4*>(bytes(E * ff * in_row * 17));
      auto* up = reinterpret_cast<BlockMXFP4*>(bytes(E * ff * in_row * 17));
      auto* down = reinterpret_cast<BlockMXFP4*>(bytes(E * dim * down_row * 17));
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t j = 0; j < ff; ++j) {
          convert(gub, gus, e * 2 * ff + 2 * j, gate + (e * ff + j) * in_row, dim);
          convert(gub, gus, e * 2 * ff + 2 * j + 1, up + (e * ff + j) * in_row, dim);
        }
        for (int64_t i = 0; i < dim; ++i) convert(db, ds, e * dim + i, down + (e * dim + i) * down_row, ff);
      }
      m.tensors[p + "ffn_gate_exps.weight"] = Tensor::view(gate, DType::MXFP4, {E, ff, dim});
      m.tensors[p + "ffn_up_exps.weight"] = Tensor::view(up, DType::MXFP4, {E, ff, dim});
      m.tensors[p + "ffn_down_exps.weight"] = Tensor::view(down, DType::MXFP4, {E, dim, ff});
      done = {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"};
    } else {
      const Tensor &gu = take(g + "gate_up_proj"), &dn = take(g + "down_proj");
      shape_is(g + "gate_up_proj", gu, {E, dim, 2 * ff});
      shape_is(g + "down_proj", dn, {E, ff, dim});
      FP_CHECK(gu.dtype == DType::F32 || gu.dtype == DType::F16 || gu.dtype == DType::BF16, m.path,
               ": gpt-oss expert weights should be F32, F16 or BF16 (or MXFP4 blocks), found ", dtype_name(gu.dtype));
      FP_CHECK(dn.dtype == gu.dtype, m.path, ": gate_up_proj and down_proj of layer ", l, " differ in dtype");
      const int64_t es = dtype_info(gu.dtype).block_bytes;
      uint8_t* gate = bytes(E * ff * dim * es);
      uint8_t* up = bytes(E * ff * dim * es);
      uint8_t* down = bytes(E * dim * ff * es);
      const auto* src = static_cast<const uint8_t*>(gu.data);
      const auto* dsrc = static_cast<const uint8_t*>(dn.data);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < dim; ++i)
          for (int64_t j = 0; j < ff; ++j) {
            const int64_t from = ((e * dim + i) * 2 * ff + 2 * j) * es, to = ((e * ff + j) * dim + i) * es;
            std::memcpy(gate + to, src + from, static_cast<size_t>(es));
            std::memcpy(up + to, src + from + es, static_cast<size_t>(es));
            std::memcpy(down + ((e * dim + i) * ff + j) * es, dsrc + ((e * ff + j) * dim + i) * es, static_cast<size_t>(es));
          }
      m.tensors[p + "ffn_gate_exps.weight"] = Tensor::view(gate, gu.dtype, {E, ff, dim});
      m.tensors[p + "ffn_up_exps.weight"] = Tensor::view(up, gu.dtype, {E, ff, dim});
      m.tensors[p + "ffn_down_exps.weight"] = Tensor::view(down, gu.dtype, {E, dim, ff});
      done = {"gate_up_proj", "down_proj"};
    }
    const Tensor &gub = take(g + "gate_up_proj_bias"), &dnb = take(g + "down_proj_bias");
    shape_is(g + "gate_up_proj_bias", gub, {E, 2 * ff});
    shape_is(g + "down_proj_bias", dnb, {E, dim});
    float* gb = m.own_f32(static_cast<size_t>(E * ff));
    float* ub = m.own_f32(static_cast<size_t>(E * ff));
    float* db = m.own_f32(static_cast<size_t>(E * dim));
    for (int64_t k = 0; k < E * ff; ++k) gb[k] = floats(gub, 2 * k), ub[k] = floats(gub, 2 * k + 1);
    for (int64_t k = 0; k < E * dim; ++k) db[k] = floats(dnb, k);
    m.tensors[p + "ffn_gate_exps.bias"] = Tensor::view(gb, DType::F32, {E, ff});
    m.tensors[p + "ffn_up_exps.bias"] = Tensor::view(ub, DType::F32, {E, ff});
    m.tensors[p + "ffn_down_exps.bias"] = Tensor::view(db, DType::F32, {E, dim});
    done.push_back("gate_up_proj_bias");
    done.push_back("down_proj_bias");
    for (auto& d : done) m.tensors.erase(g + d);
  }
  for (auto it = m.tensors.begin(); it != m.tensors.end();)  // anything left under gptoss. is unexpected
    if (it->first.find(".gptoss.") != std::string::npos) {
      m.notes.push_back("ignored tensor '" + it->first + "'");
      it = m.tensors.erase(it);
    } else {
      ++it;
    }
}

// Gemma 2's config (Gemma2ForCausalLM) over Gemma2Config's defaults, or Gemma 3's text model:
// Gemma3ForCausalLM's config, or Gemma3ForConditionalGeneration's text_config (whose files leave
// out most fields), over Gemma3TextConfig's defaults. A key present as null (a cap of None)
// stays null: off.
nlohmann::json gemma_text_config(const nlohmann::json& j, const std::string& arch_cls, const std::string& cfg_path) {
  nlohmann::json t = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                      {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                      {"head_dim", 256}, {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 131072},
                      {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}, {"query_pre_attn_scalar", 256},
                      {"sliding_window", 4096}, {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0}};
  if (arch_cls == "Gemma2ForCausalLM") {
    t["vocab_size"] = 256000;
    t["max_position_embeddings"] = 8192;
    t["rope_theta"] = 10000.0;
    t.erase("rope_local_base_freq");
    t["final_logit_softcapping"] = 30.0;
    t["attn_logit_softcapping"] = 50.0;
  }
  const nlohmann::json* src = &j;
  if (arch_cls == "Gemma3ForConditionalGeneration") {
    auto tc = j.find("text_config");
    FP_CHECK(tc != j.end() && tc->is_object(), cfg_path, ": Gemma3ForConditionalGeneration without a text_config object");
    src = &*tc;
    // The tie lives at the top level of the multimodal config.
    if (auto tie = j.find("tie_word_embeddings"); tie != j.end()) t["tie_word_embeddings"] = *tie;
  }
  for (auto& [k, v] : src->items()) t[k] = v;
  return t;
}

// Gemma 2 and 3 (model/llama.cpp): sandwich norms, GeGLU, embeddings times sqrt(dim), scores
// times query_pre_attn_scalar^-1/2, norms stored as w - 1 (added back at load). Gemma 2: scores
// and logits soft-capped, the sliding-window layers from layer_types, else the even ones.
// Gemma 3: q/k norms, sliding-window layers (layer_types, else every sixth global) with their
// own unscaled RoPE base. Returns the (global layers') RoPE scaling (rope_scaling, or
// rope_parameters, Gemma 3's .full_attention in transformers v5's spelling), or null.
const nlohmann::json* load_hf_gemma(ModelConfig& c, const nlohmann::json& j, const std::string& cfg_path) {
  const bool gemma2 = c.arch == "gemma2";
  const std::string act = string_field(j, "hidden_activation", cfg_path, "gelu_pytorch_tanh");
  FP_CHECK(act == "gelu_pytorch_tanh" || act == "gelu_tanh", cfg_path, ": hidden_activation '", act,
           "' (Gemma's FFN here is gelu_pytorch_tanh)");
  if (gemma2) {
    c.attn_softcap = static_cast<float>(json_num(j, "attn_logit_softcapping", cfg_path, 0.0));
    c.final_softcap = static_cast<float>(json_num(j, "final_logit_softcapping", cfg_path, 0.0));
    FP_CHECK(c.attn_softcap >= 0 && c.final_softcap >= 0, cfg_path, ": logit soft-capping (attn ", c.attn_softcap,
             ", final ", c.final_softcap, ") must be positive or null");
  } else {
    for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
      FP_CHECK(json_num(j, cap, cfg_path, 0.0) == 0.0, cfg_path, ": ", cap, " = ", short_json(j[cap]),
               ": Gemma 3 has no logit soft-capping");
  }
  FP_CHECK(!json_bool(j, "use_bidirectional_attention", cfg_path, false), cfg_path,
           ": use_bidirectional_attention (an embedding model) is not supported");
  c.post_norms = c.gelu_ffn = true;
  c.qk_norm = !gemma2;
  c.norm_weight_offset = 1.0f;
  c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  const double qpas = json_num(j, "query_pre_attn_scalar", cfg_path, 256.0);
  FP_CHECK(qpas > 0, cfg_path, ": query_pre_attn_scalar ", qpas, " must be positive");
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  read_sliding_layers(c, j, cfg_path, gemma2 ? 2 : json_int(j, "sliding_window_pattern", cfg_path, 6));
  if (gemma2) {
    for (const char* key : {"rope_scaling", "rope_parameters"})
      if (auto it = j.find(key); it != j.end() && it->is_object()) return &*it;
    return nullptr;
  }
  c.rope_theta_swa = static_cast<float>(json_num(j, "rope_local_base_freq", cfg_path, 10000.0));
  auto rp = j.find("rope_parameters");  // transformers v5: one entry per layer type
  if (rp != j.end() && rp->is_object() && rp->contains("full_attention")) {
    if (auto sw = rp->find("sliding_attention"); sw != rp->end() && sw->is_object()) {
      const std::string type = string_field(*sw, "rope_type", cfg_path, "default");
      FP_CHECK(type == "default", cfg_path, ": rope_parameters.sliding_attention.rope_type '", type,
               "' (the sliding layers' RoPE is unscaled here)");
      c.rope_theta_swa = static_cast<float>(json_num(*sw, "rope_theta", cfg_path, c.rope_theta_swa));
    }
    auto full = rp->find("full_attention");
    return full->is_object() ? &*full : nullptr;
  }
  auto rs = j.find("rope_scaling");
  return rs != j.end() && rs->is_object() ? &*rs : nullptr;
}

// rot_dim from partial_rotary_factor (the rotated first part of each head), which sits at the
// top level or, in transformers v5's spelling, in the RoPE object `rs`.
void read_partial_rotary(ModelConfig& c, const nlohmann::json& j, const nlohmann::json* rs, const std::string& cfg_path,
                         double def) {
  double factor = json_num(j, "partial_rotary_factor", cfg_path, def);
  if (rs) factor = json_num(*rs, "partial_rotary_factor", cfg_path, factor);
  FP_CHECK(factor > 0 && factor <= 1, cfg_path, ": partial_rotary_factor ", factor, " must be in (0, 1]");
  c.rot_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor);
}

// GraniteMoe's checkpoints keep each layer's experts as two stacks (tensor_names.cpp):
// input_linear [E, 2 ff, dim], each expert's gate rows then its up rows, and output_linear
// [E, dim, ff]; GraniteMoeShared's shared_mlp the same without the expert axis. Each part becomes
// a view of its rows (expert e's gate and up a tensor of its own), so the MoE layers read them
// as Mixtral's.
void split_granite_moe_experts(ModelFile& m) {
  const ModelConfig& c = m.config;
  const int64_t E = c.moe.n_experts, ff = c.moe.ff, dim = c.dim, sh = c.moe.shared_ff;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const std::string fused = p + "ffn_gate_up_exps.weight";
    const Tensor* gu = m.find(fused);
    FP_CHECK(gu, m.path, ": missing tensor 'model.layers.", l, ".block_sparse_moe.input_linear.weight' (GraniteMoe experts)");
    FP_CHECK(gu->ndim == 3 && gu->dim(0) == E && gu->dim(1) == 2 * ff && gu->dim(2) == dim && !gu->block_scale, m.path,
             ": 'model.layers.", l, ".block_sparse_moe.input_linear.weight' has shape ", gu->shape_str(), ", expected [", E, ", ",
             2 * ff, ", ", dim, "] (num_local_experts, 2 x intermediate_size, hidden_size)");
    const Tensor whole = *gu;
    const int64_t rb = row_bytes(whole.dtype, dim);
    for (int64_t e = 0; e < E; ++e) {
      const auto* base = static_cast<const uint8_t*>(whole.data) + e * 2 * ff * rb;
      m.tensors[p + "ffn_gate_exps." + std::to_string(e) + ".weight"] = Tensor::view(base, whole.dtype, {ff, dim});
      m.tensors[p + "ffn_up_exps." + std::to_string(e) + ".weight"] = Tensor::view(base + ff * rb, whole.dtype, {ff, dim});
    }
    m.tensors.erase(fused);
    const std::string shared = p + "ffn_gate_up_shexp.weight";
    const Tensor* sgu = m.find(shared);
    FP_CHECK((sgu != nullptr) == (sh > 0), m.path, ": layer ", l, (sh > 0 ? " has no" : " has a"),
             " shared_mlp.input_linear, but shared_intermediate_size is ", sh);
    if (!sgu) continue;
    FP_CHECK(sgu->ndim == 2 && sgu->dim(0) == 2 * sh && sgu->dim(1) == dim && !sgu->block_scale, m.path, ": 'model.layers.", l,
             ".shared_mlp.input_linear.weight' has shape ", sgu->shape_str(), ", expected [", 2 * sh, ", ", dim,
             "] (2 x shared_intermediate_size, hidden_size)");
    const Tensor s2 = *sgu;
    m.tensors[p + "ffn_gate_shexp.weight"] = Tensor::view(s2.row_ptr(0), s2.dtype, {sh, dim});
    m.tensors[p + "ffn_up_shexp.weight"] = Tensor::view(s2.row_ptr(sh), s2.dtype, {sh, dim});
    m.tensors.erase(shared);
  }
}

// Tencent's Hunyuan dense (HunYuanDenseV1ForCausalLM): Llama with q and k RMS-normed per head
// after RoPE. Its "dynamic" RoPE scaling with a fixed alpha is NTK-aware and static: the base
// becomes rope_theta * alpha^(head_dim / (head_dim - 2)) (as transformers' ntk_alpha and
// llama.cpp's converter). Biases (attention_bias) are refused. Returns the RoPE object left to
// read (null: consumed here).
const nlohmann::json* load_hf_hunyuan(ModelConfig& c, const nlohmann::json& j, const nlohmann::json* rs, const std::string& cfg_path) {
  FP_CHECK(!json_bool(j, "attention_bias", cfg_path, false), cfg_path, ": attention_bias (biases on Hunyuan's projections) is not supported");
  c.qk_norm = c.qk_norm_after_rope = true;
  if (!rs) return nullptr;
  const std::string type = string_field(*rs, "rope_type", cfg_path, string_field(*rs, "type", cfg_path, "none"));
  if (type != "dynamic") return rs;
  FP_CHECK(rs->contains("alpha") && !(*rs)["alpha"].is_null(), cfg_path,
           ": rope_scaling type 'dynamic' without alpha (sequence-length-dependent NTK scaling) is not supported");
  const double alpha = json_num(*rs, "alpha", cfg_path, 1.0);
  FP_CHECK(alpha > 0 && std::isfinite(alpha) && c.head_dim > 2, cfg_path, ": rope_scaling alpha ", alpha, " must be positive");
  const double theta = json_num(*rs, "rope_theta", cfg_path, c.rope_theta);
  const double hd = static_cast<double>(c.head_dim);
  c.rope_theta = static_cast<float>(theta * std::pow(alpha, hd / (hd - 2)));
  return nullptr;
}

// OLMo 3 (Olmo3ForCausalLM): OLMo 2's layers with a sliding window on layer_types' sliding
// layers (by default three of every four) and RoPE parameters per layer type: rope_parameters
// {sliding_attention: {...}, full_attention: {...}} (transformers v5), or a legacy rope_scaling
// that applies to the full-attention layers only. The sliding layers must rotate unscaled, with
// a base of their own (as Gemma 3's: rope_theta_swa); the full layers' scaling (YaRN in the
// long-context models) is the model's. Returns the full layers' RoPE object (or null).
const nlohmann::json* load_hf_olmo3(ModelConfig& c, const nlohmann::json& j, const nlohmann::json* rs, const std::string& cfg_path) {
  read_sliding_layers(c, j, cfg_path, 4, 4096);  // (Olmo3Config's default window)
  c.rope_theta_swa = c.rope_theta;
  if (!rs) return nullptr;
  if (!rs->contains("full_attention") && !rs->contains("sliding_attention")) return rs;  // legacy rope_scaling: the full layers'
  for (const char* k : {"full_attention", "sliding_attention"})
    FP_CHECK(!rs->contains(k) || (*rs)[k].is_object(), cfg_path, ": rope_parameters.", k, " should be an object");
  if (auto it = rs->find("sliding_attention"); it != rs->end()) {
    const std::string type = string_field(*it, "rope_type", cfg_path, "default");
    FP_CHECK(type == "default", cfg_path, ": rope_parameters.sliding_attention rope_type '", type,
             "' is not supported (the sliding layers rotate unscaled)");
    c.rope_theta_swa = static_cast<float>(json_num(*it, "rope_theta", cfg_path, c.rope_theta));
  }
  auto full = rs->find("full_attention");
  return full != rs->end() ? &*full : nullptr;
}

void load_hf(ModelFile& m, const std::string& dir) {
  std::string cfg_path = dir + "/config.json";
  std::ifstream in(cfg_path);
  FP_CHECK(in, cfg_path, ": cannot open (a Hugging Face model directory needs config.json)");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  FP_CHECK(!j.is_discarded() && j.is_object(), cfg_path, ": not a valid JSON object");
  m.format = "safetensors";
  for (auto& [k, v] : j.items()) m.metadata.emplace_back(k, short_json(v));
  ModelConfig& c = m.config;
  c.source = "safetensors";
  c.name = std::filesystem::path(dir).filename().string();
  std::string arch_cls;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    arch_cls = (*it)[0].get<std::string>();
  if (arch_cls == "LlamaForCausalLM" || arch_cls == "MistralForCausalLM" || arch_cls == "Mistral3ForConditionalGeneration")
    c.arch = "llama";
  else if (arch_cls == "Qwen2ForCausalLM") c.arch = "qwen2";
  else if (arch_cls == "Qwen3ForCausalLM") c.arch = "qwen3";
  else if (arch_cls == "Qwen3MoeForCausalLM") c.arch = "qwen3moe";
  else if (arch_cls == "Qwen2MoeForCausalLM") c.arch = "qwen2moe";
  else if (arch_cls == "MixtralForCausalLM") c.arch = "mixtral";
  else if (arch_cls == "DeepseekV3ForCausalLM" || arch_cls == "DeepseekV2ForCausalLM") c.arch = "deepseek2";
  else if (arch_cls == "Glm4MoeForCausalLM") c.arch = "glm4moe";
  else if (arch_cls == "MiniMaxM2ForCausalLM") c.arch = "minimax-m2";
  else if (arch_cls == "SeedOssForCausalLM") c.arch = "seed_oss";
  else if (arch_cls == "Ernie4_5ForCausalLM") c.arch = "ernie4_5";
  else if (arch_cls == "Ernie4_5_MoeForCausalLM") c.arch = "ernie4_5-moe";
  else if (arch_cls == "Exaone4ForCausalLM") c.arch = "exaone4";
  else if (arch_cls == "Olmo3ForCausalLM") c.arch = "olmo3";
  else if (arch_cls == "HunYuanDenseV1ForCausalLM") c.arch = "hunyuan-dense";
  else if (arch_cls == "HunYuanMoEV1ForCausalLM") c.arch = "hunyuan-moe";
  else if (arch_cls == "Llama4ForCausalLM" || arch_cls == "Llama4ForConditionalGeneration") c.arch = "llama4";
  else if (arch_cls == "GptOssForCausalLM") c.arch = "gpt-oss";
  else if (arch_cls == "Gemma2ForCausalLM") c.arch = "gemma2";
  else if (arch_cls == "Phi3ForCausalLM") c.arch = "phi3";
  else if (arch_cls == "Glm4ForCausalLM") c.arch = "glm4";
  else if (arch_cls == "GraniteForCausalLM") c.arch = "granite";
  else if (arch_cls == "GraniteMoeForCausalLM" || arch_cls == "GraniteMoeSharedForCausalLM") c.arch = "granitemoe";
  else if (arch_cls == "SmolLM3ForCausalLM") c.arch = "smollm3";
  else if (arch_cls == "Olmo2ForCausalLM") c.arch = "olmo2";
  else if (arch_cls == "Gemma3ForCausalLM" || arch_cls == "Gemma3ForConditionalGeneration") c.arch = "gemma3";
  else fail(cfg_path, ": architectures[0] '", arch_cls, "' is not supported yet (LlamaForCausalLM, Qwen2ForCausalLM, ",
            "Qwen3ForCausalLM, Glm4ForCausalLM, GraniteForCausalLM, GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM, MiniMaxM2ForCausalLM, SeedOssForCausalLM, Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM, Exaone4ForCausalLM, Olmo3ForCausalLM, HunYuanDenseV1ForCausalLM, HunYuanMoEV1ForCausalLM, Llama4ForCausalLM, Llama4ForConditionalGeneration, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM, DeepseekV2ForCausalLM, Glm4MoeForCausalLM, ",
            "GptOssForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Phi3ForCausalLM, ",
            "SmolLM3ForCausalLM, Olmo2ForCausalLM, Mistral3ForConditionalGeneration)");
  const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
  if (gemma) j = gemma_text_config(j, arch_cls, cfg_path);
  // Mistral Small 3.1 / 3.2 (Mistral3ForConditionalGeneration): its text model, a Mistral under
  // text_config, with the vision tower and projector beside it (ignored).
  // Llama 4 Scout / Maverick (Llama4ForConditionalGeneration): the same layout, with its MoE text model.
  const bool multimodal = arch_cls == "Mistral3ForConditionalGeneration" || arch_cls == "Gemma3ForConditionalGeneration" ||
                          arch_cls == "Llama4ForConditionalGeneration";
  if (arch_cls == "Mistral3ForConditionalGeneration" || arch_cls == "Llama4ForConditionalGeneration") {
    auto tc = j.find("text_config");
    FP_CHECK(tc != j.end() && tc->is_object(), cfg_path, ": ", arch_cls, " without a text_config object");
    nlohmann::json t = *tc;
    if (auto tie = j.find("tie_word_embeddings"); tie != j.end() && !t.contains("tie_word_embeddings")) t["tie_word_embeddings"] = *tie;
    j = std::move(t);
  }
  c.dim = json_int(j, "hidden_size", cfg_path);
  c.n_layers = json_int(j, "num_hidden_layers", cfg_path);
  if (c.arch == "deepseek2" || c.arch == "glm4moe") c.mtp_layers = json_int(j, "num_nextn_predict_layers", cfg_path, 0);
  c.n_heads = json_int(j, "num_attention_heads", cfg_path);
  c.n_kv_heads = json_int(j, "num_key_value_heads", cfg_path, c.n_heads);
  c.hidden_dim = json_int(j, "intermediate_size", cfg_path);
  c.n_vocab = json_int(j, "vocab_size", cfg_path);
  c.max_context = json_int(j, "max_position_embeddings", cfg_path, 2048);
  FP_CHECK(c.n_heads > 0, cfg_path, ": num_attention_heads must be positive");
  c.head_dim = json_int(j, "head_dim", cfg_path, c.dim / c.n_heads);
  c.v_head_dim = c.rot_dim = c.head_dim;
  c.rms_eps = static_cast<float>(json_num(j, "rms_norm_eps", cfg_path, 1e-6));
  // transformers' default base where a config leaves it out: 10000, or the class's default_theta.
  const double default_theta = c.arch == "ernie4_5" || c.arch == "ernie4_5-moe" || c.arch == "olmo3" || c.arch == "llama4" ? 500000.0
                               : c.arch == "minimax-m2"                                               ? 5000000.0
                                                                                                      : 10000.0;
  c.rope_theta = static_cast<float>(json_num(j, "rope_theta", cfg_path, default_theta));
  c.rope_style = RopeStyle::NeoX;  // HF rotate_half
  c.tied_output = json_bool(j, "tie_word_embeddings", cfg_path, false);
  c.qkv_bias = c.arch == "qwen2" || c.arch == "qwen2moe" || json_bool(j, "attention_bias", cfg_path, false);
  c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe" || (c.arch == "glm4moe" && json_bool(j, "use_qk_norm", cfg_path, false));
  if (c.arch == "qwen3moe" || c.arch == "qwen2moe" || c.arch == "mixtral" || c.arch == "deepseek2" || c.arch == "glm4moe" ||
      c.arch == "granitemoe" || c.arch == "minimax-m2" || c.arch == "ernie4_5-moe" || c.arch == "hunyuan-moe" || c.arch == "llama4")
    load_hf_moe(c, j, cfg_path, arch_cls);
  if (c.arch == "llama4") load_hf_llama4(c, j, cfg_path);
  if (c.arch == "gpt-oss") load_hf_gpt_oss(c, j, cfg_path);
  // The RoPE scaling object, or null: rope_scaling, or transformers v5's rope_parameters.
  const nlohmann::json* rs = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (auto it = j.find(key); !rs && it != j.end() && it->is_object()) rs = &*it;
  if (gemma) rs = load_hf_gemma(c, j, cfg_path);
  if (c.arch == "olmo3") rs = load_hf_olmo3(c, j, rs, cfg_path);
  if (c.arch == "hunyuan-dense" || c.arch == "hunyuan-moe") rs = load_hf_hunyuan(c, j, rs, cfg_path);
  if (c.arch == "qwen2moe") {
    // Qwen2-MoE: q/k/v biases unless qkv_bias is false; a window only where layer_types says
    // (transformers' default pattern for this class has changed between versions).
    c.qkv_bias = json_bool(j, "qkv_bias", cfg_path, true);
    if (json_bool(j, "use_sliding_window", cfg_path, false)) {
      FP_CHECK(j.find("layer_types") != j.end() && !j["layer_types"].is_null(), cfg_path,
               ": use_sliding_window without layer_types: say which layers slide the window (layer_types)");
      read_sliding_layers(c, j, cfg_path, 1);
    }
  }
  if ((c.arch == "qwen2" || c.arch == "qwen3") && json_bool(j, "use_sliding_window", cfg_path, false)) {
    // Qwen2 / Qwen3 with use_sliding_window: the window on layer_types' sliding layers, else on
    // the layers from max_window_layers on (as transformers builds layer_types).
    const bool listed = j.find("layer_types") != j.end() && !j["layer_types"].is_null();
    if (listed) {
      read_sliding_layers(c, j, cfg_path, 1);
    } else {
      c.sliding_window = j.contains("sliding_window") ? json_int(j, "sliding_window", cfg_path, 0) : 4096;  // Qwen2Config's default
      const int64_t from = json_int(j, "max_window_layers", cfg_path, 28);
      for (int64_t l = 0; l < c.n_layers && c.sliding_window > 0; ++l) c.swa_layers.push_back(l >= from);
    }
  }
  if (arch_cls == "MistralForCausalLM" || arch_cls == "Mistral3ForConditionalGeneration" || arch_cls == "MixtralForCausalLM") {
    // Mistral 7B v0.1 attends through a window of 4096 on every layer; later Mistrals write null
    // (off). A config without the key gets no window here (transformers would default to 4096).
    c.sliding_window = json_int(j, "sliding_window", cfg_path, 0);
    c.swa_layers.assign(static_cast<size_t>(c.sliding_window > 0 ? c.n_layers : 0), true);
  }
  if (c.arch == "exaone4") {
    // LG's EXAONE 4.0: OLMo 2's norms after the sublayers only, Qwen3's q/k norms per head; with
    // sliding_window set, its sliding layers rotate and attend through the window and the others
    // (global) attend to everything without RoPE. The layers from layer_types, else from
    // sliding_window_pattern: an int p (every p-th layer global) or a string like "LLLG".
    FP_CHECK(!json_bool(j, "attention_bias", cfg_path, false), cfg_path, ": attention_bias (EXAONE 4.0 has none) is not supported");
    c.pre_norms = false;
    c.post_norms = c.qk_norm = true;
    c.qkv_bias = false;
    int64_t pattern = 4;
    if (auto it = j.find("sliding_window_pattern"); it != j.end() && !it->is_null()) {
      if (it->is_string()) {
        const std::string p = it->get<std::string>();
        FP_CHECK(!p.empty() && p.back() == 'G' && p.find_first_not_of('L') == p.size() - 1, cfg_path,
                 ": sliding_window_pattern '", p, "' is not supported (L...LG: local layers, then one global)");
        pattern = static_cast<int64_t>(p.size());
      } else {
        pattern = json_int(j, "sliding_window_pattern", cfg_path);
      }
    }
    read_sliding_layers(c, j, cfg_path, pattern, 4096);  // (Exaone4Config's default window)
    if (c.sliding_window > 0)
      for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back(!c.swa_layers[static_cast<size_t>(l)]);
  }
  if (c.arch == "olmo2" || c.arch == "olmo3") {
    // OLMo 2: a norm after the attention and after the FFN (post_attention_layernorm,
    // post_feedforward_layernorm) and none before them; q and k normalised over the whole
    // projection.
    FP_CHECK(!json_bool(j, "attention_bias", cfg_path, false), cfg_path, ": attention_bias (OLMo 2 has none) is not supported");
    c.pre_norms = false;
    c.post_norms = c.qk_norm = c.qk_norm_full = true;
    c.qkv_bias = false;
  }
  if (c.arch == "smollm3") {
    // SmolLM3: no_rope_layers[l] is 1 where layer l rotates (default: all but every
    // no_rope_layer_interval-th); a window (use_sliding_window) on the layer_types' sliding
    // layers, by default the NoPE ones.
    for (const char* k : {"attention_bias", "mlp_bias"})
      FP_CHECK(!json_bool(j, k, cfg_path, false), cfg_path, ": ", k, " (biases on SmolLM3's projections) is not supported");
    const int64_t every = json_int(j, "no_rope_layer_interval", cfg_path, 4);
    FP_CHECK(every >= 1, cfg_path, ": no_rope_layer_interval ", every, " must be positive");
    auto nr = j.find("no_rope_layers");
    if (nr != j.end() && !nr->is_null()) {
      FP_CHECK(nr->is_array() && static_cast<int64_t>(nr->size()) == c.n_layers, cfg_path,
               ": no_rope_layers should list one 0 or 1 per layer (", c.n_layers, ")");
      for (auto& v : *nr) {
        FP_CHECK(v.is_number_integer() && (v == 0 || v == 1), cfg_path, ": no_rope_layers holds ", short_json(v), " (0 or 1)");
        c.nope_layers.push_back(v == 0);
      }
    } else {
      for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % every == 0);
    }
    if (json_bool(j, "use_sliding_window", cfg_path, false)) {
      read_sliding_layers(c, j, cfg_path, 1);
      if (c.sliding_window > 0 && (j.find("layer_types") == j.end() || j["layer_types"].is_null()))
        c.swa_layers = c.nope_layers;
    }
  }
  if (c.arch == "phi3") {
    // Phi-3 / Phi-4: the first partial_rotary_factor of each head rotates (NeoX halves of that
    // part); every layer windowed when sliding_window is set (Phi-3-mini's 2047).
    read_partial_rotary(c, j, rs, cfg_path, 1.0);
    if (rs) read_hf_longrope(c, j, *rs, cfg_path);
    c.sliding_window = json_int(j, "sliding_window", cfg_path, 0);
    c.swa_layers.assign(static_cast<size_t>(c.sliding_window > 0 ? c.n_layers : 0), true);
  }
  if (c.arch == "glm4moe") {
    // GLM rotates the first partial_rotary_factor of each head (NeoX halves of that part).
    read_partial_rotary(c, j, rs, cfg_path, 0.5);
  }
  if (c.arch == "seed_oss") {
    // ByteDance Seed-OSS: Llama with q/k/v biases (attention_bias, true by default); the output
    // projection's (attention_out_bias) and the MLP's biases are not supported.
    c.qkv_bias = json_bool(j, "attention_bias", cfg_path, true);
    for (const char* k : {"attention_out_bias", "mlp_bias"})
      FP_CHECK(!json_bool(j, k, cfg_path, false), cfg_path, ": ", k, " (biases on Seed-OSS's ", k[0] == 'a' ? "output" : "MLP",
               " projections) is not supported");
  }
  if (c.arch == "ernie4_5" || c.arch == "ernie4_5-moe") {
    // Baidu ERNIE 4.5 (dense, and MoE beside it): Llama with adjacent rotary pairs in the checkpoint itself
    // (transformers' rotate_half over even/odd elements); use_bias (every projection) unsupported.
    FP_CHECK(!json_bool(j, "use_bias", cfg_path, false), cfg_path, ": use_bias (biases on ERNIE 4.5's projections) is not supported");
    c.rope_style = RopeStyle::Adjacent;
    c.tied_output = json_bool(j, "tie_word_embeddings", cfg_path, true);
  }
  if (c.arch == "minimax-m2") {
    // MiniMax-M2: NeoX halves over the first rotary_dim of each head (its checkpoints' legacy key;
    // transformers reads it as partial_rotary_factor); q and k RMS-normed over the whole
    // projection (qk_norm_type per_layer); full attention on every layer (attn_type_list all 1:
    // MiniMax-Text-01's lightning attention layers are 0).
    // (An explicit partial_rotary_factor wins, as transformers reads rotary_dim only in its absence.)
    const bool factor_given = j.contains("partial_rotary_factor") || (rs && rs->contains("partial_rotary_factor"));
    read_partial_rotary(c, j, rs, cfg_path, 1.0);
    if (!factor_given && j.contains("rotary_dim") && !j["rotary_dim"].is_null()) c.rot_dim = json_int(j, "rotary_dim", cfg_path);
    FP_CHECK(c.rot_dim > 0 && c.rot_dim <= c.head_dim && c.rot_dim % 2 == 0, cfg_path, ": rotary_dim ", c.rot_dim,
             " must be even and at most head_dim ", c.head_dim);
    FP_CHECK(json_bool(j, "use_qk_norm", cfg_path, true), cfg_path, ": use_qk_norm false is not supported for MiniMax-M2");
    const std::string qk = string_field(j, "qk_norm_type", cfg_path, "per_layer");
    FP_CHECK(qk == "per_layer", cfg_path, ": qk_norm_type '", qk, "' is not supported for MiniMax-M2 (per_layer)");
    c.qk_norm = c.qk_norm_full = true;
    if (auto it = j.find("attn_type_list"); it != j.end() && !it->is_null()) {
      FP_CHECK(it->is_array(), cfg_path, ": field 'attn_type_list' should be an array");
      for (auto& v : *it)
        FP_CHECK(v.is_number_integer() && v.get<int64_t>() == 1, cfg_path, ": attn_type_list holds ", short_json(v),
                 ": only full attention (1) is supported, not linear attention layers (0)");
    }
  }
  if (c.arch == "granite" || c.arch == "granitemoe") {
    // Granite 3.x: Llama with four multipliers (embeddings, sublayer outputs, attention scores,
    // logits divided); no biases here. GraniteMoe: the same, with Mixtral's experts.
    for (const char* k : {"attention_bias", "mlp_bias"})
      FP_CHECK(!json_bool(j, k, cfg_path, false), cfg_path, ": ", k, " (biases on Granite's projections) is not supported");
    c.embed_scale = static_cast<float>(json_num(j, "embedding_multiplier", cfg_path, 1.0));
    c.residual_scale = static_cast<float>(json_num(j, "residual_multiplier", cfg_path, 1.0));
    c.attn_scale = static_cast<float>(json_num(j, "attention_multiplier", cfg_path, 1.0));
    c.logit_scale = static_cast<float>(json_num(j, "logits_scaling", cfg_path, 1.0));
  }
  if (c.arch == "glm4") {
    // GLM-4-0414: a norm after the attention and after the MLP besides the two before them; the
    // first partial_rotary_factor of each head rotated in adjacent pairs; q/k/v biases
    // (attention_bias, true by default); gate and up fused in one matrix (split at load).
    read_partial_rotary(c, j, rs, cfg_path, 0.5);
    c.rope_style = RopeStyle::Adjacent;
    c.post_norms = true;
    c.qkv_bias = json_bool(j, "attention_bias", cfg_path, true);
  }
  if (rs) {
    if (rs->contains("rope_theta")) c.rope_theta = static_cast<float>(json_num(*rs, "rope_theta", cfg_path, c.rope_theta));
    std::string type = string_field(*rs, "rope_type", cfg_path, string_field(*rs, "type", cfg_path, "none"));
    if (c.rope_scaling.type == "longrope") {
      // read above (read_hf_longrope)
    } else if (type == "linear" || type == "llama3") {
      c.rope_scaling.type = type;
      c.rope_scaling.factor = static_cast<float>(json_num(*rs, "factor", cfg_path, 1.0));
      c.rope_scaling.low_freq_factor = static_cast<float>(json_num(*rs, "low_freq_factor", cfg_path, 1.0));
      c.rope_scaling.high_freq_factor = static_cast<float>(json_num(*rs, "high_freq_factor", cfg_path, 4.0));
      c.rope_scaling.original_context = json_int(*rs, "original_max_position_embeddings", cfg_path, 8192);
    } else if (type == "yarn" && (c.arch == "deepseek2" || c.arch == "qwen3moe" || c.arch == "gpt-oss" || c.arch == "llama" ||
                                  c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "olmo3")) {
      // transformers: cos/sin times attention_factor; DeepSeek's softmax scale times mscale(mscale_all_dim)^2.
      RopeScaling& y = c.rope_scaling;
      y.type = type;
      y.factor = static_cast<float>(json_num(*rs, "factor", cfg_path, 1.0));
      y.original_context = json_int(*rs, "original_max_position_embeddings", cfg_path, c.max_context);
      y.beta_fast = static_cast<float>(json_num(*rs, "beta_fast", cfg_path, 32.0));
      y.beta_slow = static_cast<float>(json_num(*rs, "beta_slow", cfg_path, 1.0));
      y.truncate = json_bool(*rs, "truncate", cfg_path, true);
      auto get_mscale = [&](double ms_) { return y.factor <= 1 ? 1.0 : 0.1 * ms_ * std::log(static_cast<double>(y.factor)) + 1.0; };
      const double ms = json_num(*rs, "mscale", cfg_path, 0.0), ms_all = json_num(*rs, "mscale_all_dim", cfg_path, 0.0);
      double af = json_num(*rs, "attention_factor", cfg_path, 0.0);
      if (af == 0.0) af = ms != 0.0 && ms_all != 0.0 ? get_mscale(ms) / get_mscale(ms_all) : get_mscale(1.0);
      y.attn_factor = static_cast<float>(af);
      y.log_multiplier = c.arch == "deepseek2" ? static_cast<float>(0.1 * ms_all) : 0.0f;
    } else if (type != "default" && type != "none") {
      fail(cfg_path, ": rope_scaling type '", type, "' is not supported for ", c.arch, " yet");
    }
  }

  auto set = std::shared_ptr<SafetensorsSet>(SafetensorsSet::open_dir(dir).release());
  m.owners.push_back(set);
  for (auto& f : set->files()) m.file_bytes += std::filesystem::file_size(f);
  // safetensors does not align tensor data (an odd-length F16 tensor shifts every one after it):
  // copy a misaligned tensor into an owned buffer so f16/f32 loads stay aligned.
  auto aligned = [&m](const SafetensorsTensor& t) -> const void* {
    const size_t align = static_cast<size_t>(std::min<int64_t>(dtype_info(t.type).block_bytes, 8));
    if (reinterpret_cast<uintptr_t>(t.data) % align == 0) return t.data;
    float* buf = m.own_f32(static_cast<size_t>(t.nbytes / 4 + 2));
    std::memcpy(buf, t.data, static_cast<size_t>(t.nbytes));
    m.notes.push_back("tensor '" + t.name + "' copied: its data is not aligned in " + t.file);
    return buf;
  };
  std::vector<std::pair<std::string, const SafetensorsTensor*>> scales;
  for (auto& [name, t] : set->all()) {
    // Gemma's and OLMo 2's post-sublayer norms have names of their own (canonical_from_hf_gemma).
    std::string cn = gemma || c.arch == "olmo2" || c.arch == "olmo3" || c.arch == "exaone4" ? canonical_from_hf_gemma(name)
                                                : canonical_from_hf(multimodal ? text_model_name(name) : name);
    if (cn.empty()) {
      m.notes.push_back("ignored tensor '" + name + "'");
      continue;
    }
    if (cn.ends_with("_scale_inv")) {
      scales.emplace_back(cn.substr(0, cn.size() - 10), t);
      continue;
    }
    FP_CHECK(!t->shape.empty() && t->shape.size() <= 4, t->file, ": tensor '", name, "' has ", t->shape.size(), " dimensions");
    m.tensors[cn] = Tensor::view(aligned(*t), t->type, t->shape.data(), static_cast<int>(t->shape.size()));
  }
  // FP8 block scales (weight_scale_inv) attach to their weight.
  for (auto& [wname, st] : scales) {
    auto it = m.tensors.find(wname);
    FP_CHECK(it != m.tensors.end(), st->file, ": scale tensor for '", wname, "' has no weight");
    Tensor& w = it->second;
    FP_CHECK(st->type == DType::F32 && st->shape.size() == 2, st->file, ": '", wname, "_scale_inv' should be a 2-D F32 tensor");
    int64_t sr = (w.dim(0) + 127) / 128, sc = (w.dim(1) + 127) / 128;
    FP_CHECK(st->shape[0] == sr && st->shape[1] == sc, st->file, ": '", wname, "_scale_inv' has shape [", st->shape[0], ", ",
             st->shape[1], "], expected [", sr, ", ", sc, "] for 128x128 blocks");
    w.block_scale = static_cast<const float*>(aligned(*st));
  }
  // FP8 weights are only usable with their block scales (per-tensor FP8 is not supported).
  for (auto& [name, t] : m.tensors)
    FP_CHECK(t.dtype != DType::F8_E4M3 || t.block_scale, dir, ": FP8 weight '", name,
             "' has no weight_scale_inv (128x128 block scales); the checkpoint is incomplete");
  if (!m.find("output.weight")) c.tied_output = true;
  if (c.arch == "gpt-oss") split_gpt_oss_experts(m);
  if (c.arch == "granitemoe") split_granite_moe_experts(m);
  if (c.arch == "llama4") split_llama4_experts(m);
  if (c.arch == "ernie4_5-moe") {
    // ERNIE 4.5's selection bias is a [1, n_experts] matrix (one expert group): as the vector it is.
    for (int64_t l = 0; l < c.n_layers; ++l)
      if (auto it = m.tensors.find("blk." + std::to_string(l) + ".exp_probs_b.bias");
          it != m.tensors.end() && it->second.ndim == 2 && it->second.dim(0) == 1)
        it->second = Tensor::view(it->second.data, it->second.dtype, {it->second.dim(1)});
    c.moe.has_bias = m.find("blk." + std::to_string(c.moe.first_dense) + ".exp_probs_b.bias") != nullptr;
  }
  if (file_exists(dir + "/tokenizer.json")) m.tokenizer = Tokenizer::from_hf_json(dir + "/tokenizer.json");
  m.notes.push_back("safetensors: " + std::to_string(set->files().size()) + " file(s), " + std::to_string(set->all().size()) + " tensors");
}

}  // namespace

// LongRoPE (Phi-3.5, Phi-4-mini; Phi3Config also calls it "su", and "yarn" in old files): the
// short and long per-frequency divisors, and transformers' attention factor, sqrt(1 + ln(s) /
// ln(original)) with s = max_position_embeddings / original unless the file names a factor.
void read_hf_longrope(ModelConfig& c, const nlohmann::json& j, const nlohmann::json& rs, const std::string& cfg_path) {
  const std::string type = string_field(rs, "rope_type", cfg_path, string_field(rs, "type", cfg_path, "default"));
  if (type != "longrope" && type != "su" && type != "yarn") return;
  RopeScaling& r = c.rope_scaling;
  r.type = "longrope";
  auto factors = [&](const char* key, std::vector<float>& out) {
    auto it = rs.find(key);
    FP_CHECK(it != rs.end() && it->is_array(), cfg_path, ": rope_scaling (", type, ") needs the array '", key, "'");
    for (auto& v : *it) {
      FP_CHECK(v.is_number(), cfg_path, ": rope_scaling ", key, " holds ", short_json(v), ", not a number");
      out.push_back(v.get<float>());
    }
  };
  factors("short_factor", r.short_factor);
  factors("long_factor", r.long_factor);
  r.original_context = json_int(rs, "original_max_position_embeddings", cfg_path, json_int(j, "original_max_position_embeddings", cfg_path, 0));
  FP_CHECK(r.original_context > 0, cfg_path, ": LongRoPE needs original_max_position_embeddings (in rope_scaling or the config)");
  const double orig = static_cast<double>(r.original_context);
  const double s = json_num(rs, "factor", cfg_path, static_cast<double>(c.max_context) / orig);
  r.factor = static_cast<float>(s);
  r.attn_factor = static_cast<float>(json_num(rs, "attention_factor", cfg_path, s <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s) / std::log(orig))));
}

WeightMemory resolve_weight_memory(WeightMemory asked, uint64_t weight_bytes, int64_t available_bytes, Device device,
                                   bool several_ranks, std::string* why) {
  auto gib = [](double b) {  // GiB, or MiB below one
    std::ostringstream os;
    os << std::fixed << std::setprecision(2);
    if (b < double(1 << 30)) os << b / double(1 << 20) << " MiB";
    else os << b / double(1 << 30) << " GiB";
    return os.str();
  };
  const std::string size = gib(static_cast<double>(weight_bytes));
  if (asked == WeightMemory::Mapped) {
    *why = size + " mapped from the file (--mmap)";
    return asked;
  }
  if (asked == WeightMemory::Copied) {
    *why = size + " copied into huge-page memory (--no-mmap)";
    return asked;
  }
  const char* keep_mapped = nullptr;
  std::string detail;
  if (device != Device::CPU) {
    keep_mapped = "the model runs on ";
    detail = device_name(device);
  } else if (several_ranks) {
    keep_mapped = "several ranks: each touches only its slices of the mapping";
  } else if (available_bytes <= 0 || weight_bytes > static_cast<uint64_t>(available_bytes) / 2) {
    keep_mapped = "more than half of the available memory, ";
    detail = available_bytes > 0 ? gib(static_cast<double>(available_bytes)) : std::string("unknown");
  }
  if (keep_mapped) {
    *why = size + " mapped from the file (" + keep_mapped + detail + "; --no-mmap copies them)";
    return WeightMemory::Mapped;
  }
  *why = size + " copied into huge-page memory (" + gib(static_cast<double>(available_bytes)) +
         " available; decode streams them faster than from mapped 4 KiB pages; --mmap maps the file instead)";
  return WeightMemory::Copied;
}

namespace {
// Phi-3 / Phi-4 keep q, k, v in one matrix (attn_qkv) and gate, up in another (ffn_up of twice
// the FFN width, gate first), in safetensors and GGUF alike; GLM-4 its gate and up: each part
// becomes a tensor of its own, a view of its rows, so the model reads them as Llama's.
void split_fused_rows(ModelFile& m) {
  const ModelConfig& c = m.config;
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, ff = c.hidden_dim;
  auto rows = [](const Tensor& t, int64_t begin, int64_t len) {
    Tensor v = Tensor::view(t.row_ptr(begin), t.dtype, {len, t.dim(1)});
    return v;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    if (const Tensor* qkv = m.find(p + "attn_qkv.weight")) {
      FP_CHECK(qkv->ndim == 2 && qkv->dim(0) == q + 2 * kv && !qkv->block_scale, m.path, ": tensor '", p,
               "attn_qkv.weight' has shape ", qkv->shape_str(), ", expected [", q + 2 * kv, ", ", c.dim,
               "] (q, k and v rows from the model config)");
      const Tensor whole = *qkv;
      m.tensors[p + "attn_q.weight"] = rows(whole, 0, q);
      m.tensors[p + "attn_k.weight"] = rows(whole, q, kv);
      m.tensors[p + "attn_v.weight"] = rows(whole, q + kv, kv);
      m.tensors.erase(p + "attn_qkv.weight");
    }
    const Tensor* up = m.find(p + "ffn_up.weight");
    if (up && !m.find(p + "ffn_gate.weight")) {
      FP_CHECK(up->ndim == 2 && up->dim(0) == 2 * ff && !up->block_scale, m.path, ": tensor '", p, "ffn_up.weight' has shape ",
               up->shape_str(), ", expected [", 2 * ff, ", ", c.dim, "] (gate and up rows, fused)");
      const Tensor whole = *up;
      m.tensors[p + "ffn_gate.weight"] = rows(whole, 0, ff);
      m.tensors[p + "ffn_up.weight"] = rows(whole, ff, ff);
    }
  }
}
}  // namespace

std::unique_ptr<ModelFile> load_model_file(const std::string& path, const LoadOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<ModelFile>();
  m->path = path;
  if (is_directory(path)) {
    load_hf(*m, path);
  } else {
    FP_CHECK(file_exists(path), path, ": no such file or directory");
    auto mf = MappedFile::open(path);
    uint32_t magic = 0;
    if (mf->size() >= 4) std::memcpy(&magic, mf->data(), 4);
    if (magic == 0x46554747u) load_gguf(*m, path);
    else if (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0) load_llama2c(*m, path, opts);
    else if (std::filesystem::path(path).filename() == "config.json") load_hf(*m, std::filesystem::path(path).parent_path().string());
    else fail(path, ": unknown model format (expected a .gguf file, a llama2.c .bin checkpoint, or a Hugging Face directory)");
  }
  // LongRoPE: one factor set for every sequence, from the longest the model will serve, so the
  // cached keys all share one rotation (transformers switches sets once a sequence outgrows the
  // original context, leaving the keys cached before on the short set).
  if (RopeScaling& r = m->config.rope_scaling; r.type == "longrope") {
    const int64_t longest = opts.max_model_len > 0 ? std::min(opts.max_model_len, m->config.max_context) : m->config.max_context;
    r.use_long = longest > r.original_context;
    std::ostringstream note;
    note << "LongRoPE: the " << (r.use_long ? "long" : "short") << " factors, for sequences up to " << longest
         << " tokens (original context " << r.original_context;
    if (r.use_long) note << "; --max-model-len " << r.original_context << " selects the short ones";
    note << ")";
    m->notes.push_back(note.str());
    log_info(m->notes.back());
  }
  // Bound the dimensions a corrupt header can claim, so products of them (n_heads * head_dim, ...)
  // cannot overflow before the tensor shapes are checked against them.
  const ModelConfig& c = m->config;
  for (auto [field, v] : {std::pair<const char*, int64_t>{"vocab size", c.n_vocab}, {"hidden size", c.dim},
                          {"layer count", c.n_layers}, {"attention head count", c.n_heads}, {"kv head count", c.n_kv_heads},
                          {"head dim", c.head_dim}, {"value head dim", c.v_head_dim}, {"rope dimension count", c.rot_dim},
                          {"feed-forward length", c.hidden_dim}, {"context length", c.max_context},
                          {"expert count", c.moe.n_experts}, {"experts per token", c.moe.n_used}, {"expert feed-forward length", c.moe.ff},
                          {"shared expert count", c.moe.n_shared}, {"expert group count", c.moe.n_group},
                          {"q_lora_rank", c.mla.q_lora_rank}, {"kv_lora_rank", c.mla.kv_lora_rank}})
    FP_CHECK(v <= (int64_t{1} << (field == std::string("context length") ? 31 : 24)), path, ": ", field, " = ", v, " is implausibly large (corrupt header?)");
  m->config.validate(path);
  m->config.fold_residual_scale();  // Granite: into the embedding scale and the norms' eps (config.h)
  uint64_t total = 0;
  for (auto& [n, t] : m->tensors) total += static_cast<uint64_t>((t.nbytes() + 63) / 64 * 64);
  const ParallelSizes& ps = opts.parallel;
  std::string why;
  const WeightMemory where = resolve_weight_memory(opts.weights, total, available_memory_bytes(), opts.device,
                                                   std::max({ps.tp, ps.ep, ps.cp, ps.dp}) > 1, &why);
  if (opts.weights == WeightMemory::Auto) log_info("weights: ", why);
  m->notes.push_back("weights: " + why);
  if (where == WeightMemory::Copied) {
    const size_t huge = size_t{2} << 20, bytes = (total + huge - 1) / huge * huge;
    uint8_t* arena = static_cast<uint8_t*>(std::aligned_alloc(huge, std::max(bytes, huge)));
    FP_CHECK(arena, path, ": cannot allocate ", bytes, " bytes to copy the weights (--mmap maps the file instead)");
    madvise(arena, std::max(bytes, huge), MADV_HUGEPAGE);
    m->owners.push_back(std::shared_ptr<const void>(arena, [](const void* p) { std::free(const_cast<void*>(p)); }));
    Progress bar("copying " + std::filesystem::path(path).filename().string(), total);
    uint64_t off = 0;
    for (auto& [n, t] : m->tensors) {
      std::memcpy(arena + off, t.data, static_cast<size_t>(t.nbytes()));
      t.data = arena + off;
      off += static_cast<uint64_t>((t.nbytes() + 63) / 64 * 64);
      bar.update(off);
    }
    bar.finish();
    m->weights_writable = true;
  } else if (opts.prefault) {  // fault the weights in now, with a progress bar on a terminal
    uint64_t done = 0;
    Progress bar("loading " + std::filesystem::path(path).filename().string(), total);
    volatile uint8_t sink = 0;
    for (auto& [n, t] : m->tensors) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      for (int64_t off = 0; off < t.nbytes(); off += 4096) sink = static_cast<uint8_t>(sink + p[off]);
      done += static_cast<uint64_t>(t.nbytes());
      bar.update(done);
    }
    bar.finish();
  }
  // After the copy: the parts are views of the fused tensors' rows.
  if (c.arch == "phi3" || c.arch == "glm4") split_fused_rows(*m);
  m->repack_weights = opts.repack && opts.device == Device::CPU;  // the _X8 forms are the CPU kernels' layouts
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m->device = opts.device;
  m->device_graphs = opts.device_graphs;
  m->parallel = opts.parallel;
  m->micro_batch_overlap = opts.micro_batch_overlap;
  m->mtp = opts.mtp;
  return m;
}

}  // namespace fp
