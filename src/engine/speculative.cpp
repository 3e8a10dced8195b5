// engine/speculative.cpp — the prompt-lookup proposer and the acceptance test of a draft.
#include "engine/speculative.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace fp {

void SpeculativeConfig::check() const {
  FP_CHECK(num_tokens >= 0 && num_tokens <= 64, "--speculative-tokens must be in [0, 64], got ", num_tokens);
  if (!enabled()) return;
  FP_CHECK(ngram_min >= 1, "--prompt-lookup-min must be at least 1, got ", ngram_min);
  FP_CHECK(ngram_max >= ngram_min && ngram_max <= 64, "--prompt-lookup-max must be in [--prompt-lookup-min (", ngram_min,
           "), 64], got ", ngram_max);
}

std::string SpeculativeConfig::describe() const {
  std::ostringstream os;
  if (method == DraftMethod::Mtp) {
    os << "speculative decoding: up to " << num_tokens << " tokens drafted per step by the model's multi-token-prediction layer";
    return os.str();
  }
  os << "speculative decoding: up to " << num_tokens << " tokens drafted per step by prompt lookup (n-grams of "
     << ngram_max << " down to " << ngram_min << " tokens)";
  return os.str();
}

int64_t propose_ngram_draft(const int32_t* tokens, int64_t n, const SpeculativeConfig& c, int64_t max_tokens,
                            std::vector<int32_t>& out) {
  out.clear();
  if (max_tokens <= 0 || n < 2) return 0;
  // One pass from the end: at each earlier place e holding the sequence's last token, how many
  // tokens match backwards (up to ngram_max). The longest match wins, the latest on ties; a
  // match of ngram_max ends the search (nothing later can beat it).
  const int32_t last = tokens[n - 1];
  int64_t best_len = 0, best_end = -1;
  for (int64_t e = n - 2; e >= 0 && best_len < c.ngram_max; --e) {
    if (tokens[e] != last) continue;
    int64_t len = 1;
    while (len < c.ngram_max && len <= e && tokens[e - len] == tokens[n - 1 - len]) ++len;
    if (len > best_len) best_len = len, best_end = e;
  }
  if (best_len < c.ngram_min) return 0;
  // What followed it; past the end of the sequence, the draft itself (the text repeating with
  // the period the match suggests: a loop drafts its whole next turn).
  const int64_t from = best_end + 1;
  for (int64_t j = 0; j < max_tokens; ++j)
    out.push_back(from + j < n ? tokens[from + j] : out[static_cast<size_t>(from + j - n)]);
  return max_tokens;
}

int32_t next_draft_length(int32_t current, int64_t drafted, int64_t accepted, const SpeculativeConfig& c) {
  if (current <= 0) current = c.num_tokens;
  const int32_t next = accepted >= drafted ? current + 2 : current - 1;
  return std::clamp(next, std::min<int32_t>(1, c.num_tokens), c.num_tokens);
}

DraftVerdict verify_draft(Sampler& sampler, float* rows, int64_t n_vocab, const int32_t* tokens, size_t n_context,
                          int64_t n_draft, size_t n_prompt) {
  for (int64_t i = 0;; ++i) {
    const size_t seen = n_context + static_cast<size_t>(i);
    const int32_t id = sampler.sample(rows + i * n_vocab, n_vocab, tokens, seen, n_prompt);
    if (i == n_draft || id != tokens[seen]) return {i, id};
  }
}

DraftVerdict judge_sampled_draft(const int32_t* ids, const int32_t* draft, int64_t n_draft) {
  int64_t i = 0;
  while (i < n_draft && ids[i] == draft[i]) ++i;
  return {i, ids[i]};
}

std::string SpeculativeStats::describe() const {
  std::ostringstream os;
  os.precision(3);
  os << "speculative decoding: " << drafts << " drafts, " << accepted_tokens << " of " << draft_tokens
     << " drafted tokens accepted (" << 100.0 * acceptance_rate() << "%), " << tokens_per_draft()
     << " tokens per verification";
  return os.str();
}

}  // namespace fp
