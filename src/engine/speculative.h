// engine/speculative.h — speculative decoding by prompt lookup (n-gram drafts): a sequence's
// next tokens are guessed from an earlier place where its last few tokens occurred (in the prompt
// or in what it generated), the model checks the guess in one forward over the fed token and the
// drafted ones, and every draft token the model agrees with is kept. On hardware where a decode
// step is bound by reading the weights (every CPU, every GPU at small batches), checking k+1
// tokens costs little more than one, so each accepted token is a step saved. The output is plain
// decoding's: a draft token is kept when the model, sampling as it would without drafts,
// picks it (see verify_draft).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace fp {

// Where drafts come from: an earlier occurrence of the sequence's last n-gram (prompt lookup), or
// the model's own multi-token-prediction layer (DeepSeek-V3, GLM-4.5; engine/mtp_drafter.h).
enum class DraftMethod { Ngram, Mtp };

struct SpeculativeConfig {
  int32_t num_tokens = 0;  // tokens drafted per step and sequence (0: off); vLLM's num_speculative_tokens
  int32_t ngram_min = 2;   // shortest suffix looked up (vLLM's prompt_lookup_min)
  int32_t ngram_max = 4;   // longest suffix looked up, tried first (prompt_lookup_max)
  DraftMethod method = DraftMethod::Ngram;  // --speculative-method ngram|mtp
  bool enabled() const { return num_tokens > 0; }
  bool mtp() const { return enabled() && method == DraftMethod::Mtp; }
  // Fails naming the field when a value is out of range.
  void check() const;
  std::string describe() const;
};

// Drafts max_tokens tokens for the sequence tokens[0..n): for n-gram sizes from ngram_max down
// to ngram_min, the latest earlier occurrence of the sequence's last n tokens, and the tokens
// that followed it there; where those run into the end of the sequence, the draft goes on as if
// the text repeats from the occurrence (tokens[n + j] read as the draft's own token j), so a
// sequence caught in a loop drafts the loop's next turn in full. (vLLM drafts from the earliest
// occurrence and stops at the end.) Returns how many were written to `out`: max_tokens, or 0
// when no suffix n-gram occurs earlier.
int64_t propose_ngram_draft(const int32_t* tokens, int64_t n, const SpeculativeConfig& c, int64_t max_tokens,
                            std::vector<int32_t>& out);

// How many tokens a sequence drafts next, after a draft of `drafted` tokens of which `accepted`
// were kept (current 0: the sequence's first draft, num_tokens): two more after a draft kept
// whole, one fewer after a refusal, within [1, num_tokens] (the schedule Hugging Face uses for
// assistant models). A check of k+1 tokens costs more than a plain step (on the CPU a 5-token
// check of a 1B Q4_K model ~1.6x), so a sequence whose drafts keep failing comes down to checking
// one guess at a time, the cheapest check, and one whose drafts hold goes back up.
int32_t next_draft_length(int32_t current, int64_t drafted, int64_t accepted, const SpeculativeConfig& c);

// The verdict on a draft: how many of its tokens were kept, and the token that follows them (the
// model's own choice where it disagreed with the draft, or the one after the whole draft).
struct DraftVerdict {
  int64_t accepted = 0;
  int32_t next = -1;
};

// Judges a draft: row i of the forward over the fed token and the draft is sampled as a plain
// step would sample it (penalties seeing draft tokens 0..i-1, the sampler's next draw), and draft
// token i is kept when that row samples it; the first row that samples something else gives the
// next token. For a draft that is a single guess (no distribution of its own) this is exactly
// the rejection rule of speculative sampling: d is kept with the probability p(d) the sampler
// gives it, and otherwise the token comes from p without d (the row's draw, given it is not d).
// So the output follows plain decoding's distribution, and since token j always uses the
// sampler's draw j, a seed gives plain decoding's tokens (up to the logits' rounding).
// rows: the logits [n_draft + 1, n_vocab] (modified: penalties). tokens[0..n_context) is the
// sequence up to and including the fed token, followed by the draft (tokens[n_context + i] is
// draft token i). n_prompt: the prompt's length, for the presence / frequency penalties.
DraftVerdict verify_draft(Sampler& sampler, float* rows, int64_t n_vocab, const int32_t* tokens, size_t n_context,
                          int64_t n_draft, size_t n_prompt);
// The same verdict from rows sampled where the logits are (Model::forward_sampled, each row
// under the sampler's next draw in order): ids[0..n_draft] against draft[0..n_draft).
DraftVerdict judge_sampled_draft(const int32_t* ids, const int32_t* draft, int64_t n_draft);

// Counts for the ledger, the logs and /metrics.
struct SpeculativeStats {
  int64_t drafts = 0;           // verifications run (steps of a sequence with a draft)
  int64_t draft_tokens = 0;     // tokens proposed
  int64_t accepted_tokens = 0;  // of them, kept
  double acceptance_rate() const { return draft_tokens ? static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens) : 0.0; }
  // Tokens each verification produced on average (the accepted ones and the model's next).
  double tokens_per_draft() const { return drafts ? 1.0 + static_cast<double>(accepted_tokens) / static_cast<double>(drafts) : 0.0; }
  std::string describe() const;
};

}  // namespace fp
