// engine/generator.cpp — the prefill/decode loop of one sequence.
#include "engine/generator.h"

#include <chrono>

#include "core/error.h"
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
  RowSampling row;
  row.here = sampler.penalties_off();
  int32_t sampled = -1;
  auto run = [&](const int32_t* toks, const int32_t* at, int64_t n) {
    if (!row.here) return model.forward(toks, at, n, *cache, logits.data(), false);
    row.settings = sampler.next_row();
    model.forward_sampled(toks, at, n, *cache, logits.data(), row, &sampled);
  };

  auto t0 = std::chrono::steady_clock::now();
  run(req.prompt.data(), pos.data(), static_cast<int64_t>(pos.size()));
  auto t1 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  int32_t next_pos = static_cast<int32_t>(req.prompt.size());
  for (int32_t step = 0; step < req.max_new_tokens; ++step) {
    int32_t id = row.here ? sampled : sampler.sample(logits.data(), c.n_vocab, history, req.prompt.size());
    // Tensor parallel: every rank holds the same logits, but only rank 0's choice counts (the
    // ranks' seeds may differ), so every rank feeds the same token next.
    if (Communicator* tp = model.tensor_parallel(); tp && tp->size() > 1)
      dispatch(BroadcastArgs{tp, &id, sizeof(id), 0});
    if (req.stop_at_eog && tok && tok->is_eog(id)) {
      res.finish_reason = "stop";
      break;
    }
    res.tokens.push_back(id);
    history.push_back(id);
    if (stream) emit(stream->push(id));
    if (step + 1 == req.max_new_tokens) break;
    if (next_pos >= capacity) break;  // context full
    run(&id, &next_pos, 1);
    ++next_pos;
  }
  if (stream) emit(stream->flush());
  res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return res;
}

}  // namespace fp
