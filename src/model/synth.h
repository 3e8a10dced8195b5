// model/synth.h — writes a model of any shape with random weights (llama, qwen2, qwen3, qwen3_moe, deepseek_v2, deepseek_v3), as
// GGUF (any supported tensor type) or as a Hugging Face directory (config.json +
// model.safetensors), from the same random values, so the two loaders can be compared.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace fp {

struct SynthOptions {
  std::string arch = "llama";  // llama, qwen2, qwen3
  // Hugging Face config.json keys: hidden_size, intermediate_size, num_hidden_layers,
  // num_attention_heads, num_key_value_heads, head_dim, vocab_size, max_position_embeddings,
  // rms_norm_eps, rope_theta, tie_word_embeddings, rope_scaling. Missing keys get small defaults.
  nlohmann::json config = nlohmann::json::object();
  std::string out;            // *.gguf file, or a directory for safetensors
  DType type = DType::F32;    // type of the 2-D matrices (GGUF: any; safetensors: F32/F16/BF16/F8_E4M3)
  uint64_t seed = 1;
  std::string tokenizer_json;  // optional tokenizer.json to copy into a safetensors directory
  bool split_kv_b = false;
  bool fast_fill = false;      // counter-based random values drawn in parallel (large benchmark models)
  bool stream = false;         // GGUF: draw and write tensor by tensor (automatic above 2^28 parameters)     // deepseek GGUF: llama.cpp's newer attn_k_b / attn_v_b form instead of attn_kv_b
};

// Returns a one-line summary of what was written.
std::string synth_model(const SynthOptions& opts);

}  // namespace fp
