// model/qk_norm.h — the attention's q and k RMS norms, shared by the Llama and GQA MoE classes:
// per head (Qwen3, Gemma 3, GLM-4.5, EXAONE 4.0) or over the whole projection (OLMo 2 / 3,
// MiniMax-M2), also when the heads are split across ranks, where a row's mean square spans every
// rank's heads.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace fp {

class Communicator;

class QkNorm {
 public:
  // q or k rows [n, heads * head_dim] normalised in place; `w` the weights of these heads
  // (head_dim values per head, or this rank's slice of the whole projection's). With fewer heads
  // here than the model's (full_heads: tensor parallel) a whole-projection norm all-reduces each
  // row's sum of squares over `comm` first (host rows: those models run on the CPU).
  void run(const ModelConfig& c, float* t, const float* w, int64_t n, int64_t heads, int64_t full_heads, Communicator* comm);

 private:
  std::vector<float> sums_;  // each row's sum of squares, across ranks
};

}  // namespace fp
