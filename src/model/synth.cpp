// model/synth.cpp — random weights in Hugging Face layout, written as GGUF (with llama.cpp's
// q/k row permutation for Llama, so RoPE rotates adjacent pairs) or as safetensors.
#include "model/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/tensor_names.h"

namespace fp {
namespace {

struct HfTensor {
  std::vector<int64_t> shape;  // row-major [out, in] for matrices
  std::vector<float> data;
  bool matrix = false;         // a 2-D weight that takes --type
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

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

ModelConfig config_from_json(const std::string& arch, const nlohmann::json& j) {
  FP_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3", "synth: --arch '", arch, "' is not one of llama, qwen2, qwen3");
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
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    auto& rs = j["rope_scaling"];
    c.rope_scaling.type = rs.value("rope_type", rs.value("type", std::string("none")));
    c.rope_scaling.factor = rs.value("factor", 1.0f);
    c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0f);
    c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0f);
    c.rope_scaling.original_context = rs.value("original_max_position_embeddings", int64_t{8192});
    FP_CHECK(c.rope_scaling.type == "linear" || c.rope_scaling.type == "llama3", "synth: rope_scaling type '",
             c.rope_scaling.type, "' is not supported (linear, llama3)");
  }
  c.validate("synth --config");
  return c;
}

std::map<std::string, HfTensor> make_weights(const ModelConfig& c, uint64_t seed) {
  std::map<std::string, HfTensor> w;
  auto mat = [&](const std::string& name, int64_t out, int64_t in) {
    Normal rnd(seed ^ name_hash(name));
    HfTensor t{{out, in}, std::vector<float>(static_cast<size_t>(out * in)), true};
    float sd = 1.0f / std::sqrt(static_cast<float>(in));
    for (auto& v : t.data) v = rnd() * sd;
    w[name] = std::move(t);
  };
  auto vec = [&](const std::string& name, int64_t n, float base, float sd) {
    Normal rnd(seed ^ name_hash(name));
    HfTensor t{{n}, std::vector<float>(static_cast<size_t>(n)), false};
    for (auto& v : t.data) v = base + rnd() * sd;
    w[name] = std::move(t);
  };
  int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  {
    Normal rnd(seed ^ name_hash("model.embed_tokens.weight"));
    HfTensor t{{c.n_vocab, c.dim}, std::vector<float>(static_cast<size_t>(c.n_vocab * c.dim)), true};
    for (auto& v : t.data) v = rnd();
    w["model.embed_tokens.weight"] = std::move(t);
  }
  vec("model.norm.weight", c.dim, 1.0f, 0.02f);
  if (!c.tied_output) mat("lm_head.weight", c.n_vocab, c.dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    vec(p + "input_layernorm.weight", c.dim, 1.0f, 0.02f);
    vec(p + "post_attention_layernorm.weight", c.dim, 1.0f, 0.02f);
    mat(p + "self_attn.q_proj.weight", q, c.dim);
    mat(p + "self_attn.k_proj.weight", kv, c.dim);
    mat(p + "self_attn.v_proj.weight", kv, c.dim);
    mat(p + "self_attn.o_proj.weight", c.dim, q);
    mat(p + "mlp.gate_proj.weight", c.hidden_dim, c.dim);
    mat(p + "mlp.up_proj.weight", c.hidden_dim, c.dim);
    mat(p + "mlp.down_proj.weight", c.dim, c.hidden_dim);
    if (c.qkv_bias) {
      vec(p + "self_attn.q_proj.bias", q, 0.0f, 0.1f);
      vec(p + "self_attn.k_proj.bias", kv, 0.0f, 0.1f);
      vec(p + "self_attn.v_proj.bias", kv, 0.0f, 0.1f);
    }
    if (c.qk_norm) {
      vec(p + "self_attn.q_norm.weight", c.head_dim, 1.0f, 0.02f);
      vec(p + "self_attn.k_norm.weight", c.head_dim, 1.0f, 0.02f);
    }
  }
  return w;
}

std::string gguf_name(const std::string& hf) {
  std::string n = canonical_from_hf(hf);
  FP_CHECK(!n.empty(), "synth: no GGUF name for '", hf, "'");
  return n;
}

// llama.cpp's converter reorders each head's rows from NeoX halves to interleaved pairs.
std::vector<float> permute_rows_for_adjacent_rope(const HfTensor& t, int64_t n_heads) {
  int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1, hd = rows / n_heads;
  std::vector<float> out(t.data.size());
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t half = 0; half < 2; ++half) {
        int64_t src = h * hd + half * (hd / 2) + i, dst = h * hd + 2 * i + half;
        std::copy_n(t.data.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
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

}  // namespace

std::string synth_model(const SynthOptions& o) {
  ModelConfig c = config_from_json(o.arch, o.config);
  auto w = make_weights(c, o.seed);
  // Norms and biases are F32 in GGUF but take the checkpoint dtype in safetensors: round them
  // through that dtype in both, so the two files hold the same values.
  if (o.type == DType::F16 || o.type == DType::BF16)
    for (auto& [n, t] : w)
      if (!t.matrix) {
        std::vector<uint8_t> tmp(t.data.size() * 2);
        quantize_row(o.type, t.data.data(), tmp.data(), static_cast<int64_t>(t.data.size()));
        dequantize_row(o.type, tmp.data(), t.data.data(), static_cast<int64_t>(t.data.size()));
      }
  bool gguf = o.out.size() > 5 && o.out.compare(o.out.size() - 5, 5, ".gguf") == 0;
  int64_t params = 0;
  for (auto& [n, t] : w) params += static_cast<int64_t>(t.data.size());

  if (gguf) {
    GgufWriter g;
    const std::string a = c.arch + ".";
    g.set_string("general.architecture", c.arch);
    g.set_string("general.name", "synth " + c.arch + " (random weights, seed " + std::to_string(o.seed) + ")");
    g.set_u32(a + "context_length", static_cast<uint32_t>(c.max_context));
    g.set_u32(a + "embedding_length", static_cast<uint32_t>(c.dim));
    g.set_u32(a + "block_count", static_cast<uint32_t>(c.n_layers));
    g.set_u32(a + "feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
    g.set_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
    g.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
    g.set_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    g.set_u32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    g.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.rot_dim));
    g.set_u32(a + "vocab_size", static_cast<uint32_t>(c.n_vocab));
    g.set_f32(a + "rope.freq_base", c.rope_theta);
    g.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    if (c.rope_scaling.type == "linear") {
      g.set_string(a + "rope.scaling.type", "linear");
      g.set_f32(a + "rope.scaling.factor", c.rope_scaling.factor);
    } else if (c.rope_scaling.type == "llama3") {
      // As llama.cpp's converter does: the scaling becomes per-frequency divisors in rope_freqs.weight.
      ModelConfig plain = c;
      plain.rope_scaling = RopeScaling{};
      auto base = plain.rope_inv_freq(), scaled = c.rope_inv_freq();
      std::vector<float> factors(base.size());
      for (size_t i = 0; i < base.size(); ++i) factors[i] = base[i] / scaled[i];
      std::vector<uint8_t> bytes(factors.size() * 4);
      std::memcpy(bytes.data(), factors.data(), bytes.size());
      g.add_tensor("rope_freqs.weight", DType::F32, {static_cast<int64_t>(factors.size())}, std::move(bytes));
    }
    if (c.n_vocab >= 3 + 256 + 52) add_synth_vocab(g, c.n_vocab);
    for (auto& [name, t] : w) {
      std::string gn = gguf_name(name);
      std::vector<float> data = t.data;
      if (c.arch == "llama" && (gn.find("attn_q.weight") != std::string::npos))
        data = permute_rows_for_adjacent_rope(t, c.n_heads);
      if (c.arch == "llama" && (gn.find("attn_k.weight") != std::string::npos))
        data = permute_rows_for_adjacent_rope(t, c.n_kv_heads);
      DType ty = t.matrix ? o.type : DType::F32;
      FP_CHECK(ty != DType::F8_E4M3, "synth: GGUF has no FP8 type (write a safetensors directory for F8_E4M3)");
      int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : t.shape[0];
      if (t.shape.size() == 1) rows = 1;
      FP_CHECK(cols % dtype_info(ty).block_elems == 0, "synth: tensor '", gn, "' rows have ", cols,
               " values, not a multiple of the ", dtype_name(ty), " block size ", dtype_info(ty).block_elems);
      std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
      g.add_tensor(gn, ty, ne, encode_rows(ty, data.data(), rows, cols));
    }
    g.write(o.out);
  } else {
    FP_CHECK(o.type == DType::F32 || o.type == DType::F16 || o.type == DType::BF16 || o.type == DType::F8_E4M3,
             "synth: safetensors holds F32, F16, BF16 or F8_E4M3 weights, not ", dtype_name(o.type), " (write a .gguf)");
    std::filesystem::create_directories(o.out);
    SafetensorsWriter st;
    for (auto& [name, t] : w) {
      int64_t rows = t.shape.size() > 1 ? t.shape[0] : 1, cols = t.shape.back();
      if (o.type == DType::F8_E4M3 && t.matrix && name != "model.embed_tokens.weight") {
        // DeepSeek-V3 layout: E4M3 weights with one f32 scale_inv per 128x128 block (amax / 448).
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        std::vector<float> scale(static_cast<size_t>(sr * sc), 0.0f);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k) {
            float& s = scale[static_cast<size_t>((r / 128) * sc + k / 128)];
            s = std::max(s, std::fabs(t.data[static_cast<size_t>(r * cols + k)]) / 448.0f);
          }
        for (auto& s : scale) if (s == 0) s = 1;
        std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k)
            q[static_cast<size_t>(r * cols + k)] =
                f32_to_fp8e4m3(t.data[static_cast<size_t>(r * cols + k)] / scale[static_cast<size_t>((r / 128) * sc + k / 128)]);
        st.add(name, DType::F8_E4M3, t.shape, std::move(q));
        std::vector<uint8_t> sb(scale.size() * 4);
        std::memcpy(sb.data(), scale.data(), sb.size());
        st.add(name.substr(0, name.size() - 7) + ".weight_scale_inv", DType::F32, {sr, sc}, std::move(sb));
        continue;
      }
      DType ty = o.type == DType::F8_E4M3 ? DType::F32 : o.type;
      st.add(name, ty, t.shape, encode_rows(ty, t.data.data(), rows, cols));
    }
    st.write(o.out + "/model.safetensors");
    nlohmann::json cfg = o.config;
    cfg["architectures"] = {c.arch == "llama" ? "LlamaForCausalLM" : c.arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"};
    cfg["model_type"] = c.arch;
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
    std::ofstream(o.out + "/config.json") << cfg.dump(2) << "\n";
    if (!o.tokenizer_json.empty()) std::filesystem::copy_file(o.tokenizer_json, o.out + "/tokenizer.json",
                                                              std::filesystem::copy_options::overwrite_existing);
  }
  return "synth: wrote " + o.out + " (" + c.arch + ", " + std::to_string(params) + " parameters, " +
         dtype_name(o.type) + " matrices)";
}

}  // namespace fp
