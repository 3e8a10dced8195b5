// model/mtp.h — the parts of a checkpoint's multi-token-prediction layer (DeepSeek-V3, GLM-4.5)
// around its decoder layer: what goes in (the next token's embedding beside the model's final
// hidden state, each normalised, projected to one row) and what comes out (the layer's own
// output norm and head). The architectures run the decoder layer itself (Model::mtp_forward),
// with its KV cache as one more layer of the pool.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "core/tensor.h"
#include "model/model_file.h"
#include "model/repack.h"
#include "model/vocab_parallel.h"

namespace fp {

class MtpHead {
 public:
  // Loads blk.<layer>.nextn.* from `mf`; the embedding table and the head default to the model's
  // (`embed`; `output`, the whole matrix, whose part this rank multiplies by is `output_used`)
  // when the file leaves its own out (they are copies in the published checkpoints, and
  // llama.cpp's GGUFs may drop them). With `comm` (a model split across ranks) the head is split
  // by vocabulary rows as the model's is (model/vocab_parallel.h).
  void load(ModelFile& mf, int64_t layer, const Tensor* embed, const Tensor* output, const Tensor* output_used,
            Communicator* comm, WeightRepacker& rp, std::deque<Tensor>& shards);
  // x [n, dim] = eh_proj · [enorm(embed(tokens[i])) ; hnorm(hidden[i])] for each row i; a token at
  // position 0 embeds as zeros (as vLLM feeds it: no token precedes it).
  void input(const int32_t* tokens, const int32_t* pos, const float* hidden, int64_t n, float* x);
  // logits [rows, n_vocab] of the layer's output rows `out` [rows, dim], normalised in place
  // by the layer's own output norm first.
  void logits(float* out, int64_t rows, float* logits);

 private:
  int64_t dim_ = 0;
  float eps_ = 1e-6f;
  const Tensor* embed_ = nullptr;
  const Tensor* eh_proj_ = nullptr;  // [dim, 2 * dim]
  const float *enorm_ = nullptr, *hnorm_ = nullptr, *head_norm_ = nullptr;
  VocabParallelOutput head_;
  std::vector<float> cat_;  // [n, 2 * dim]: the embedding half, then the hidden half
  std::vector<float> emb_;  // [n, dim]
};

}  // namespace fp
