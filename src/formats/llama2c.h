// formats/llama2c.h — llama2.c checkpoints: the legacy header (7 int32, negative vocab =
// untied classifier, trailing RoPE table) and the version-1 header ("ak42" magic, 256 bytes).
// Weights are fp32, exposed as named row-major views in the file's order.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace fp {

struct Llama2cConfig {
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  int version = 0;  // 0 legacy, 1 "ak42" v1
};

struct Llama2cTensor {
  const float* data = nullptr;
  std::vector<int64_t> shape;  // row-major
};

class Llama2cFile {
 public:
  static std::unique_ptr<Llama2cFile> open(const std::string& path);
  static std::unique_ptr<Llama2cFile> parse(const uint8_t* data, size_t size, const std::string& name);
  const Llama2cConfig& config() const { return cfg_; }
  // Names in GGUF style: token_embd.weight, blk.N.attn_q.weight, ..., output.weight when untied.
  const std::map<std::string, Llama2cTensor>& tensors() const { return tensors_; }

 private:
  Llama2cFile() = default;
  void parse_all(const uint8_t* data, size_t size, const std::string& name);
  std::shared_ptr<MappedFile> file_;
  Llama2cConfig cfg_;
  std::map<std::string, Llama2cTensor> tensors_;
};

}  // namespace fp
