// tests/async_scheduling_test.cpp — the engine scheduling and launching each step while the one
// before runs (EngineConfig::async_scheduling), on the CPU model (the launch runs the step; the
// engine's bookkeeping — placeholder tokens, fed tokens, finishing a step late, wasted steps
// after an end-of-generation token, cancellation and preemption while a step is in flight — is
// the same as on a device). The device side (queued copies, fences, the token_feed op on the
// device) is tested on a deferred stand-in stream in device_placement_test.cpp.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "test_util.h"

namespace fp {
namespace {


// f() throws an fp::Error whose message holds `part`.
struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string reason;
};

// A mixed workload through one engine: greedy and seeded sampled requests, some with a
// repetition penalty or log-probabilities (sampled on the host: those steps wait), lengths
// from 1 to 160 tokens, prompts sharing a prefix, arrivals spread over the first steps, and
// every seventh request cancelled once it has 5 tokens, every fourth ending on a stop token
// (stop_id, which ends a request as the end-of-generation token does). The KV budget is small
// enough to preempt.
std::vector<Outcome> run_workload(Model& m, AsyncScheduling mode, int32_t stop_id, EngineStats* stats) {
  EngineConfig c;
  c.page_size = 16;
  c.max_model_len = 256;
  c.kv_cache_bytes = m.kv_layout().bytes_per_token() * 16 * 24;  // 24 blocks of 16 tokens
  c.scheduler.max_num_batched_tokens = 40;
  c.scheduler.max_num_seqs = 12;
  c.async_scheduling = mode;
  Engine e(m, c);
  EXPECT_EQ(e.async_scheduling(), mode == AsyncScheduling::On);
  const int kRequests = 28;
  const int32_t V = static_cast<int32_t>(m.config().n_vocab);
  std::vector<Request> reqs;
  for (int i = 0; i < kRequests; ++i) {
    Request r;
    r.prompt = {1};
    const int len = 12 + 9 * (i % 5);
    for (int j = 0; j < len; ++j) r.prompt.push_back(3 + (i % 3 == 0 && j < 30 ? j : i * 7 + j * 13) % (V - 3));
    const bool host_row = i % 6 == 5 || i % 9 == 4;  // sampled on the host: kept short, so most steps overlap
    r.max_new_tokens = host_row ? 1 + i % 12 : std::vector<int32_t>{1, 2, 9, 30, 160}[static_cast<size_t>(i) % 5];
    r.sampling.temperature = i % 2 ? 1.5f : 0.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = 100 + static_cast<uint64_t>(i);
    if (i % 6 == 5) r.sampling.repetition_penalty = 1.15f;
    if (i % 9 == 4) r.logprobs = 2;
    if (i % 4 == 1) r.stop_token_ids = {stop_id};
    reqs.push_back(r);
  }
  std::vector<int64_t> ids;
  std::map<int64_t, Outcome> got;
  std::map<int64_t, int> index_of;
  size_t added = 0;
  for (int guard = 0; guard < 20000; ++guard) {
    for (int k = 0; k < (added == 0 ? 8 : 2) && added < reqs.size(); ++k, ++added) {
      ids.push_back(e.add_request(reqs[added]));
      index_of[ids.back()] = static_cast<int>(added);
    }
    if (!e.has_work() && added == reqs.size()) break;
    for (const StepOutput& o : e.step()) {
      Outcome& out = got[o.id];
      if (o.token >= 0) {
        out.tokens.push_back(o.token);
        out.logprobs.push_back(o.logprob);
      }
      if (o.finished) out.reason = o.finish_reason;
      if (!o.finished && index_of[o.id] % 7 == 3 && out.tokens.size() == 5) {
        EXPECT_TRUE(e.cancel(o.id));
        out.reason = "cancelled";
      }
    }
  }
  EXPECT_FALSE(e.has_work());
  std::vector<Outcome> outcomes;
  for (int64_t id : ids) {
    const Sequence* s = e.sequence(id);
    EXPECT_TRUE(s && s->state == SeqState::Finished);
    std::vector<int32_t> toks(s->tokens.begin() + s->n_prompt, s->tokens.end());
    EXPECT_EQ(toks, got[id].tokens) << "request " << id << ": its sequence holds what its outputs said";
    outcomes.push_back(got[id]);
  }
  if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
  EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks()) << "every block came back";
  *stats = e.stats();
  return outcomes;
}

// The workload step by step and with async scheduling: the same tokens, log-probabilities and
// finish reasons; the ways it ran counted.
void check_same_as_step_by_step(Model& m, int32_t stop_id) {
  EngineStats sync_stats, async_stats;
  const auto want = run_workload(m, AsyncScheduling::Off, stop_id, &sync_stats);
  Ledger::global().reset();
  const auto got = run_workload(m, AsyncScheduling::On, stop_id, &async_stats);
  EXPECT_EQ(got.size(), want.size());
  std::map<std::string, int> reasons;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    // (to rounding: steps of other sizes may take other matmul kernels, summing in another order)
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < want[i].logprobs.size(); ++t)
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4) << "request " << i << " token " << t;
    EXPECT_EQ(got[i].reason, want[i].reason) << "request " << i;
    ++reasons[want[i].reason];
  }
  EXPECT_GT(reasons["length"], 0);
  EXPECT_GT(reasons["cancelled"], 0);
  EXPECT_GT(reasons["stop"], 0);
  EXPECT_GT(async_stats.preemptions, 0);
  EXPECT_EQ(sync_stats.steps_ahead + sync_stats.steps_waited, 0);
  EXPECT_GT(async_stats.steps_ahead, async_stats.steps / 2);
  EXPECT_GT(async_stats.steps_waited, 0);
  auto how = Ledger::global().engine_steps();
  EXPECT_EQ(static_cast<int64_t>(how["launched while the step before ran"]), async_stats.steps_ahead);
  EXPECT_NE(Ledger::global().table().find("engine steps (async scheduling):"), std::string::npos);
  // Decode tokens went into the next step before they reached the engine: the token_feed op ran.
  bool fed = false;
  for (const LedgerEntry& e : Ledger::global().snapshot()) fed |= e.op == "token_feed" && e.calls > 0;
  EXPECT_TRUE(fed);
}

TEST(AsyncScheduling, GivesTheTokensOfStepByStepScheduling) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  const auto period = m->tokenizer()->encode("a.", false, false);  // "." ends many sentences of its stories
  check_same_as_step_by_step(*m, period.back());
}

TEST(AsyncScheduling, RandomisedArrivalsAndCancellationsKeepTheInvariants) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  std::mt19937 rng(99);
  EngineConfig c;
  c.page_size = 8;
  c.max_model_len = 128;
  c.kv_cache_bytes = m->kv_layout().bytes_per_token() * 200;
  c.scheduler.max_num_batched_tokens = 32;
  c.scheduler.max_num_seqs = 6;
  c.async_scheduling = AsyncScheduling::On;
  Engine e(*m, c);
  std::set<int64_t> live, cancelled;
  std::vector<int64_t> all;
  int arrivals = 0;
  for (int step = 0; step < 4000 && (arrivals < 40 || e.has_work()); ++step) {
    if (arrivals < 40 && rng() % 3 == 0) {
      Request r;
      r.prompt = {1};
      const int len = 1 + static_cast<int>(rng() % 50);
      for (int i = 0; i < len; ++i) r.prompt.push_back(rng() % 2 && i < 24 ? 10 + i : 3 + static_cast<int32_t>(rng() % 500));
      r.max_new_tokens = 1 + static_cast<int32_t>(rng() % 30);
      r.sampling.temperature = rng() % 2 ? 0.0f : 1.0f;
      r.sampling.seed = rng();
      r.stop_at_eog = false;
      const int64_t id = e.add_request(r);
      live.insert(id);
      all.push_back(id);
      ++arrivals;
    }
    if (!live.empty() && rng() % 11 == 0) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      if (e.cancel(*it)) cancelled.insert(*it);
      live.erase(it);
    }
    if (!live.empty() && rng() % 13 == 0) {  // a finished request dropped while a step may hold it
      for (int64_t id : all)
        if (!live.count(id) && e.sequence(id)) {
          e.drop(id);
          break;
        }
    }
    for (const StepOutput& o : e.step())
      if (o.finished) live.erase(o.id);
    // Every running sequence's table covers what is computed; no sequence holds more than the
    // two tokens two launched steps sample.
    for (const Sequence* s : e.sequences()) {
      if (s->state == SeqState::Running) {
        ASSERT_GE(static_cast<int64_t>(s->table.blocks.size()) * c.page_size, s->n_computed);
      }
      int pending = 0;
      for (int32_t t : s->tokens) pending += t < 0;
      ASSERT_LE(pending, s->state == SeqState::Finished ? 0 : 2) << "sequence " << s->id;
    }
    ASSERT_LE(e.stats().last_step_tokens, c.scheduler.max_num_batched_tokens);
    ASSERT_LE(m->launched_steps(), 1);
  }
  EXPECT_FALSE(e.has_work());
  for (int64_t id : all) {
    const Sequence* s = e.sequence(id);
    if (!s) continue;  // dropped
    EXPECT_EQ(s->state, SeqState::Finished);
    if (!cancelled.count(id)) {
      EXPECT_EQ(s->finish_reason, "length");
      EXPECT_EQ(s->n_generated(), s->req.max_new_tokens);
    }
  }
  EXPECT_GT(e.stats().steps_ahead, 0);
  if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
  EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks());
}

TEST(AsyncScheduling, AnEngineGoneWithAStepInFlightLeavesTheModelUsable) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  EngineConfig c;
  c.max_model_len = 128;
  c.kv_cache_bytes = 8 << 20;
  c.async_scheduling = AsyncScheduling::On;
  Request r;
  r.prompt = m->tokenizer()->encode("Once upon a time", true, false);
  r.max_new_tokens = 20;
  r.sampling.temperature = 0;
  std::vector<int32_t> want;
  {
    Engine e(*m, c);
    const int64_t id = e.add_request(r);
    while (e.has_work()) e.step();
    want.assign(e.sequence(id)->tokens.begin() + e.sequence(id)->n_prompt, e.sequence(id)->tokens.end());
  }
  {
    Engine e(*m, c);
    e.add_request(r);
    e.step();
    e.step();
    EXPECT_EQ(m->launched_steps(), 1) << "a decode step is in flight";
  }
  EXPECT_EQ(m->launched_steps(), 0);
  Engine e(*m, c);
  const int64_t id = e.add_request(r);
  while (e.has_work()) e.step();
  EXPECT_EQ(std::vector<int32_t>(e.sequence(id)->tokens.begin() + e.sequence(id)->n_prompt, e.sequence(id)->tokens.end()),
            want);
}

TEST(AsyncScheduling, LaunchStepRefusesWhatItCannotRun) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  auto pool = std::make_unique<KvPool>(m->kv_layout(), 16, 8, Device::CPU);
  ForwardBatch b;
  const int32_t toks[] = {1, 2, 3};
  const int32_t pages[] = {0};
  b.add_sequence(toks, 3, 0, pages, 1, true);
  RowSampling host_row;  // its logits wanted on the host
  test::expect_error([&] { m->launch_step(b, *pool, {host_row}); }, {"every logit row must be sampled where the logits are"});
  RowSampling row;
  row.here = true;
  b.feed_rows = {-1, -1, 0};
  test::expect_error([&] { m->launch_step(b, *pool, {row}); }, {"fed from row 0 of a step of 0 rows"});
  b.feed_rows.clear();
  m->launch_step(b, *pool, {row});
  m->launch_step(b, *pool, {row});
  test::expect_error([&] { m->launch_step(b, *pool, {row}); }, {"launched and unfinished already"});
  int32_t id[1] = {-1};
  m->finish_step(id);
  m->finish_step(id);
  EXPECT_GE(id[0], 0);
  test::expect_error([&] { m->finish_step(id); }, {"no step was launched"});
}

// The token_feed op's reference: fed positions take the named row's id, the others keep theirs.
TEST(AsyncScheduling, TokenFeedReferenceTakesTheNamedRows) {
  const std::vector<int32_t> ids = {70, 71, 72, 73};
  for (int64_t n : {0, 1, 5, 33}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n)), from(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      from[static_cast<size_t>(i)] = static_cast<int32_t>(rng() % 5) - 1;
    }
    auto got = tokens;
    const Kernel<TokenFeedArgs>* ref = nullptr;
    for (const auto& k : OpRegistry<TokenFeedArgs>::instance().kernels())
      if (k.backend == Backend::CPU && k.reference) ref = &k;
    ASSERT_TRUE(ref);
    ref->run(TokenFeedArgs{got.data(), from.data(), ids.data(), n});
    for (int64_t i = 0; i < n; ++i) {
      const int32_t f = from[static_cast<size_t>(i)];
      EXPECT_EQ(got[static_cast<size_t>(i)], f >= 0 ? ids[static_cast<size_t>(f)] : tokens[static_cast<size_t>(i)]) << i;
    }
  }
}

}  // namespace
}  // namespace fp
