// tests/mpi/engine_mpi_test.cpp — the serving engine over a model split across ranks (issue 7):
// rank 0 runs the Engine (scheduler, chunked prefill, prefix cache, preemption), the other ranks
// follow its steps (engine/followers.h). Every request's greedy tokens equal those of one rank's
// engine over the whole model, for TP decode, for context-parallel prefill with TP decode, and
// for a DeepSeek model with data-parallel attention and expert-parallel experts, and for a
// qwen3moe model split tensor x expert parallel on a device (the stand-in of emulated_device.h
// where there is no GPU: GPU ranks' layouts, sampling on the device).
#include <gtest/gtest.h>

#include <functional>

#include "emulated_device.h"
#include "engine/engine.h"
#include "engine/followers.h"
#include "kernels/ledger.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/synth.h"
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

// 12 prompts sharing a 16-token prefix (prefix-cache hits), 4 of them identical; ids below `vocab`.
std::vector<std::vector<int32_t>> prompts(int32_t vocab) {
  const std::vector<int32_t> base = {1, 403, 407, 261, 378, 1, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122};
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> q = base;
    if (i % 3 == 1) q.push_back(static_cast<int32_t>(200 + i));
    if (i % 3 == 2) q.insert(q.end(), {static_cast<int32_t>(300 + i), 7, 9});
    for (int32_t& t : q) t %= vocab;
    p.push_back(q);
  }
  return p;
}

// Runs every prompt to completion (greedy, 24 tokens); returns their tokens. lora_of(i): prompt
// i's LoRA adapter (none when not given).
std::vector<std::vector<int32_t>> run(Model& m, bool prefix_hits = true, const EngineConfig& cfg = config(), bool preempts = true,
                                      const std::function<int32_t(int)>& lora_of = nullptr) {
  Engine e(m, cfg);
  if (m.parallel().dp > 1) {  // data-parallel attention: rank 0 stores its partition of the pool
    EXPECT_EQ(e.pool().partition().parts, m.parallel().dp);
    EXPECT_EQ(e.pool().bytes() * m.parallel().dp, e.pool().n_blocks() * e.pool().page_size() * m.kv_layout().bytes_per_token());
  }
  std::vector<int64_t> ids;
  for (const auto& p : prompts(static_cast<int32_t>(m.config().n_vocab))) {
    Request r;
    r.prompt = p;
    r.max_new_tokens = 24;
    r.sampling.temperature = 0;
    r.stop_at_eog = false;
    if (lora_of) r.lora = lora_of(static_cast<int>(ids.size()));
    ids.push_back(e.add_request(r));
  }
  for (int guard = 0; e.has_work() && guard < 100000; ++guard) e.step();
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) {
    const Sequence* s = e.sequence(id);
    out.emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
  }
  if (preempts) {
    EXPECT_GT(e.stats().preemptions, 0) << "the budget should force preemptions";
  }
  if (prefix_hits) {
    EXPECT_GT(e.stats().cached_prompt_tokens, 0) << "prompts should hit the prefix cache";
  }
  return out;
}

std::unique_ptr<Model> load_ranked(std::shared_ptr<Communicator> comm, ParallelSizes ps, Device device = Device::CPU,
                            int64_t overlap = 0) {
  LoadOptions lo;
  lo.prefault = false;
  lo.parallel = ps;
  lo.device = device;
  lo.micro_batch_overlap = overlap;
  return load_model(test::testdata("models/stories260K/stories260K.gguf"), lo, std::move(comm));
}

class EngineAcrossRanks : public ::testing::TestWithParam<bool> {};

TEST_P(EngineAcrossRanks, RankZeroLeadsAndTheTokensMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_FILE(test::testdata("models/stories260K/stories260K.gguf"));
  const int ranks = test::world_comm()->size();
  if (8 % ranks != 0) GTEST_SKIP() << "stories260K's 8 heads do not split " << ranks << " ways";
  const bool context_parallel = GetParam();
  auto split = load_ranked(test::world_comm(), ParallelSizes{ranks, 1, context_parallel ? ranks : 1});
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);  // returns when rank 0 releases the followers
    return;
  }
  const auto got = run(*split);
  release_followers(*split);
  auto whole = load_ranked(nullptr, {});
  EXPECT_EQ(got, run(*whole));
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineAcrossRanks, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "cp_prefill_tp_decode" : "tp"; });

// Two LoRA adapters (every rank loads them, in the same order) and the base model, request by
// request: the followers receive each sequence's adapter with the step, and every request's
// tokens equal one rank's.
TEST(EngineAcrossRanksLora, AdaptersPerRequestMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  const std::string path = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(path);
  const int ranks = test::world_comm()->size();
  if (8 % ranks != 0) GTEST_SKIP() << "stories260K's 8 heads do not split " << ranks << " ways";
  const std::string dir = test::temp_dir("engine_lora");  // per rank (the pid names it)
  synth_lora(path, {{"r", 4}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}}, 1, dir + "/a");
  synth_lora(path, {{"r", 8}, {"lora_alpha", 16}, {"target_modules", {"k_proj", "o_proj", "up_proj"}}}, 2, dir + "/b");
  auto with_adapters = [&](std::unique_ptr<Model> m) {
    for (const char* name : {"a", "b"}) m->add_lora(read_lora_adapter(dir + "/" + name, name, m->file()));
    return m;
  };
  // The identical prompts 0, 3, 6, 9 under none, a, b, none.
  auto lora_run = [](Model& m) { return run(m, false, config(), false, [](int i) { return (i / 3) % 3; }); };
  auto split = with_adapters(load_ranked(test::world_comm(), ParallelSizes{ranks, 1, 1}));
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  const auto got = lora_run(*split);
  release_followers(*split);
  auto whole = with_adapters(load_ranked(nullptr, {}));
  const auto want = lora_run(*whole);
  EXPECT_EQ(got, want);
  EXPECT_NE(want[0], want[3]) << "the same prompt under the base model and adapter a";
  EXPECT_EQ(want[0], want[9]);
}

// Gemma 3 (window 4 on five of six layers) split tensor parallel with window trimming: the
// followers build the same pool (window blocks of their own, the zero block) and follow the
// steps' window block tables and window copies; tokens as one rank's trimmed engine, which are
// those of the untrimmed engine.
TEST(EngineAcrossRanksWindows, TrimmedWindowsMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  const int ranks = test::world_comm()->size();
  SynthOptions o;
  o.arch = "gemma3";
  o.config = {{"hidden_size", 64},         {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
              {"intermediate_size", 96},   {"num_hidden_layers", 6},    {"vocab_size", 512},         {"sliding_window", 4},
              {"query_pre_attn_scalar", 16}};
  o.type = DType::F32;
  o.seed = 61;
  o.out = test::temp_dir("engine_windows") + "/model.gguf";  // one copy per rank (same seed, same bytes)
  synth_model(o);
  LoadOptions lo;
  lo.prefault = false;
  lo.parallel = ParallelSizes{ranks, 1, 1};
  auto split = load_model(o.out, lo, test::world_comm());
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  EngineConfig c = config();
  c.kv_cache_bytes = 1 << 20;
  {
    Engine probe(*split, c);
    EXPECT_TRUE(probe.pool().trims_windows()) << probe.capacity().describe();
  }
  const auto got = run(*split, true, c, false);
  release_followers(*split);
  lo.parallel = {};
  auto whole = load_model(o.out, lo);
  EXPECT_EQ(got, run(*whole, true, c, false));
  c.window_trim = false;
  EXPECT_EQ(got, run(*whole, true, c, false));
}

// DeepSeek-V3 (F32, MLA) with data-parallel attention and the experts partitioned: sequences
// attend on the rank owning their first block through chunked prefill, decode and preemption
// (a recomputed sequence may land on another rank); each rank stores only its partition of the
// pool, so the ranks hold `ranks` times the blocks of one. Prefix caching is on: a tree per rank,
// the shared prefix drawing prompts to the rank that cached it (cache/block_manager.h).
TEST(EngineAcrossRanksDeepSeek, DataParallelAttentionMatchesOneRank) {
  FP_REQUIRE_RANKS(2);
  const int ranks = test::world_comm()->size();
  SynthOptions o;
  o.arch = "deepseek_v3";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 2}, {"intermediate_size", 96}, {"num_hidden_layers", 3},
              {"vocab_size", 256}, {"n_routed_experts", 6}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 96},
              {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"q_lora_rank", 32}, {"kv_lora_rank", 32},
              {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};
  o.type = DType::F32;
  o.seed = 37;
  o.out = test::temp_dir("engine_dp") + "/model.gguf";  // one copy per rank (same seed, same bytes)
  synth_model(o);
  LoadOptions lo;
  lo.prefault = false;
  lo.parallel = ParallelSizes{1, ranks, 1, ranks};
  auto split = load_model(o.out, lo, test::world_comm());
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  // 64 KiB per rank: 14 blocks of 8 tokens x 576 B, the 12 sequences need ~72: preemptions on 2 and 3 ranks.
  EngineConfig c = config();
  c.kv_cache_bytes = 64 << 10;
  c.max_model_len = 64;  // (a partition holds one longest sequence; these need 43 tokens)
  EXPECT_EQ(plan_kv_cache(split->kv_layout(), c.page_size, c.kv_cache_bytes, c.max_model_len, c.scheduler.max_num_seqs, ranks)
                .n_blocks,
            14 * ranks);
  const auto got = run(*split, true, c);
  // Speculative drafts take blocks only from their own sequence's partition, never by preemption.
  EngineConfig spec = c;
  spec.speculative = {4, 1, 3};
  const auto got_spec = run(*split, true, spec, /*preempts=*/false);
  release_followers(*split);
  LoadOptions whole_lo;
  whole_lo.prefault = false;
  auto whole = load_model(o.out, whole_lo);
  const auto want = run(*whole, true, c);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_spec, want);
}

// qwen3moe on the device of every rank, attention heads and experts split across the ranks (the
// GPU ranks' layout): the engine on rank 0 samples on the device (its ids broadcast to the
// followers) through chunked prefill, prefix hits and preemption, and gives the tokens of one
// rank's engine over the whole model on the same device. With --micro-batch-overlap 2 (on a
// deferring stream) every step of two tokens or more runs as two micro-batches, decode batches
// recorded and replayed with their started sums inside.
class EngineAcrossRanksOnADeviceMoe : public ::testing::TestWithParam<int64_t> {};

TEST_P(EngineAcrossRanksOnADeviceMoe, TensorAndExpertParallelMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_NO_GPU();
  const int ranks = test::world_comm()->size();
  const int64_t overlap = GetParam();
  SynthOptions o;
  o.arch = "qwen3_moe";
  o.config = test::moe_config("qwen3_moe");
  o.type = DType::F16;
  o.seed = 41;
  o.out = test::temp_dir("engine_device") + "/model.gguf";
  synth_model(o);
  test::EmulatedDevice dev(/*deferred=*/overlap > 0);
  Ledger::global().reset();
  LoadOptions lo;
  lo.prefault = false;
  lo.device = Device::CUDA;
  lo.parallel = ParallelSizes{ranks, ranks};
  lo.micro_batch_overlap = overlap;
  auto split = load_model(o.out, lo, test::world_comm());
  ASSERT_EQ(split->device(), Device::CUDA);
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  EngineConfig c = config();
  c.max_model_len = 64;
  c.kv_cache_bytes = 200 << 10;  // 88 tokens of the whole model, 264 on 3 TP ranks: the ~340 needed do not fit
  const auto got = run(*split, true, c);
  EXPECT_GT(Ledger::global().steps()["replayed"], 0u);
  EXPECT_EQ(Ledger::global().table().find("all_reduce_start") != std::string::npos, overlap > 0);
  release_followers(*split);
  LoadOptions whole_lo = lo;
  whole_lo.parallel = {};
  whole_lo.micro_batch_overlap = 0;
  auto whole = load_model(o.out, whole_lo);
  EXPECT_EQ(got, run(*whole, true, c));
}

INSTANTIATE_TEST_SUITE_P(Overlap, EngineAcrossRanksOnADeviceMoe, ::testing::Values(int64_t{0}, int64_t{2}),
                         [](const auto& p) { return p.param ? "micro_batch_overlap" : "plain"; });

// DeepSeek-V3 with data-parallel attention and the experts partitioned on the device of every
// rank (the planner's layout for MLA on GPU boxes): sequences spread over the ranks' partitions
// of a device pool, the exchanges' permutations applied on the device, decode steps recorded and
// replayed with them; one rank's engine over the whole model on the same device gives the tokens.
// Also with --micro-batch-overlap 2: every step of two tokens or more as two micro-batches (each
// rank's tokens cut in two) whose exchanges are started on the device and waited later, decode
// shapes recorded with them.
class EngineAcrossRanksOnADeviceDeepSeek : public ::testing::TestWithParam<bool> {};

TEST_P(EngineAcrossRanksOnADeviceDeepSeek, DataParallelAttentionMatchesOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_NO_GPU();
  const int ranks = test::world_comm()->size();
  SynthOptions o;
  o.arch = "deepseek_v3";
  o.config = test::moe_config("deepseek_v3");
  o.type = DType::F32;
  o.seed = 43;
  o.out = test::temp_dir("engine_device_dp") + "/model.gguf";
  synth_model(o);
  test::EmulatedDevice dev(/*deferred=*/true);
  LoadOptions lo;
  lo.prefault = false;
  lo.device = Device::CUDA;
  lo.parallel = ParallelSizes{1, ranks, 1, ranks};
  lo.micro_batch_overlap = GetParam() ? 2 : 0;
  auto split = load_model(o.out, lo, test::world_comm());
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  EngineConfig c = config();
  c.kv_cache_bytes = 64 << 10;  // 14 blocks per rank: preemptions on 2 and 3 ranks (as on the CPU above)
  c.max_model_len = 64;
  Ledger::global().reset();
  const auto got = run(*split, true, c);
  EXPECT_EQ(split->parallel().dp, ranks);
  // Decode steps replayed with the batch's sequences spread differently over the ranks each time
  // (the permutations re-uploaded, the graph chosen by the batch size and the padded share).
  EXPECT_GT(Ledger::global().steps()["replayed"], 0u);
  EXPECT_EQ(Ledger::global().table().find("reduce_scatter_start") != std::string::npos, GetParam());
  release_followers(*split);
  LoadOptions whole_lo = lo;
  whole_lo.parallel = {};
  whole_lo.micro_batch_overlap = 0;
  auto whole = load_model(o.out, whole_lo);
  EXPECT_EQ(got, run(*whole, true, c));
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineAcrossRanksOnADeviceDeepSeek, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "micro_batch_overlap" : "plain"; });

// stories260K on the device of every rank, prefill context parallel and decode tensor parallel
// over the cache of every head (chunked prefills, prefix hits, preemptions): one rank's engine on
// the same device gives the tokens.
TEST(EngineAcrossRanksOnADevice, ContextParallelPrefillTensorParallelDecodeMatchOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_NO_GPU();
  FP_REQUIRE_FILE(test::testdata("models/stories260K/stories260K.gguf"));
  const int ranks = test::world_comm()->size();
  if (8 % ranks != 0) GTEST_SKIP() << "stories260K's 8 heads do not split " << ranks << " ways";
  test::EmulatedDevice dev(/*deferred=*/true);
  auto split = load_ranked(test::world_comm(), ParallelSizes{ranks, 1, ranks}, Device::CUDA);
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  const auto got = run(*split);
  EXPECT_GT(Ledger::global().steps()["eager: context-parallel prefill"], 0u);
  release_followers(*split);
  auto whole = load_ranked(nullptr, {}, Device::CUDA);
  EXPECT_EQ(got, run(*whole));
}

// stories260K tensor parallel on the device of every rank with --micro-batch-overlap 2: every
// step of two tokens or more (prefill chunks and decode batches) runs as two micro-batches whose
// sums are in flight while the other computes, decode shapes recorded and replayed as graphs
// with the started collectives inside; one rank's engine on the same device gives the tokens.
TEST(EngineAcrossRanksOnADevice, MicroBatchOverlapMatchesOneRank) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_NO_GPU();
  FP_REQUIRE_FILE(test::testdata("models/stories260K/stories260K.gguf"));
  const int ranks = test::world_comm()->size();
  if (8 % ranks != 0) GTEST_SKIP() << "stories260K's 8 heads do not split " << ranks << " ways";
  test::EmulatedDevice dev(/*deferred=*/true);
  Ledger::global().reset();
  auto split = load_ranked(test::world_comm(), ParallelSizes{ranks, 1}, Device::CUDA, 2);
  if (test::world_comm()->rank() != 0) {
    follow_engines(*split);
    return;
  }
  const auto got = run(*split);
  EXPECT_GT(Ledger::global().steps()["replayed"], 0u) << "overlapped decode steps replay recorded graphs";
  EXPECT_NE(Ledger::global().table().find("all_reduce_start"), std::string::npos);
  release_followers(*split);
  auto whole = load_ranked(nullptr, {}, Device::CUDA);
  EXPECT_EQ(got, run(*whole));
}

}  // namespace
}  // namespace fp
