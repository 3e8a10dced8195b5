// engine/embedder.h — text embeddings from a decoder model, as embedding models built on one
// (Qwen3-Embedding, gte-Qwen2, e5-mistral) are used: the final hidden state (after the output
// norm) of the text's last token, or the mean over its tokens, L2-normalised by default. The
// model runs in its hidden-state output mode (Model::set_hidden_output) on a private cache, in
// chunks of `chunk` tokens so that mean pooling never holds more than a chunk's rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace fp {

enum class Pooling { Last, Mean };
// "last" or "mean"; anything else is an error naming it.
Pooling pooling_from_name(const std::string& name);
const char* pooling_name(Pooling p);

struct EmbeddingOptions {
  Pooling pooling = Pooling::Last;
  bool normalize = true;  // divide by the L2 norm (what OpenAI's embeddings are)
  int64_t chunk = 512;    // tokens per forward
};

// The pooling a model directory asks for: sentence-transformers' 1_Pooling/config.json
// (pooling_mode_lasttoken / pooling_mode_mean_tokens) where present, else last-token.
Pooling default_pooling(const std::string& model_path);

class Embedder {
 public:
  // Switches `model` to hidden-state output for the embedder's lifetime (back to logits after).
  explicit Embedder(Model& model);
  ~Embedder();
  Embedder(const Embedder&) = delete;
  Embedder& operator=(const Embedder&) = delete;
  // The embedding of `ids` ([dim]); an empty text or one longer than the model's context is an error.
  std::vector<float> embed(const std::vector<int32_t>& ids, const EmbeddingOptions& o);
  // The embeddings of several texts, as embed gives each: consecutive texts of up to `chunk`
  // tokens together go through one forward as a varlen batch (one sequence each, a private
  // cache for all of them); a longer text runs alone.
  std::vector<std::vector<float>> embed_batch(const std::vector<std::vector<int32_t>>& inputs, const EmbeddingOptions& o);
  int64_t dim() const { return model_.config().dim; }

 private:
  void check_input(const std::vector<int32_t>& ids) const;
  // A text longer than o.chunk: its chunks one after another on one cache.
  std::vector<float> embed_chunked(const std::vector<int32_t>& ids, const EmbeddingOptions& o);
  void add_rows(int64_t row, int64_t n, std::vector<double>& sum) const;
  // sum / n, divided by its L2 norm when o.normalize.
  static std::vector<float> pooled(const std::vector<double>& sum, int64_t n, const EmbeddingOptions& o);
  static void finish(std::vector<float>& v, const EmbeddingOptions& o);
  Model& model_;
  std::vector<float> rows_;
};

}  // namespace fp
