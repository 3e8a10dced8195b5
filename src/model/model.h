// model/model.h — the interface every architecture implements, its KV cache, and the
// architecture registry (one line per architecture, beside its file).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model_file.h"

namespace fp {

// A contiguous KV cache for one sequence: per layer, [capacity, n_kv_heads * head_dim] keys
// and [capacity, n_kv_heads * v_head_dim] values. (The paged pool comes with the serving core.)
struct KvCache {
  int64_t capacity = 0;
  int64_t len = 0;  // positions written so far
  std::vector<std::vector<float>> k, v;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return file_->config; }
  const ModelFile& file() const { return *file_; }
  const Tokenizer* tokenizer() const { return file_->tokenizer.get(); }

  std::unique_ptr<KvCache> new_cache(int64_t capacity) const;
  // Feeds tokens[0..n) at positions pos[0..n) into the cache. Writes logits for every
  // position ([n, n_vocab]) when all_logits, else only for the last one ([n_vocab]).
  virtual void forward(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits,
                       bool all_logits) = 0;

 protected:
  explicit Model(std::shared_ptr<ModelFile> file) : file_(std::move(file)) {}
  std::shared_ptr<ModelFile> file_;
};

using ArchitectureFactory = std::function<std::unique_ptr<Model>(std::shared_ptr<ModelFile>)>;
bool register_architecture(const std::string& arch, ArchitectureFactory factory);
std::vector<std::string> registered_architectures();
// Builds the model for file->config.arch, checking every tensor's shape against the config.
std::unique_ptr<Model> build_model(std::shared_ptr<ModelFile> file);
// load_model_file + build_model.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts = {});

}  // namespace fp
