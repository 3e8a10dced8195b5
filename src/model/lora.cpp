// model/lora.cpp — reading PEFT LoRA adapters into the base model's layout, and LoraSet's
// per-row application (two thin matmuls and an add per adapter run, through the op registry).
#include "model/lora.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/paths.h"
#include "formats/safetensors.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/model.h"
#include "model/model_file.h"
#include "model/tensor_names.h"

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

// A target's input and output widths in the base model (the whole model, every rank's share).
std::pair<int64_t, int64_t> target_dims(const ModelConfig& c, LoraTarget t) {
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

}  // namespace

const nlohmann::json* lora_pattern_value(const nlohmann::json& patterns, const std::string& module) {
  if (!patterns.is_object()) return nullptr;
  const nlohmann::json* best = nullptr;
  size_t best_len = 0;
  for (auto it = patterns.begin(); it != patterns.end(); ++it) {
    const std::string& key = it.key();
    bool match = module == key || module.ends_with("." + key);
    if (!match) {
      try {
        match = std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"));
      } catch (const std::regex_error&) {
      }
    }
    if (match && key.size() >= best_len) {
      best = &it.value();
      best_len = key.size();
    }
  }
  return best;
}

bool lora_module_shape(const ModelConfig& c, const std::string& module, int64_t* in, int64_t* out) {
  const ModuleParts parts = module_parts(module);
  if (parts.layer < 0) return false;
  *in = target_dims(c, parts.targets[0]).first;
  *out = 0;
  for (LoraTarget t : parts.targets) *out += target_dims(c, t).second;
  return true;
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<float> to_f32(const SafetensorsTensor& t, const std::string& file) {
  FP_CHECK(t.type == DType::F32 || t.type == DType::F16 || t.type == DType::BF16, file, ": tensor '", t.name, "' is ",
           dtype_name(t.type), " (LoRA matrices must be F32, F16 or BF16)");
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  FP_CHECK(static_cast<uint64_t>(row_bytes(t.type, n)) == t.nbytes, file, ": tensor '", t.name, "' holds ", t.nbytes,
           " bytes for its shape");
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

// llama.cpp's converter reorders each head's q/k rows from NeoX halves to adjacent pairs; an
// adapter on such a GGUF's base needs its B rows reordered the same way.
std::vector<float> permute_heads(const std::vector<float>& b, int64_t rows, int64_t cols, int64_t heads) {
  std::vector<float> out(b.size());
  const int64_t hd = rows / heads;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t src = h * hd + half * (hd / 2) + i, dst = h * hd + 2 * i + half;
        std::copy_n(b.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

bool gguf_permuted_qk(const ModelFile& base) {
  const std::string& a = base.config.arch;
  return base.format == "gguf" && (a == "llama" || a == "mixtral" || a == "granite" || a == "smollm3");
}

}  // namespace

LoraAdapterWeights read_lora_adapter(const std::string& path, const std::string& name, const ModelFile& base) {
  std::string dir = path;
  if (dir.ends_with("adapter_config.json")) dir = dir.substr(0, dir.size() - std::string("adapter_config.json").size());
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  FP_CHECK(is_directory(dir), "LoRA adapter '", path, "': not a directory (a PEFT adapter: adapter_config.json + adapter_model.safetensors)");
  const std::string cfg_path = dir + "/adapter_config.json";
  FP_CHECK(file_exists(cfg_path), "LoRA adapter '", path, "': no adapter_config.json in it");
  std::ifstream in(cfg_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
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
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& rank_pattern = j.contains("rank_pattern") && j["rank_pattern"].is_object() ? j["rank_pattern"] : empty;
  const nlohmann::json& alpha_pattern = j.contains("alpha_pattern") && j["alpha_pattern"].is_object() ? j["alpha_pattern"] : empty;

  const std::string weights = dir + "/adapter_model.safetensors";
  FP_CHECK(file_exists(weights), "LoRA adapter '", path, "': no adapter_model.safetensors",
           file_exists(dir + "/adapter_model.bin") ? " (adapter_model.bin is a pickle, which is not read here: save it with safe_serialization)" : "");
  auto st = SafetensorsFile::open(weights);

  // Every tensor must be a module's lora_A or lora_B.
  const std::string prefix = "base_model.model.";
  struct Pair {
    const SafetensorsTensor *a = nullptr, *b = nullptr;
  };
  std::map<std::string, Pair> modules;
  for (const auto& [tname, t] : st->tensors()) {
    FP_CHECK(tname.find("lora_embedding") == std::string::npos, weights, ": tensor '", tname,
             "': adapters on the embeddings are not supported");
    FP_CHECK(tname.find("lora_magnitude_vector") == std::string::npos, weights, ": tensor '", tname, "': DoRA is not supported");
    FP_CHECK(tname.rfind(prefix, 0) == 0, weights, ": tensor '", tname, "' does not start with '", prefix, "' (PEFT's names)");
    const bool is_a = tname.ends_with(".lora_A.weight"), is_b = tname.ends_with(".lora_B.weight");
    FP_CHECK(is_a || is_b, weights, ": tensor '", tname, "' is neither a lora_A nor a lora_B weight");
    const std::string module = tname.substr(prefix.size(), tname.size() - prefix.size() - std::string(".lora_A.weight").size());
    (is_a ? modules[module].a : modules[module].b) = &t;
  }
  FP_CHECK(!modules.empty(), weights, ": no LoRA matrices in it");

  const ModelConfig& c = base.config;
  LoraAdapterWeights out;
  out.name = name;
  out.path = path;
  std::map<std::pair<int64_t, int>, bool> seen;
  for (const auto& [module, p] : modules) {
    FP_CHECK(p.a && p.b, weights, ": module '", module, "' has a lora_", p.a ? "A" : "B", " weight but no lora_", p.a ? "B" : "A");
    const ModuleParts parts = module_parts(module);
    FP_CHECK(parts.layer >= 0, weights, ": module '", module,
             "' is not one this engine adapts (the layers' q/k/v/o and gate/up/down projections)");
    FP_CHECK(parts.layer < c.n_layers, weights, ": module '", module, "' is in layer ", parts.layer, " but the model has ",
             c.n_layers, " layers");
    // Widths: the parts' outputs one after another (fused modules).
    int64_t in_dim = target_dims(c, parts.targets[0]).first, out_dim = 0;
    for (LoraTarget t : parts.targets) out_dim += target_dims(c, t).second;
    const auto& as = p.a->shape;
    const auto& bs = p.b->shape;
    FP_CHECK(as.size() == 2 && as[1] == in_dim && as[0] > 0, weights, ": '", p.a->name, "' has shape ", shape_text(as),
             ", expected [rank, ", in_dim, "] for this model");
    const int64_t rank = as[0];
    FP_CHECK(bs.size() == 2 && bs[0] == out_dim && bs[1] == rank, weights, ": '", p.b->name, "' has shape ", shape_text(bs),
             ", expected [", out_dim, ", ", rank, "] for this model");
    if (const nlohmann::json* r = lora_pattern_value(rank_pattern, module))
      FP_CHECK(r->is_number_integer() && r->get<int64_t>() == rank, cfg_path, ": rank_pattern gives '", module, "' rank ",
               r->dump(), " but its matrices have rank ", rank);
    double a = alpha;
    if (const nlohmann::json* v = lora_pattern_value(alpha_pattern, module)) {
      FP_CHECK(v->is_number(), cfg_path, ": alpha_pattern's value for '", module, "' must be a number, got ", v->dump());
      a = v->get<double>();
    }
    const float scale = static_cast<float>(a / (rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank)));
    const std::vector<float> A = to_f32(*p.a, weights);
    std::vector<float> B = to_f32(*p.b, weights);
    for (float& v : B) v *= scale;
    int64_t row = 0;
    for (LoraTarget t : parts.targets) {
      const auto key = std::make_pair(parts.layer, static_cast<int>(t));
      FP_CHECK(!seen[key], weights, ": layer ", parts.layer, "'s ", lora_target_name(t), " is adapted twice");
      seen[key] = true;
      LoraMatrices m;
      m.layer = parts.layer;
      m.target = t;
      m.rank = rank;
      m.in = in_dim;
      m.out = target_dims(c, t).second;
      m.a = A;
      m.b = lora_rows(B, rank, row, m.out);
      row += m.out;
      if (gguf_permuted_qk(base) && (t == LoraTarget::Q || t == LoraTarget::K))
        m.b = permute_heads(m.b, m.out, rank, t == LoraTarget::Q ? c.n_heads : c.n_kv_heads);
      out.max_rank = std::max(out.max_rank, rank);
      out.matrices.push_back(std::move(m));
    }
  }
  return out;
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
  std::vector<LoraMatrices> matrices;
  std::vector<std::vector<float>> bt;                  // B^T [rank, out] of each matrix (the lora op's layout)
  std::vector<Tensor> a_view, bt_view;                 // views of matrices[i].a and of bt[i]
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
    ad->at[static_cast<size_t>(m.layer)][static_cast<size_t>(m.target)] = static_cast<int>(i);
    std::vector<float>& t = ad->bt.emplace_back(m.b.size());
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t j = 0; j < m.rank; ++j) t[static_cast<size_t>(j * m.out + o)] = m.b[static_cast<size_t>(o * m.rank + j)];
    m.b = {};  // kept transposed only
    ad->a_view.push_back(Tensor::view(m.a.data(), DType::F32, {m.rank, m.in}));
  }
  for (size_t i = 0; i < ad->matrices.size(); ++i) {
    const LoraMatrices& m = ad->matrices[i];
    ad->bt_view.push_back(Tensor::view(ad->bt[i].data(), DType::F32, {m.rank, m.out}));
  }
  adapters_.push_back(std::move(ad));
  return size();
}

bool LoraSet::begin(const ForwardBatch& b) {
  runs_.clear();
  if (b.seq_lora.empty()) return false;
  FP_CHECK(static_cast<int64_t>(b.seq_lora.size()) == b.n_seqs(), "a forward batch has ", b.seq_lora.size(),
           " LoRA ids for ", b.n_seqs(), " sequences");
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    const int32_t id = b.seq_lora[static_cast<size_t>(s)];
    FP_CHECK(id >= 0 && id <= size(), "sequence ", s, " of a batch asks for LoRA adapter ", id, " but ", size(),
             " are loaded");
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
    LoraArgs args;
    for (const auto& [t, out] : outs) {
      const int i = ad.at[static_cast<size_t>(layer)][static_cast<size_t>(t)];
      if (i < 0) continue;
      const LoraMatrices& m = ad.matrices[static_cast<size_t>(i)];
      args.parts[args.n_parts++] = {&ad.a_view[static_cast<size_t>(i)], &ad.bt_view[static_cast<size_t>(i)], out + (lo - row0) * m.out};
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
