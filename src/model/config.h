// model/config.h — what an architecture needs to know about a model, whatever file it came
// from: dimensions, attention layout, RoPE and its scaling, normalisation, output tying.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace fp {

struct RopeScaling {
  std::string type = "none";  // "none", "linear", "llama3", "yarn"
  float factor = 1.0f;
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3
  int64_t original_context = 0;                            // llama3 / yarn
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

  void validate(const std::string& where) const;  // throws naming `where` and the field
  std::string describe() const;
  // Inverse RoPE frequencies, [rot_dim/2], with linear / llama3 scaling applied.
  std::vector<float> rope_inv_freq() const;
};

}  // namespace fp
