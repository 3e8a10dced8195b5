// engine/mtp_drafter.cpp — drafts from the model's multi-token-prediction layer (engine/mtp_drafter.h).
#include "engine/mtp_drafter.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace fp {

MtpDrafter::MtpDrafter(Model& model) : model_(model) {
  FP_CHECK(model.has_mtp(), model.file().path, ": --speculative-method mtp: the model was loaded without its ",
           "multi-token-prediction layer (LoadOptions::mtp)");
}

void MtpDrafter::run(const std::vector<MtpRows>& seqs, KvPool& pool, std::vector<std::vector<int32_t>>& drafts) {
  const ModelConfig& c = model_.config();
  const int64_t d = c.dim, V = c.n_vocab, page = pool.page_size();
  drafts.assign(seqs.size(), {});
  // The kept rows of every sequence: their hidden states gathered in batch order.
  batch_.clear();
  int64_t rows = 0;
  for (const MtpRows& s : seqs) rows += s.n;
  hidden_.resize(static_cast<size_t>(rows * d));
  const float* fh = model_.final_hidden();
  int64_t at = 0;
  std::vector<int64_t> last_row(seqs.size(), -1);  // each sequence's last row in the batch
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MtpRows& s = seqs[i];
    FP_CHECK(s.n >= 1, "MTP draft: a sequence with no kept rows");
    std::memcpy(hidden_.data() + at * d, fh + s.row0 * d, static_cast<size_t>(s.n * d) * sizeof(float));
    batch_.add_sequence(s.next, s.n, s.start, s.pages, s.n_pages, s.max_draft > 0);
    at += s.n;
    last_row[i] = at - 1;
  }
  out_hidden_.resize(static_cast<size_t>(rows * d));
  logits_.resize(batch_.logit_rows.size() * static_cast<size_t>(V));
  model_.mtp_forward(batch_, pool, hidden_.data(), logits_.data(), out_hidden_.data());
  auto argmax = [&](const float* row) {
    return static_cast<int32_t>(std::max_element(row, row + V) - row);
  };
  // The first draft token of each sequence that wants one; its state continues the chain.
  std::vector<size_t> chain;     // sequences drafting further
  std::vector<float> state;      // their last row's output state, in chain order
  size_t lr = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].max_draft <= 0) continue;
    drafts[i].push_back(argmax(logits_.data() + lr * static_cast<size_t>(V)));
    ++lr;
    chain.push_back(i);
    state.insert(state.end(), out_hidden_.begin() + last_row[i] * d, out_hidden_.begin() + (last_row[i] + 1) * d);
  }
  // Chained steps: the draft layer on its own output and the token it drafted, one position on.
  for (int64_t j = 1; !chain.empty(); ++j) {
    batch_.clear();
    std::vector<size_t> next_chain;
    std::vector<float> next_in;
    for (size_t k = 0; k < chain.size(); ++k) {
      const MtpRows& s = seqs[chain[k]];
      const int32_t pos = s.start + static_cast<int32_t>(s.n - 1 + j);
      if (j >= s.max_draft || pos >= s.n_pages * page) continue;
      batch_.add_sequence(&drafts[chain[k]].back(), 1, pos, s.pages, s.n_pages, true);
      next_chain.push_back(chain[k]);
      next_in.insert(next_in.end(), state.begin() + static_cast<int64_t>(k) * d, state.begin() + static_cast<int64_t>(k + 1) * d);
    }
    if (next_chain.empty()) break;
    const auto n = static_cast<int64_t>(next_chain.size());
    out_hidden_.resize(static_cast<size_t>(n * d));
    logits_.resize(static_cast<size_t>(n * V));
    model_.mtp_forward(batch_, pool, next_in.data(), logits_.data(), out_hidden_.data());
    for (int64_t k = 0; k < n; ++k) drafts[next_chain[static_cast<size_t>(k)]].push_back(argmax(logits_.data() + k * V));
    chain = std::move(next_chain);
    state.assign(out_hidden_.begin(), out_hidden_.begin() + n * d);
  }
}

}  // namespace fp
