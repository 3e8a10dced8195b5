// engine/generator.h — single-sequence generation: prefill the prompt, then decode token by
// token, streaming text through a callback. (Batched serving comes with the scheduler.)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "model/model.h"

namespace fp {

class TokenConstraint;

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids; must not be empty (BOS at least)
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  bool stop_at_eog = true;
  DType kv_dtype = DType::F32;  // what the KV cache stores (F32, F16, BF16)
  SpeculativeConfig speculative;  // drafts (prompt lookup, or the model's MTP layer) checked in one forward (off by default)
  // Constrained decoding (engine/token_constraint.h): only text inside this grammar is written,
  // and it ends where the grammar's text is complete. Not with speculative decoding.
  std::shared_ptr<TokenConstraint> constraint;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (not the prompt)
  std::string text;
  std::string finish_reason;    // "stop" or "length"
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_forwards = 0;   // forward calls after the prefill
  SpeculativeStats speculative;  // with GenerateRequest::speculative on
};

// on_text receives each complete piece of text as it is produced.
GenerateResult generate(Model& model, const GenerateRequest& req,
                        const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace fp
