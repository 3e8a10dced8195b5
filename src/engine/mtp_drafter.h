// engine/mtp_drafter.h — speculative drafts from the model's own multi-token-prediction layer
// (DeepSeek-V3, GLM-4.5; --speculative-method mtp). After each forward of the model, the draft
// layer runs over the rows that were kept (each row's final hidden state beside the token that
// followed it), which fills its KV cache at those positions and predicts the token after the
// last one; further draft tokens chain the layer on its own output, one row per sequence and
// step, as vLLM does with one MTP layer and several speculative tokens. Drafts are greedy (the
// layer's argmax); the model's check (verify_draft) keeps the output plain decoding's.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace fp {

// One sequence's rows for the draft layer after a model forward.
struct MtpRows {
  int64_t row0 = 0;              // its first row among the forward's token rows
  int64_t n = 0;                 // how many consecutive rows were kept (at least 1)
  const int32_t* next = nullptr; // the token after each of them: n ids
  int32_t start = 0;             // the first row's position
  const int32_t* pages = nullptr;  // the sequence's block table
  int64_t n_pages = 0;
  int64_t max_draft = 0;         // tokens to draft after the last row (0: only fill the cache)
};

class MtpDrafter {
 public:
  explicit MtpDrafter(Model& model);
  // Runs the draft layer over every sequence's kept rows (the hidden states are the last
  // forward's, Model::final_hidden), then drafts up to max_draft tokens for each: drafts[s],
  // fewer where the sequence's block table ends (a chained row writes its KV one position on).
  void run(const std::vector<MtpRows>& seqs, KvPool& pool, std::vector<std::vector<int32_t>>& drafts);

 private:
  Model& model_;
  ForwardBatch batch_;
  std::vector<float> hidden_, out_hidden_, logits_;
};

}  // namespace fp
