// tests/mpi/engine_mpi_test.cpp — the serving engine over a model split across ranks (issue 7):
// rank 0 runs the Engine (scheduler, chunked prefill, prefix cache, preemption), the other ranks
// follow its steps (engine/followers.h). Every request's greedy tokens equal those of one rank's
// engine over the whole model, for TP decode, and for context-parallel prefill with TP decode.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/followers.h"
#include "model/model.h"
#include "mpi_test_util.h"
#include "test_util.h"

namespace fp {
namespace {

EngineConfig config() {
  EngineConfig c;
  c.page_size = 8;
  c.kv_cache_bytes = 192 << 10;  // 153 tokens of the whole model, 307 per TP rank: preemptions happen
  c.max_model_len = 128;
  c.scheduler.max_num_batched_tokens = 40;  // prefills chunked and mixed with decodes
  c.scheduler.max_num_seqs = 16;
  return c;
}

// 12 prompts sharing a 16-token prefix (prefix-cache hits), 4 of them identical.
std::vector<std::vector<int32_t>> prompts() {
  const std::vector<int32_t> base = {1, 403, 407, 261, 378, 1, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122};
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> q = base;
    if (i % 3 == 1) q.push_back(static_cast<int32_t>(200 + i));
    if (i % 3 == 2) q.insert(q.end(), {static_cast<int32_t>(300 + i), 7, 9});
    p.push_back(q);
  }
  return p;
}

// Runs every prompt to completion (greedy, 24 tokens); returns their tokens.
std::vector<std::vector<int32_t>> run(Model& m) {
  Engine e(m, config());
  std::vector<int64_t> ids;
  for (const auto& p : prompts()) {
    Request r;
    r.prompt = p;
    r.max_new_tokens = 24;
    r.sampling.temperature = 0;
    r.stop_at_eog = false;
    ids.push_back(e.add_request(r));
  }
  for (int guard = 0; e.has_work() && guard < 100000; ++guard) e.step();
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) {
    const Sequence* s = e.sequence(id);
    out.emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
  }
  EXPECT_GT(e.stats().preemptions, 0) << "the budget should force preemptions";
  EXPECT_GT(e.stats().cached_prompt_tokens, 0) << "prompts should hit the prefix cache";
  return out;
}

std::unique_ptr<Model> load(std::shared_ptr<Communicator> comm, ParallelSizes ps) {
  LoadOptions lo;
  lo.prefault = false;
  lo.parallel = ps;
  return load_model(test::testdata("models/stories260K/stories260K.gguf"), lo, std::move(comm));
}

class EngineAcrossRanks : public ::testing::TestWithParam<bool> {};

TEST_P(EngineAcrossRanks, RankZeroLeadsAndTheTokensMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_FILE(test::testdata("models/stories260K/stories260K.gguf"));
  const int ranks = test::world_comm()->size();
  if (8 % ranks != 0) GTEST_SKIP() << "stories260K's 8 heads do not split " << ranks << " ways";
  const bool context_parallel = GetParam();
  auto split = load(test::world_comm(), ParallelSizes{ranks, 1, context_parallel ? ranks : 1});
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);  // returns when rank 0 releases the followers
    return;
  }
  const auto got = run(*split);
  release_followers(*split);
  auto whole = load(nullptr, {});
  EXPECT_EQ(got, run(*whole));
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineAcrossRanks, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "cp_prefill_tp_decode" : "tp"; });

}  // namespace
}  // namespace fp
