// model/lora.cpp — reading LoRA adapters (PEFT directories, llama.cpp GGUFs) into the base
// model's layout, and LoraSet's per-row application (one lora op per run of an adapter's rows
// and group of projections that share their input).
#include "model/lora.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/model.h"
#include "model/model_file.h"
#include "model/tensor_names.h"
#include "tokenizer/regex.h"

namespace fp {

const char* lora_target_name(LoraTarget t) {
  static const char* names[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(t)];
}

namespace {

// A module's parts: the targets its B rows feed, one after another (fused modules have several).
struct ModuleParts {
  int64_t layer = -1;
  std::vector<LoraTarget> targets;
};

// "model.layers.3.self_attn.q_proj" (after PEFT's "base_model.model." prefix) -> layer 3, Q; the
// multimodal checkpoints' "language_model." prefixes as the base loader strips them.
ModuleParts module_parts(const std::string& module) {
  const std::string m = text_model_name(module + ".weight");
  const std::string prefix = "model.layers.";
  ModuleParts out;
  if (m.rfind(prefix, 0) != 0) return out;
  const size_t dot = m.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return out;
  const std::string layer = m.substr(prefix.size(), dot - prefix.size());
  if (layer.find_first_not_of("0123456789") != std::string::npos || layer.size() > 6) return out;
  const std::string rest = m.substr(dot + 1, m.size() - dot - 1 - std::string(".weight").size());
  using T = LoraTarget;
  static const std::map<std::string, std::vector<LoraTarget>> parts = {
      {"self_attn.q_proj", {T::Q}},          {"self_attn.k_proj", {T::K}},       {"self_attn.v_proj", {T::V}},
      {"self_attn.o_proj", {T::O}},          {"self_attn.qkv_proj", {T::Q, T::K, T::V}},
      {"mlp.gate_proj", {T::Gate}},          {"mlp.up_proj", {T::Up}},           {"mlp.down_proj", {T::Down}},
      {"mlp.gate_up_proj", {T::Gate, T::Up}}};
  auto it = parts.find(rest);
  if (it == parts.end()) return out;
  out.layer = std::stoll(layer);
  out.targets = it->second;
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> lora_target_dims(const ModelConfig& c, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q: return {c.dim, c.n_heads * c.head_dim};
    case LoraTarget::K: return {c.dim, c.n_kv_heads * c.head_dim};
    case LoraTarget::V: return {c.dim, c.n_kv_heads * c.v_head_dim};
    case LoraTarget::O: return {c.n_heads * c.v_head_dim, c.dim};
    case LoraTarget::Gate:
    case LoraTarget::Up: return {c.dim, c.hidden_dim};
    case LoraTarget::Down: return {c.hidden_dim, c.dim};
  }
  return {0, 0};
}

void check_lora_fits(const LoraAdapterWeights& ad, const ModelConfig& c, const std::string& model_path) {
  for (const LoraMatrices& m : ad.matrices) {
    const auto [in, out] = lora_target_dims(c, m.target);
    FP_CHECK(m.layer >= 0 && m.layer < c.n_layers && m.in == in && m.out == out, "LoRA adapter '", ad.name, "' (", ad.path,
             ") was read for another model: layer ", m.layer, "'s ", lora_target_name(m.target), " is ", m.out, " x ", m.in,
             ", in ", model_path, " ", out, " x ", in, " of ", c.n_layers, " layers");
  }
}

const nlohmann::ordered_json* lora_pattern_value(const nlohmann::ordered_json& patterns, const std::string& module) {
  if (!patterns.is_object()) return nullptr;
  for (auto it = patterns.begin(); it != patterns.end(); ++it) {
    const std::string& key = it.key();
    bool match = module == key || module.ends_with("." + key);
    if (!match) {
      try {  // the whole name, as Python's re.match with $ (the tokenizer's backtracking engine)
        const Regex re("(.*\\.)?(" + key + ")$");
        const std::vector<uint32_t> cps(module.begin(), module.end());  // module names are ASCII
        match = re.match_at(cps.data(), 0, cps.size(), 0) == static_cast<int64_t>(cps.size());
      } catch (const Error&) {  // not a pattern the engine reads: matches nothing
      }
    }
    if (match) return &it.value();
  }
  return nullptr;
}

bool lora_module_shape(const ModelConfig& c, const std::string& module, int64_t* in, int64_t* out) {
  const ModuleParts parts = module_parts(module);
  if (parts.layer < 0) return false;
  *in = lora_target_dims(c, parts.targets[0]).first;
  *out = 0;
  for (LoraTarget t : parts.targets) *out += lora_target_dims(c, t).second;
  return true;
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Whether the base's q/k rows are in that order (a GGUF of such an architecture).
bool gguf_permuted_qk(const ModelFile& base) { return base.format == "gguf" && gguf_permutes_qk(base.config.arch); }

// One matrix of an adapter as the file holds it: dtype, bytes, name, row-major shape.
struct RawMatrix {
  DType type = DType::F32;
  const void* data = nullptr;
  uint64_t bytes = 0;
  std::string name;
  std::vector<int64_t> shape;
  explicit RawMatrix(const SafetensorsTensor& t) : type(t.type), data(t.data), bytes(t.nbytes), name(t.name), shape(t.shape) {}
  explicit RawMatrix(const GgufTensorInfo& t)  // GGUF's ne is innermost first
      : type(t.type), data(t.data), bytes(t.nbytes), name(t.name), shape(t.ne.rbegin(), t.ne.rend()) {}
  std::vector<float> f32(const std::string& file) const;
};

// One adapted module as a file holds it, before conversion: A [rank, in] and B [out, rank]
// and the scale its update takes.
struct RawModule {
  std::string module, file;  // for errors: the module's name and the file holding it
  ModuleParts parts;
  RawMatrix a, b;
  double alpha = 0;     // the update is alpha / rank (or / sqrt(rank)) times B A
  bool rslora = false;
  bool alpha_is_scale = false;  // llama.cpp's adapters without alpha: the scale is 1
  bool permuted = false;        // q/k rows already in llama.cpp's adjacent-pair order
};

// An adapter file's modules, and the open file their bytes lie in.
struct RawAdapter {
  std::shared_ptr<const void> file;
  std::vector<RawModule> modules;
};

std::vector<float> RawMatrix::f32(const std::string& file) const {
  // llama.cpp's converter also writes Q8_0 adapters (--outtype q8_0): GGUF block types are read
  // through the same dequantization as weights.
  const bool gguf_block = dtype_info(type).quantized;
  FP_CHECK(type == DType::F32 || type == DType::F16 || type == DType::BF16 || gguf_block, file, ": tensor '", name, "' is ",
           dtype_name(type), " (LoRA matrices must be F32, F16, BF16 or a GGUF block type)");
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  FP_CHECK(!gguf_block || (!shape.empty() && shape.back() % dtype_info(type).block_elems == 0), file, ": tensor '", name,
           "' is ", dtype_name(type), " with rows of ", shape.empty() ? 0 : shape.back(), " values, not whole blocks of ",
           dtype_info(type).block_elems);
  FP_CHECK(static_cast<uint64_t>(row_bytes(type, n)) == bytes, file, ": tensor '", name, "' holds ", bytes,
           " bytes for its shape");
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(type, data, out.data(), n);
  return out;
}

// The modules of a PEFT adapter directory.
RawAdapter read_peft(const std::string& path, const std::string& dir) {
  const std::string cfg_path = dir + "/adapter_config.json";
  FP_CHECK(file_exists(cfg_path), "LoRA adapter '", path, "': no adapter_config.json in it");
  std::ifstream in(cfg_path);
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(in, nullptr, false);  // the patterns' order counts
  FP_CHECK(!j.is_discarded() && j.is_object(), cfg_path, ": not a JSON object");
  auto str = [&](const char* key, const std::string& fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    FP_CHECK(j[key].is_string(), cfg_path, ": '", key, "' must be a string, got ", j[key].dump());
    return j[key].get<std::string>();
  };
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    FP_CHECK(j[key].is_boolean(), cfg_path, ": '", key, "' must be true or false, got ", j[key].dump());
    return j[key].get<bool>();
  };
  const std::string type = str("peft_type", "LORA");
  FP_CHECK(type == "LORA", cfg_path, ": peft_type '", type, "' is not supported (LORA only)");
  FP_CHECK(!flag("use_dora"), cfg_path, ": use_dora: DoRA adapters are not supported (plain LoRA only)");
  FP_CHECK(!flag("fan_in_fan_out"), cfg_path, ": fan_in_fan_out: transposed (Conv1D) adapters are not supported");
  FP_CHECK(!flag("lora_bias"), cfg_path, ": lora_bias: adapters with a trained bias are not supported");
  const std::string bias = str("bias", "none");
  FP_CHECK(bias == "none", cfg_path, ": bias '", bias, "': adapters that train the base biases are not supported");
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
    FP_CHECK(j["modules_to_save"].empty(), cfg_path, ": modules_to_save ", j["modules_to_save"].dump(),
             ": adapters that replace whole modules are not supported");
  FP_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number() && j["lora_alpha"].get<double>() > 0, cfg_path,
           ": 'lora_alpha' must be a positive number", j.contains("lora_alpha") ? ", got " + j["lora_alpha"].dump() : "");
  const double alpha = j["lora_alpha"].get<double>();
  const bool rslora = flag("use_rslora");
  const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  const nlohmann::ordered_json& rank_pattern = j.contains("rank_pattern") && j["rank_pattern"].is_object() ? j["rank_pattern"] : empty;
  const nlohmann::ordered_json& alpha_pattern = j.contains("alpha_pattern") && j["alpha_pattern"].is_object() ? j["alpha_pattern"] : empty;

  const std::string weights = dir + "/adapter_model.safetensors";
  FP_CHECK(file_exists(weights), "LoRA adapter '", path, "': no adapter_model.safetensors",
           file_exists(dir + "/adapter_model.bin") ? " (adapter_model.bin is a pickle, which is not read here: save it with safe_serialization)" : "");
  std::shared_ptr<SafetensorsFile> st = SafetensorsFile::open(weights);
  RawAdapter out;
  out.file = st;

  // Every tensor must be a module's lora_A or lora_B.
  const std::string prefix = "base_model.model.";
  std::map<std::string, std::pair<const SafetensorsTensor*, const SafetensorsTensor*>> modules;
  for (const auto& [tname, t] : st->tensors()) {
    FP_CHECK(tname.find("lora_embedding") == std::string::npos, weights, ": tensor '", tname,
             "': adapters on the embeddings are not supported");
    FP_CHECK(tname.find("lora_magnitude_vector") == std::string::npos, weights, ": tensor '", tname, "': DoRA is not supported");
    FP_CHECK(tname.rfind(prefix, 0) == 0, weights, ": tensor '", tname, "' does not start with '", prefix, "' (PEFT's names)");
    const bool is_a = tname.ends_with(".lora_A.weight"), is_b = tname.ends_with(".lora_B.weight");
    FP_CHECK(is_a || is_b, weights, ": tensor '", tname, "' is neither a lora_A nor a lora_B weight");
    const std::string module = tname.substr(prefix.size(), tname.size() - prefix.size() - std::string(".lora_A.weight").size());
    (is_a ? modules[module].first : modules[module].second) = &t;
  }
  FP_CHECK(!modules.empty(), weights, ": no LoRA matrices in it");
  for (const auto& [module, ab] : modules) {
    const auto [a, b] = ab;
    FP_CHECK(a && b, weights, ": module '", module, "' has a lora_", a ? "A" : "B", " weight but no lora_", a ? "B" : "A");
    RawModule r{module, weights, module_parts(module), RawMatrix(*a), RawMatrix(*b)};
    FP_CHECK(r.parts.layer >= 0, weights, ": module '", module,
             "' is not one this engine adapts (the layers' q/k/v/o and gate/up/down projections)");
    const int64_t rank = a->shape.empty() ? 0 : a->shape[0];
    if (const nlohmann::ordered_json* rp = lora_pattern_value(rank_pattern, module))
      FP_CHECK(rp->is_number_integer() && rp->get<int64_t>() == rank, cfg_path, ": rank_pattern gives '", module, "' rank ",
               rp->dump(), " but its matrices have rank ", rank);
    r.alpha = alpha;
    if (const nlohmann::ordered_json* v = lora_pattern_value(alpha_pattern, module)) {
      FP_CHECK(v->is_number(), cfg_path, ": alpha_pattern's value for '", module, "' must be a number, got ", v->dump());
      r.alpha = v->get<double>();
    }
    r.rslora = rslora;
    out.modules.push_back(std::move(r));
  }
  return out;
}

// The modules of a llama.cpp GGUF adapter (convert_lora_to_gguf.py's: general.type "adapter",
// adapter.type "lora", adapter.lora.alpha, tensors "<base tensor>.lora_a" ne [in, rank] and
// ".lora_b" ne [rank, out]: PyTorch's A and B as they are).
RawAdapter read_gguf_adapter(const std::string& path, const ModelFile& base) {
  std::shared_ptr<GgufFile> g = GgufFile::open(path);
  RawAdapter out;
  out.file = g;
  const std::string type = g->get_string("general.type", "");
  FP_CHECK(type == "adapter", path, ": general.type is '", type, "', not 'adapter' (a llama.cpp LoRA adapter)");
  const std::string kind = g->get_string("adapter.type", "");
  FP_CHECK(kind == "lora", path, ": adapter.type is '", kind, "', not 'lora'");
  const std::string arch = g->get_string("general.architecture", "");
  const std::string base_arch = base.config.arch == "mixtral" ? "llama" : base.config.arch;
  FP_CHECK(arch == base_arch, path, ": an adapter for architecture '", arch, "', the model is '", base_arch, "'");
  const double alpha = g->get_float("adapter.lora.alpha", 0.0);
  std::map<std::string, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> tensors;
  for (const GgufTensorInfo& t : g->tensors()) {
    const bool is_a = t.name.ends_with(".lora_a"), is_b = t.name.ends_with(".lora_b");
    FP_CHECK(is_a || is_b, path, ": tensor '", t.name, "' is neither a .lora_a nor a .lora_b");
    (is_a ? tensors[t.name.substr(0, t.name.size() - 7)].first : tensors[t.name.substr(0, t.name.size() - 7)].second) = &t;
  }
  FP_CHECK(!tensors.empty(), path, ": no LoRA matrices in it");
  const ModelConfig& c = base.config;
  for (const auto& [tname, ab] : tensors) {
    const auto [a, b] = ab;
    FP_CHECK(a && b, path, ": '", tname, "' has a lora_", a ? "a" : "b", " but no lora_", a ? "b" : "a");
    RawModule r{tname, path, {}, RawMatrix(*a), RawMatrix(*b)};
    // blk.N.<tensor>.weight
    static const std::map<std::string, std::vector<LoraTarget>> parts = {
        {"attn_q.weight", {LoraTarget::Q}},       {"attn_k.weight", {LoraTarget::K}},
        {"attn_v.weight", {LoraTarget::V}},       {"attn_output.weight", {LoraTarget::O}},
        {"attn_qkv.weight", {LoraTarget::Q, LoraTarget::K, LoraTarget::V}},
        {"ffn_gate.weight", {LoraTarget::Gate}},  {"ffn_up.weight", {LoraTarget::Up}},
        {"ffn_down.weight", {LoraTarget::Down}}};
    const size_t dot = tname.find('.', 4);
    if (tname.rfind("blk.", 0) == 0 && dot != std::string::npos && dot > 4 &&
        tname.substr(4, dot - 4).find_first_not_of("0123456789") == std::string::npos && dot - 4 <= 6) {
      auto it = parts.find(tname.substr(dot + 1));
      if (it != parts.end()) {
        r.parts.layer = std::stoll(tname.substr(4, dot - 4));
        r.parts.targets = it->second;
        // Phi-3's and GLM-4's fused gate/up is one ffn_up of twice the width.
        if (it->first == "ffn_up.weight" && b->ne.size() == 2 && b->ne[1] == 2 * c.hidden_dim)
          r.parts.targets = {LoraTarget::Gate, LoraTarget::Up};
      }
    }
    FP_CHECK(r.parts.layer >= 0, path, ": tensor '", tname,
             "' is not one this engine adapts (the layers' q/k/v/o and gate/up/down projections)");
    r.alpha = alpha;
    r.alpha_is_scale = alpha == 0;  // as llama.cpp: no alpha, scale 1
    r.permuted = gguf_permutes_qk(arch);
    out.modules.push_back(std::move(r));
  }
  return out;
}

}  // namespace

LoraAdapterWeights read_lora_adapter(const std::string& path, const std::string& name, const ModelFile& base) {
  RawAdapter raw;
  if (path.ends_with(".gguf") && file_exists(path)) {
    raw = read_gguf_adapter(path, base);
  } else {
    std::string dir = path;
    if (dir.ends_with("adapter_config.json")) dir = dir.substr(0, dir.size() - std::string("adapter_config.json").size());
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    FP_CHECK(is_directory(dir), "LoRA adapter '", path,
             "': not a directory (a PEFT adapter: adapter_config.json + adapter_model.safetensors) nor a llama.cpp .gguf adapter");
    raw = read_peft(path, dir);
  }
  const ModelConfig& c = base.config;
  const bool base_permuted = gguf_permuted_qk(base);
  LoraAdapterWeights out;
  out.name = name;
  out.path = path;
  std::map<std::pair<int64_t, int>, bool> seen;
  for (const RawModule& r : raw.modules) {
    const std::string& module = r.module;
    FP_CHECK(r.parts.layer < c.n_layers, r.file, ": module '", module, "' is in layer ", r.parts.layer, " but the model has ",
             c.n_layers, " layers");
    // Widths: the parts' outputs one after another (fused modules).
    int64_t in_dim = lora_target_dims(c, r.parts.targets[0]).first, out_dim = 0;
    for (LoraTarget t : r.parts.targets) out_dim += lora_target_dims(c, t).second;
    const auto& as = r.a.shape;
    const auto& bs = r.b.shape;
    FP_CHECK(as.size() == 2 && as[1] == in_dim && as[0] > 0, r.file, ": '", r.a.name, "' has shape ", shape_text(as),
             ", expected [rank, ", in_dim, "] for this model");
    const int64_t rank = as[0];
    FP_CHECK(bs.size() == 2 && bs[0] == out_dim && bs[1] == rank, r.file, ": '", r.b.name, "' has shape ", shape_text(bs),
             ", expected [", out_dim, ", ", rank, "] for this model");
    const double divisor = r.rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank);
    const float scale = r.alpha_is_scale ? 1.0f : static_cast<float>(r.alpha / divisor);
    const std::vector<float> A = r.a.f32(r.file), B = r.b.f32(r.file);
    // Kept in the file's dtype where both matrices share a 16-bit one (their values exactly);
    // F32 otherwise (block types dequantized: their values exactly too).
    const bool half = r.a.type == DType::F16 || r.a.type == DType::BF16;
    const DType dtype = r.a.type == r.b.type && half ? r.a.type : DType::F32;
    int64_t row = 0;
    for (LoraTarget t : r.parts.targets) {
      const auto key = std::make_pair(r.parts.layer, static_cast<int>(t));
      FP_CHECK(!seen[key], r.file, ": layer ", r.parts.layer, "'s ", lora_target_name(t), " is adapted twice");
      seen[key] = true;
      LoraMatrices m;
      m.layer = r.parts.layer;
      m.target = t;
      m.rank = rank;
      m.in = in_dim;
      m.out = lora_target_dims(c, t).second;
      m.a = A;
      m.b = lora_rows(B, rank, row, m.out);
      m.scale = scale;
      m.dtype = dtype;
      row += m.out;
      // B's q/k rows into the base's order: adjacent pairs for a GGUF base whose converter
      // permuted them, the checkpoint's halves otherwise.
      if ((t == LoraTarget::Q || t == LoraTarget::K) && base_permuted != r.permuted) {
        const int64_t heads = t == LoraTarget::Q ? c.n_heads : c.n_kv_heads;
        m.b = rope_pair_rows(m.b, m.out, rank, heads, base_permuted);
      }
      out.max_rank = std::max(out.max_rank, rank);
      out.matrices.push_back(std::move(m));
    }
  }
  return out;
}

std::vector<float> rope_pair_rows(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t heads, bool to_adjacent) {
  std::vector<float> out(m.size());
  const int64_t hd = rows / heads;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t halves = h * hd + half * (hd / 2) + i, adjacent = h * hd + 2 * i + half;
        const int64_t from = to_adjacent ? halves : adjacent, to = to_adjacent ? adjacent : halves;
        std::copy_n(m.begin() + from * cols, cols, out.begin() + to * cols);
      }
  return out;
}

bool gguf_permutes_qk(const std::string& arch) {
  return arch == "llama" || arch == "mixtral" || arch == "granite" || arch == "granitemoe" || arch == "smollm3";
}

LoraMatrices lora_share(LoraMatrices m, const LoraShare& share) {
  auto keep_rows = [&m](int64_t begin, int64_t len) {  // of B: this rank's outputs
    if (len < 0) return;
    m.b = lora_rows(m.b, m.rank, begin, len);
    m.out = len;
  };
  auto keep_columns = [&m](int64_t begin, int64_t len) {  // of A: this rank's inputs
    if (len < 0) return;
    m.a = lora_columns(m.a, m.in, begin, len);
    m.in = len;
  };
  switch (m.target) {
    case LoraTarget::Q: keep_rows(share.q_begin, share.q_len); break;
    case LoraTarget::K:
    case LoraTarget::V: keep_rows(share.kv_begin, share.kv_len); break;
    case LoraTarget::Gate:
    case LoraTarget::Up: keep_rows(share.ffn_begin, share.ffn_len); break;
    case LoraTarget::O: keep_columns(share.o_begin, share.o_len); break;
    case LoraTarget::Down: keep_columns(share.ffn_begin, share.ffn_len); break;
  }
  return m;
}

std::vector<float> lora_rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t len) {
  return std::vector<float>(m.begin() + begin * cols, m.begin() + (begin + len) * cols);
}

std::vector<float> lora_columns(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t len) {
  const int64_t rows = static_cast<int64_t>(m.size()) / cols;
  std::vector<float> out(static_cast<size_t>(rows * len));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(m.begin() + r * cols + begin, len, out.begin() + r * len);
  return out;
}

// ---- LoraSet ----

struct LoraSet::Adapter {
  std::string name;
  std::vector<LoraMatrices> matrices;                  // shapes, scales and dtypes (the values moved out)
  std::vector<std::vector<uint8_t>> a, bt;             // A [rank, in] and B^T [rank, out] in the matrix's dtype
  std::vector<Tensor> a_view, bt_view;                 // views of them (the lora op's layout)
  std::vector<std::array<int, kLoraTargets>> at;       // per layer and target: index into matrices, -1 none
};

LoraSet::LoraSet() = default;
LoraSet::~LoraSet() = default;

int32_t LoraSet::add(const std::string& name, std::vector<LoraMatrices> matrices, int64_t n_layers) {
  auto ad = std::make_unique<Adapter>();
  ad->name = name;
  ad->matrices = std::move(matrices);
  std::array<int, kLoraTargets> none;
  none.fill(-1);
  ad->at.assign(static_cast<size_t>(n_layers), none);
  for (size_t i = 0; i < ad->matrices.size(); ++i) {
    LoraMatrices& m = ad->matrices[i];
    FP_CHECK(m.layer >= 0 && m.layer < n_layers, "LoRA adapter '", name, "': layer ", m.layer, " is not in the model");
    FP_CHECK(static_cast<int64_t>(m.a.size()) == m.rank * m.in && static_cast<int64_t>(m.b.size()) == m.out * m.rank,
             "LoRA adapter '", name, "': layer ", m.layer, "'s ", lora_target_name(m.target), " matrices do not match their sizes");
    FP_CHECK(m.dtype == DType::F32 || m.dtype == DType::F16 || m.dtype == DType::BF16, "LoRA adapter '", name, "': layer ",
             m.layer, "'s ", lora_target_name(m.target), " matrices are ", dtype_name(m.dtype), " (F32, F16 or BF16)");
    ad->at[static_cast<size_t>(m.layer)][static_cast<size_t>(m.target)] = static_cast<int>(i);
    std::vector<float> t(m.b.size());
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t j = 0; j < m.rank; ++j) t[static_cast<size_t>(j * m.out + o)] = m.b[static_cast<size_t>(o * m.rank + j)];
    ad->a.push_back(quantize_to_bytes(m.dtype, m.a.data(), static_cast<int64_t>(m.a.size())));
    ad->bt.push_back(quantize_to_bytes(m.dtype, t.data(), static_cast<int64_t>(t.size())));
    m.a = {};
    m.b = {};
  }
  for (size_t i = 0; i < ad->matrices.size(); ++i) {
    const LoraMatrices& m = ad->matrices[i];
    ad->a_view.push_back(Tensor::view(ad->a[i].data(), m.dtype, {m.rank, m.in}));
    ad->bt_view.push_back(Tensor::view(ad->bt[i].data(), m.dtype, {m.rank, m.out}));
  }
  adapters_.push_back(std::move(ad));
  return size();
}

void LoraSet::remove(int32_t id) {
  FP_CHECK(id >= 1 && id <= size() && adapters_[static_cast<size_t>(id - 1)], "LoRA adapter ", id, " is not loaded");
  adapters_[static_cast<size_t>(id - 1)].reset();
}

bool LoraSet::begin(const ForwardBatch& b) {
  runs_.clear();
  if (b.seq_lora.empty()) return false;
  FP_CHECK(static_cast<int64_t>(b.seq_lora.size()) == b.n_seqs(), "a forward batch has ", b.seq_lora.size(),
           " LoRA ids for ", b.n_seqs(), " sequences");
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    const int32_t id = b.seq_lora[static_cast<size_t>(s)];
    FP_CHECK(id >= 0 && id <= size() && (id == 0 || adapters_[static_cast<size_t>(id - 1)]), "sequence ", s,
             " of a batch asks for LoRA adapter ", id, ", which is not loaded");
    const int64_t row0 = b.seq_indptr[static_cast<size_t>(s)], rows = b.seq_indptr[static_cast<size_t>(s) + 1] - row0;
    if (id == 0 || rows == 0) continue;
    if (!runs_.empty() && runs_.back().adapter == id && runs_.back().row0 + runs_.back().rows == row0) runs_.back().rows += rows;
    else runs_.push_back({id, row0, rows});
  }
  return !runs_.empty();
}

void LoraSet::apply(int64_t layer, std::initializer_list<std::pair<LoraTarget, float*>> outs, int64_t row0, int64_t n,
                    const float* in) {
  const int64_t end = n < 0 ? INT64_MAX : row0 + n;
  for (const Run& run : runs_) {
    const int64_t lo = std::max(run.row0, row0), hi = std::min(run.row0 + run.rows, end);
    if (lo >= hi) continue;
    const Adapter& ad = *adapters_[static_cast<size_t>(run.adapter - 1)];
    if (layer >= static_cast<int64_t>(ad.at.size())) continue;  // a draft layer after the model's
    LoraArgs args;
    for (const auto& [t, out] : outs) {
      const int i = ad.at[static_cast<size_t>(layer)][static_cast<size_t>(t)];
      if (i < 0) continue;
      const LoraMatrices& m = ad.matrices[static_cast<size_t>(i)];
      args.parts[args.n_parts++] = {&ad.a_view[static_cast<size_t>(i)], &ad.bt_view[static_cast<size_t>(i)],
                                    out + (lo - row0) * m.out, m.scale};
      args.x = in + (lo - row0) * m.in;
    }
    if (args.n_parts == 0) continue;
    args.n = hi - lo;
    low_.resize(static_cast<size_t>(args.n * args.low_width()));
    args.low = low_.data();
    dispatch(args);
  }
}

}  // namespace fp
