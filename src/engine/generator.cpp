// engine/generator.cpp — the prefill/decode loop of one sequence.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/mtp_drafter.h"
#include "engine/token_constraint.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

GenerateResult generate(Model& model, const GenerateRequest& req, const std::function<void(const std::string&)>& on_text) {
  const ModelConfig& c = model.config();
  FP_CHECK(!req.prompt.empty(), "generate: the prompt has no tokens (BOS at least is needed)");
  for (int32_t t : req.prompt)
    FP_CHECK(t >= 0 && t < c.n_vocab, "generate: prompt token id ", t, " is outside the vocabulary [0, ", c.n_vocab, ")");
  int64_t total = static_cast<int64_t>(req.prompt.size()) + req.max_new_tokens;
  FP_CHECK(static_cast<int64_t>(req.prompt.size()) <= c.max_context, "generate: the prompt has ", req.prompt.size(),
           " tokens but the model's context is ", c.max_context);
  int64_t capacity = std::min<int64_t>(total, c.max_context);
  auto cache = model.new_cache(capacity, 0, req.kv_dtype);
  const Tokenizer* tok = model.tokenizer();
  std::unique_ptr<StreamDecoder> stream;
  if (tok) stream = std::make_unique<StreamDecoder>(*tok);

  GenerateResult res;
  res.finish_reason = "length";
  std::vector<int32_t> history = req.prompt;
  std::vector<int32_t> pos(req.prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  Sampler sampler(req.sampling);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };
  // Prime the stream decoder with the prompt so the first generated piece is decoded in context
  // (a SentencePiece leading space after BOS is dropped, text after a prompt keeps it).
  if (stream) {
    for (int32_t t : req.prompt) (void)stream->push(t);
    (void)stream->flush();
  }

  // Without penalties the model samples where the logits are (on a device only the id comes
  // back); the draw is taken before each forward, in the same order as sample() takes it.
  // Speculative decoding verifies drafts on the host, so it takes every row's logits.
  const SpeculativeConfig& spec = req.speculative;
  spec.check();
  RowSampling row;
  TokenConstraint* grammar = req.constraint.get();
  GrammarState grammar_at = grammar ? grammar->start() : GrammarState{};
  std::vector<float> masked;
  row.here = sampler.penalties_off() && !spec.enabled() && !grammar;
  int32_t sampled = -1;
  auto run = [&](const int32_t* toks, const int32_t* at, int64_t n) {
    if (!row.here) return model.forward(toks, at, n, *cache, logits.data(), false);
    row.settings = sampler.next_row();
    model.forward_sampled(toks, at, n, *cache, logits.data(), row, &sampled);
  };
  Communicator* tp = model.tensor_parallel();
  if (tp && tp->size() <= 1) tp = nullptr;
  // Tensor parallel: every rank holds the same logits, but only rank 0's choice counts (the
  // ranks' seeds may differ), so every rank feeds the same tokens next.
  auto agree = [&](int32_t* v, size_t n) {
    if (tp) dispatch(BroadcastArgs{tp, v, static_cast<int64_t>(n * sizeof(int32_t)), 0});
  };

  auto t0 = std::chrono::steady_clock::now();
  run(req.prompt.data(), pos.data(), static_cast<int64_t>(pos.size()));
  auto t1 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  int32_t next_pos = static_cast<int32_t>(req.prompt.size());
  // Takes a generated token; false when generation ends with it (end of generation, or the
  // token budget spent).
  auto take = [&](int32_t id) {
    if ((req.stop_at_eog || grammar) && tok && tok->is_eog(id)) {  // a grammar's end even under ignore_eos
      res.finish_reason = "stop";
      return false;
    }
    res.tokens.push_back(id);
    history.push_back(id);
    if (stream) emit(stream->push(id));
    if (grammar) {
      FP_CHECK(grammar->accept(grammar_at, id), "sampled token ", id, " is outside the ", grammar->what(), " grammar");
      if (grammar->only_end(grammar_at)) {  // the text is complete: nothing can follow
        res.finish_reason = "stop";
        return false;
      }
    }
    return static_cast<int32_t>(res.tokens.size()) < req.max_new_tokens;
  };
  std::vector<int32_t> draft, feed, feed_pos;
  int32_t draft_length = 0;  // next_draft_length's schedule (0: the configured number)
  std::vector<float> rows;
  int32_t id = -1;
  auto sample_next = [&] {  // the token after the last forward's last position
    if (row.here) {
      id = sampled;
    } else if (grammar) {
      masked = logits;
      grammar->mask_logits(grammar_at, masked.data(), c.n_vocab);
      id = sampler.sample(masked.data(), c.n_vocab, history, req.prompt.size());
    } else {
      id = sampler.sample(logits.data(), c.n_vocab, history, req.prompt.size());
    }
    agree(&id, 1);
  };
  // Drafts from the model's multi-token-prediction layer: after each forward it runs over the
  // kept rows (the fed tokens' positions from kept_start, each with the token that followed it:
  // kept_next, then the newest id) before drafting what follows.
  std::unique_ptr<MtpDrafter> mtp;
  if (spec.mtp()) mtp = std::make_unique<MtpDrafter>(model);
  std::vector<int32_t> kept_next(req.prompt.begin() + 1, req.prompt.end());
  int32_t kept_start = 0;
  std::vector<std::vector<int32_t>> mtp_drafts;
  auto propose = [&](int64_t room) -> int64_t {
    if (!mtp) return spec.enabled() ? propose_ngram_draft(history.data(), static_cast<int64_t>(history.size()), spec, room, draft) : 0;
    kept_next.push_back(id);
    MtpRows kept;
    kept.n = static_cast<int64_t>(kept_next.size());
    kept.next = kept_next.data();
    kept.start = kept_start;
    kept.pages = cache->pages.data();
    kept.n_pages = static_cast<int64_t>(cache->pages.size());
    kept.max_draft = std::max<int64_t>(room, 0);
    mtp->run({kept}, *cache->pool, mtp_drafts);
    draft = mtp_drafts[0];
    // Across ranks every rank drafts from the same logits; rank 0's draft is the one fed.
    std::vector<int32_t> sent(1 + static_cast<size_t>(kept.max_draft), -1);
    sent[0] = static_cast<int32_t>(draft.size());
    std::copy(draft.begin(), draft.end(), sent.begin() + 1);
    agree(sent.data(), sent.size());
    draft.assign(sent.begin() + 1, sent.begin() + 1 + sent[0]);
    return static_cast<int64_t>(draft.size());
  };
  if (req.max_new_tokens > 0) sample_next();
  while (req.max_new_tokens > 0 && take(id) && next_pos < capacity) {
    // Draft: at most what the token budget and the cache leave room for after id.
    const int64_t room = std::min<int64_t>({draft_length > 0 ? draft_length : spec.num_tokens,
                                            req.max_new_tokens - static_cast<int64_t>(res.tokens.size()) - 1, capacity - next_pos - 1});
    int64_t k = propose(room);
    if (grammar && k > 0) {  // the grammar's part of the draft (a refused token could never be kept)
      k = grammar->accepted_prefix(grammar_at, draft.data(), k);
      draft.resize(static_cast<size_t>(k));
    }
    ++res.decode_forwards;
    kept_next.clear();
    kept_start = next_pos;
    if (k == 0) {
      run(&id, &next_pos, 1);
      ++next_pos;
      sample_next();
      continue;
    }
    // Verify: id and the draft in one forward, every position's logits.
    feed.assign(1, id);
    feed.insert(feed.end(), draft.begin(), draft.end());
    feed_pos.resize(feed.size());
    for (size_t i = 0; i < feed.size(); ++i) feed_pos[i] = next_pos + static_cast<int32_t>(i);
    rows.resize(feed.size() * static_cast<size_t>(c.n_vocab));
    model.forward(feed.data(), feed_pos.data(), static_cast<int64_t>(feed.size()), *cache, rows.data(), true);
    const size_t n_context = history.size();  // the draft after it for the penalties, then taken back
    history.insert(history.end(), draft.begin(), draft.end());
    if (grammar) grammar->mask_draft_rows(grammar_at, draft.data(), k, rows.data(), c.n_vocab);  // row i under draft[0..i)'s state
    const DraftVerdict v = verify_draft(sampler, rows.data(), c.n_vocab, history.data(), n_context, k, req.prompt.size());
    history.resize(n_context);
    int32_t verdict[2] = {static_cast<int32_t>(v.accepted), v.next};
    agree(verdict, 2);
    ++res.speculative.drafts;
    res.speculative.draft_tokens += k;
    res.speculative.accepted_tokens += verdict[0];
    draft_length = next_draft_length(draft_length, k, verdict[0], spec);
    // The kept draft tokens have their KV in the cache; the refused ones' slots are written over.
    next_pos += 1 + verdict[0];
    cache->len = next_pos;
    bool more = true;
    for (int32_t j = 0; j < verdict[0] && more; ++j) more = take(draft[static_cast<size_t>(j)]);
    if (!more) break;
    kept_next.assign(draft.begin(), draft.begin() + verdict[0]);
    id = verdict[1];
  }
  if (stream) emit(stream->flush());
  res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return res;
}

}  // namespace fp
