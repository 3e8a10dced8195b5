// model/synth_lora.cpp — `synth --lora-out`: a PEFT LoRA adapter with random matrices for a
// model synth wrote, in PEFT's own layout, so that tests compare the engine with PEFT on it.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/lora.h"
#include "model/model_file.h"

namespace fp {
namespace {

// splitmix64: the same values on every platform.
struct Uniform {
  uint64_t state;
  float operator()(float bound) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>((static_cast<double>(z >> 11) / 9007199254740992.0) * 2.0 - 1.0) * bound;
  }
};

// v's values in `type`, as the file's bytes.
std::vector<uint8_t> bytes_of(const std::vector<float>& v, DType type) {
  return quantize_to_bytes(type, v.data(), static_cast<int64_t>(v.size()));
}

}  // namespace

std::string synth_lora(const std::string& base, const nlohmann::json& config, uint64_t seed, const std::string& out,
                       DType type) {
  const bool gguf = out.ends_with(".gguf");
  FP_CHECK(type == DType::F32 || type == DType::F16 || type == DType::BF16 || (gguf && type == DType::Q8_0), "synth --lora-type: ",
           dtype_name(type), " (LoRA matrices are F32, F16 or BF16; Q8_0 in a GGUF adapter)");
  LoadOptions lo;
  lo.prefault = false;
  lo.weights = WeightMemory::Mapped;  // only the config is read
  const auto model = load_model_file(base, lo);
  const ModelConfig& c = model->config;
  nlohmann::json cfg = {{"peft_type", "LORA"},      {"r", 8},           {"lora_alpha", 16},  {"lora_dropout", 0.0},
                        {"bias", "none"},           {"use_rslora", false}, {"use_dora", false}, {"fan_in_fan_out", false},
                        {"modules_to_save", nullptr}, {"task_type", "CAUSAL_LM"}, {"base_model_name_or_path", base},
                        {"target_modules", {"q_proj", "v_proj"}}, {"rank_pattern", nlohmann::json::object()},
                        {"alpha_pattern", nlohmann::json::object()}, {"inference_mode", true}};
  FP_CHECK(config.is_object(), "synth --lora-config: not a JSON object");
  for (auto it = config.begin(); it != config.end(); ++it) cfg[it.key()] = it.value();
  FP_CHECK(cfg["r"].is_number_integer() && cfg["r"].get<int64_t>() > 0, "synth --lora-config: 'r' must be a positive integer");
  FP_CHECK(cfg["target_modules"].is_array() && !cfg["target_modules"].empty(),
           "synth --lora-config: 'target_modules' must be a list of module names");
  const int64_t r = cfg["r"].get<int64_t>();
  const auto rank_pattern = nlohmann::ordered_json::parse(cfg["rank_pattern"].dump());
  Uniform rng{seed * 0x2545F4914F6CDD1Dull + 1};
  // llama.cpp's GGUF adapters: one alpha for every tensor, q/k rows in the base GGUF's order.
  if (gguf)
    FP_CHECK(!cfg["use_rslora"].get<bool>() && cfg["alpha_pattern"].empty() && cfg["rank_pattern"].empty(),
             "synth --lora-out *.gguf: llama.cpp's adapters have one alpha and no rsLoRA (rank_pattern, alpha_pattern, use_rslora)");
  const std::string arch = c.arch == "mixtral" ? "llama" : c.arch;
  const bool permuted = gguf_permutes_qk(arch);
  GgufWriter g;
  g.set_string("general.architecture", arch);
  g.set_string("general.type", "adapter");
  g.set_string("adapter.type", "lora");
  g.set_f32("adapter.lora.alpha", cfg["lora_alpha"].get<float>());
  SafetensorsWriter w;
  int64_t modules = 0, params = 0;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const auto& t : cfg["target_modules"]) {
      FP_CHECK(t.is_string(), "synth --lora-config: target_modules holds ", t.dump());
      const std::string name = t.get<std::string>();
      const bool attn = name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj" || name == "qkv_proj";
      const std::string module = "model.layers." + std::to_string(l) + (attn ? ".self_attn." : ".mlp.") + name;
      int64_t in = 0, width = 0;
      FP_CHECK(lora_module_shape(c, module, &in, &width), "synth --lora-config: no module '", name, "' to adapt");
      int64_t rank = r;
      if (const nlohmann::ordered_json* p = lora_pattern_value(rank_pattern, module)) rank = p->get<int64_t>();
      std::vector<float> a(static_cast<size_t>(rank * in)), b(static_cast<size_t>(width * rank));
      for (float& v : a) v = rng(1.0f / std::sqrt(static_cast<float>(in)));
      for (float& v : b) v = rng(1.0f / std::sqrt(static_cast<float>(rank)));
      if (gguf) {
        static const std::map<std::string, std::string> names = {
            {"q_proj", "attn_q"},       {"k_proj", "attn_k"},   {"v_proj", "attn_v"},      {"o_proj", "attn_output"},
            {"qkv_proj", "attn_qkv"},   {"gate_proj", "ffn_gate"}, {"up_proj", "ffn_up"}, {"down_proj", "ffn_down"},
            {"gate_up_proj", "ffn_up"}};
        const std::string tensor = "blk." + std::to_string(l) + "." + names.at(name) + ".weight";
        if (permuted && (name == "q_proj" || name == "k_proj")) b = rope_pair_rows(b, width, rank, name == "q_proj" ? c.n_heads : c.n_kv_heads, true);
        // As llama.cpp's converter quantizes: Q8_0 where a row is whole 32-value blocks, F16 otherwise.
        auto row_type = [type](int64_t row) { return type == DType::Q8_0 && row % 32 != 0 ? DType::F16 : type; };
        g.add_tensor(tensor + ".lora_a", row_type(in), {in, rank}, bytes_of(a, row_type(in)));
        g.add_tensor(tensor + ".lora_b", row_type(rank), {rank, width}, bytes_of(b, row_type(rank)));
      } else {
        const std::string prefix = "base_model.model." + module;
        w.add(prefix + ".lora_A.weight", type, {rank, in}, bytes_of(a, type));
        w.add(prefix + ".lora_B.weight", type, {width, rank}, bytes_of(b, type));
      }
      ++modules;
      params += rank * (in + width);
    }
  if (gguf) {
    g.write(out);
  } else {
    std::filesystem::create_directories(out);
    w.write(out + "/adapter_model.safetensors");
    std::ofstream(out + "/adapter_config.json") << cfg.dump(2) << "\n";
  }
  return "synth: wrote LoRA adapter " + out + " (" + std::to_string(modules) + " modules, " + std::to_string(params) +
         " parameters, rank " + std::to_string(r) + ", " + dtype_name(type) + ")";
}

}  // namespace fp
