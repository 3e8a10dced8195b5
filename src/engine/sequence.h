// engine/sequence.h — a request as the engine tracks it: its tokens (prompt, then generated),
// how many of them have KV in the cache, its block table, state and timings.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_manager.h"
#include "engine/grammar.h"
#include "engine/sampler.h"

namespace fp {

class TokenConstraint;

struct Request {
  std::vector<int32_t> prompt;  // token ids, at least one
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  bool stop_at_eog = true;
  // Token ids that end the request as the end-of-generation token does (not part of the
  // output), whether or not stop_at_eog is set (vLLM's stop_token_ids).
  std::vector<int32_t> stop_token_ids;
  // vLLM's min_tokens: the end-of-generation tokens and stop_token_ids cannot be sampled before
  // this many tokens were generated (not with a constraint, whose grammar decides where it ends).
  int32_t min_tokens = 0;
  int32_t logprobs = -1;  // -1: none; else the sampled token's log-probability and this many top alternatives
  // Constrained decoding (response_format, grammar): only tokens that keep the text inside this
  // grammar are sampled (engine/token_constraint.h); shared by the choices of one call.
  std::shared_ptr<TokenConstraint> constraint;
  // OpenAI's logit_bias: added to these tokens' logits before sampling (log-probabilities stay
  // the model's own).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The LoRA adapter the request runs with (Model::add_lora's id; 0: the base model alone).
  int32_t lora = 0;
  // With SchedulerConfig::policy Priority: lower runs first (vLLM's priority; ties by arrival).
  int32_t priority = 0;
};

enum class SeqState { Waiting, Running, Finished };

struct Sequence {
  int64_t id = 0;
  Request req;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // leading tokens whose KV is in the cache
  int64_t n_draft = 0;          // within a step: speculative draft tokens at the end of `tokens`
  int32_t draft_length = 0;     // how many tokens the next draft may have (0: the configured number)
  std::vector<int32_t> mtp_draft;  // --speculative-method mtp: the draft layer's guess of what follows
  int64_t mtp_draft_at = -1;       // ... made when `tokens` held this many
  GrammarState grammar;            // with req.constraint: where the generated text stands in its grammar
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  BlockTable table;
  SeqState state = SeqState::Waiting;
  std::string finish_reason;    // "stop", "length", "cancelled"
  std::unique_ptr<Sampler> sampler;
  int64_t arrival = 0;          // admission order (FCFS)
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;    // prompt tokens reused from the prefix cache (first admission)
  bool admitted_once = false;
  double t_arrival = 0, t_first_token = 0, t_last_token = 0;
};

}  // namespace fp
