// tests/engine_test.cpp — the serving core on stories260K: batch invariance across page sizes
// and chunked prefill, prefix reuse, preemption under a small KV budget, speculative decoding
// through all of them (and sampled, stopped inside a draft, with log-probabilities), and a
// randomised scheduler run whose invariants are checked after every step; the partitioned pool of
// data-parallel attention (allocation, storage, capacity, a randomised scheduler run over it).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {


std::unique_ptr<Model> load_stories() { return load_model(test::testdata(test::kStoriesGguf)); }

// 32 different prompts: story openings of different lengths and words.
std::vector<std::vector<int32_t>> make_prompts(const Model& m, int count) {
  const char* subjects[] = {"a little girl", "a big dog", "the sun", "a tiny bird", "Tom", "Lily and Ben", "a red ball",
                            "the old tree"};
  const char* verbs[] = {"wanted to play", "was very happy", "saw a cat", "went to the park"};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::string text = "Once upon a time, " + std::string(subjects[i % 8]) + " " + verbs[(i / 8) % 4] + ".";
    for (int r = 0; r < i % 5; ++r) text += " One day, it was sunny and everyone was glad.";
    out.push_back(m.tokenizer()->encode(text, true, false));
  }
  return out;
}

Request greedy(const std::vector<int32_t>& prompt, int32_t n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

// The tokens each prompt generates alone, through the single-sequence generator.
std::vector<std::vector<int32_t>> alone(Model& m, const std::vector<std::vector<int32_t>>& prompts, int32_t n) {
  std::vector<std::vector<int32_t>> out;
  for (auto& p : prompts) {
    GenerateRequest g;
    g.prompt = p;
    g.max_new_tokens = n;
    g.sampling.temperature = 0;
    out.push_back(generate(m, g).tokens);
  }
  return out;
}

// Every block's reference count equals the tables holding it plus the prefix tree's hold.
void check_block_ownership(Engine& e) {
  const BlockAllocator& a = e.pool().blocks();
  std::vector<int32_t> owners(static_cast<size_t>(a.n_blocks()), 0);
  for (const Sequence* s : e.sequences())
    for (int32_t b : s->table.blocks) ++owners[static_cast<size_t>(b)];
  if (e.blocks().prefix_cache())
    for (int32_t b : e.blocks().prefix_cache()->cached_blocks()) ++owners[static_cast<size_t>(b)];
  int64_t free_blocks = 0;
  for (int32_t b = 0; b < a.n_blocks(); ++b) {
    ASSERT_EQ(a.refcount(b), owners[static_cast<size_t>(b)]) << "block " << b;
    free_blocks += a.refcount(b) == 0;
  }
  ASSERT_EQ(free_blocks, a.n_free());
  if (e.pool().trims_windows()) {  // window blocks: the tables' live entries plus the kept ones
    const BlockAllocator& w = e.pool().window_blocks();
    std::vector<int32_t> held(static_cast<size_t>(w.n_blocks()), 0);
    for (const Sequence* s : e.sequences()) {
      ASSERT_EQ(s->table.window.size(), s->table.blocks.size()) << "sequence " << s->id;
      for (int32_t b : s->table.window)
        if (b >= 0) ++held[static_cast<size_t>(b)];
    }
    for (int32_t b : e.blocks().kept_window_blocks()) ++held[static_cast<size_t>(b)];
    ++held[KvPool::kZeroWindowBlock];  // the pool's own
    int64_t free_window = 0;
    for (int32_t b = 0; b < w.n_blocks(); ++b) {
      ASSERT_EQ(w.refcount(b), held[static_cast<size_t>(b)]) << "window block " << b;
      free_window += w.refcount(b) == 0;
    }
    ASSERT_EQ(free_window, w.n_free());
    // Trimmed: a table holds the blocks of its last window and of the tokens it computes next.
    const int64_t P = e.pool().page_size(), most = (e.pool().layout().window + e.config().scheduler.max_num_batched_tokens) / P + 3;
    for (const Sequence* s : e.sequences()) {
      int64_t live = 0;
      for (int32_t b : s->table.window) live += b >= 0;
      ASSERT_LE(live, most) << "sequence " << s->id << " holds " << live << " window blocks";
    }
  }
  for (const Sequence* s : e.sequences()) {
    ASSERT_EQ(s->n_draft, 0) << "sequence " << s->id << " kept a speculative draft past the step";
    if (s->state == SeqState::Running) {  // no blocks past its tokens (a refused draft's go back)
      ASSERT_LE(static_cast<int64_t>(s->table.blocks.size()), e.blocks().blocks_for(static_cast<int64_t>(s->tokens.size())))
          << "sequence " << s->id;
    }
    if (s->state != SeqState::Running) {
      ASSERT_TRUE(s->state != SeqState::Finished || s->table.blocks.empty()) << "finished sequence " << s->id << " holds blocks";
      continue;
    }
    ASSERT_GE(static_cast<int64_t>(s->table.blocks.size()) * e.pool().page_size(), s->n_computed);
  }
}

// Runs all requests to completion; returns each one's generated tokens.
std::vector<std::vector<int32_t>> run_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int32_t n) {
  std::vector<int64_t> ids;
  for (auto& p : prompts) ids.push_back(e.add_request(greedy(p, n)));
  int64_t guard = 0;
  while (e.has_work()) {
    e.step();
    check_block_ownership(e);
    if (::testing::Test::HasFatalFailure()) return {};
    EXPECT_LE(e.stats().last_step_tokens, e.config().scheduler.max_num_batched_tokens);
    EXPECT_LE(e.stats().last_step_seqs, e.config().scheduler.max_num_seqs);
    if (++guard > 100000) {
      ADD_FAILURE() << "engine did not finish";
      return {};
    }
  }
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) {
    const Sequence* s = e.sequence(id);
    out.emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
  }
  return out;
}

EngineConfig small_config(int64_t page, bool chunked, int64_t budget_tokens = 4096) {
  EngineConfig c;
  c.page_size = page;
  c.kv_cache_bytes = 12 << 20;  // 9830 tokens of stories260K
  c.max_model_len = 512;
  c.scheduler.chunked_prefill = chunked;
  c.scheduler.max_num_batched_tokens = chunked ? 48 : budget_tokens;  // chunked: prefills split and mix with decodes
  c.scheduler.max_num_seqs = 64;
  return c;
}

// With speculative decoding (prompt-lookup drafts verified in the step) too: the same tokens, in
// fewer steps.
TEST(Engine, BatchInvarianceAcrossPageSizesAndChunkedPrefill) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  auto prompts = make_prompts(*m, 32);
  const int32_t n = 40;
  auto want = alone(*m, prompts, n);
  for (int64_t page : {1, 16, 256})
    for (bool chunked : {false, true}) {
      int64_t plain_steps = 0;
      for (bool spec : {false, true}) {
        EngineConfig c = small_config(page, chunked);
        if (spec) c.speculative = {5, 1, 3};
        Engine e(*m, c);
        auto got = run_all(e, prompts, n);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_EQ(got[i], want[i]) << "prompt " << i << " page " << page << (chunked ? " chunked" : "") << (spec ? " drafts" : "");
        if (chunked) {
          EXPECT_GT(e.stats().steps, 1);
        }
        if (!spec) {
          plain_steps = e.stats().steps;
          continue;
        }
        const SpeculativeStats& st = e.stats().speculative;
        EXPECT_GT(st.accepted_tokens, 0);
        EXPECT_LE(st.accepted_tokens, st.draft_tokens);
        EXPECT_LT(e.stats().steps, plain_steps) << "page " << page << (chunked ? " chunked" : "");
      }
    }
}

// The synthetic model o describes, written under a temp dir `name` and loaded.
std::unique_ptr<Model> synth_and_load(SynthOptions o, const std::string& name) {
  const bool safetensors_only = o.arch == "llama4_text" || o.arch == "olmo3" || o.arch == "exaone4" || o.arch == "hunyuan_v1_moe";
  o.out = test::temp_dir(name) + (safetensors_only ? "/m" : "/m.gguf");
  synth_model(o);
  LoadOptions lo;
  lo.prefault = false;
  return load_model(o.out, lo);
}

// `count` prompts of 3 to 40 tokens below 501.
std::vector<std::vector<int32_t>> varied_prompts(int count) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 3 + (i * 7) % 38; ++t) p.push_back(static_cast<int32_t>(1 + (i * 131 + t * 29) % 500));
    prompts.push_back(p);
  }
  return prompts;
}

// A synthetic model's 12 prompts (3 to 40 tokens) continue for 30 tokens batched, paged (1 and
// 16) and chunked as each does alone (windowed models: well past the window, whose first key
// falls inside a page).
void expect_batch_invariant(const SynthOptions& o, const std::string& name) {
  auto m = synth_and_load(o, name);
  const std::vector<std::vector<int32_t>> prompts = varied_prompts(12);
  const int32_t n = 30;
  auto want = alone(*m, prompts, n);
  for (int64_t page : {1, 16})
    for (bool chunked : {false, true}) {
      EngineConfig c = small_config(page, chunked);
      Engine e(*m, c);
      auto got = run_all(e, prompts, n);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got[i], want[i]) << name << ": prompt " << i << " page " << page << (chunked ? " chunked" : "");
    }
}

TEST(Engine, GptOssBatchInvarianceAcrossPageSizesAndChunkedPrefill) {
  SynthOptions o;
  o.arch = "gpt_oss";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"intermediate_size", 32}, {"num_hidden_layers", 3}, {"vocab_size", 512}, {"num_local_experts", 4},
              {"num_experts_per_tok", 2}, {"sliding_window", 8}};
  o.type = DType::MXFP4;
  o.seed = 41;
  expect_batch_invariant(o, "engine_gpt_oss");
}

// Gemma 3: five windowed layers to each global one, the windowed layers rotating with their own
// base, GeGLU and the sandwich norms; Q4_0 rows of 96 values (Q4_0_X8 rows that are all tail).
TEST(Engine, Gemma3BatchInvarianceAcrossPageSizesAndChunkedPrefill) {
  SynthOptions o;
  o.arch = "gemma3";
  o.config = {{"hidden_size", 96}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 32},
              {"intermediate_size", 128}, {"num_hidden_layers", 6}, {"vocab_size", 512}, {"sliding_window", 8},
              {"query_pre_attn_scalar", 32}, {"rope_theta", 1000000.0}};
  o.type = DType::Q4_0;
  o.seed = 43;
  expect_batch_invariant(o, "engine_gemma3");
}

// Gemma 2: every other layer windowed, scores and logits soft-capped (caps that bend them: the
// AVX2 attention's capped scores in decode, prefill and chunks), Q8_0 weights.
TEST(Engine, Gemma2BatchInvarianceAcrossPageSizesAndChunkedPrefill) {
  SynthOptions o;
  o.arch = "gemma2";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
              {"intermediate_size", 128}, {"num_hidden_layers", 4}, {"vocab_size", 512}, {"sliding_window", 8},
              {"query_pre_attn_scalar", 32}, {"attn_logit_softcapping", 2.0}, {"final_logit_softcapping", 20.0}};
  o.type = DType::Q8_0;
  o.seed = 44;
  expect_batch_invariant(o, "engine_gemma2");
}

// OLMo 2: no norm before the sublayers (the residual added, then the rows themselves as input),
// q/k normalised over every head together; Q8_0 weights.
TEST(Engine, Olmo2BatchInvarianceAcrossPageSizesAndChunkedPrefill) {
  SynthOptions o;
  o.arch = "olmo2";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
              {"intermediate_size", 128}, {"num_hidden_layers", 3}, {"vocab_size", 512}};
  o.type = DType::Q8_0;
  o.seed = 45;
  expect_batch_invariant(o, "engine_olmo2");
}

// Window trimming (the sliding-window layers' KV in blocks of their own, given back as the window
// slides; BlockManager): the engine gives the tokens of the untrimmed engine and of each prompt
// alone, over page sizes the window's first key falls inside of, chunked prefills of 7 and 48
// tokens and a budget small enough to preempt, and a second round of follow-up prompts (each a
// first-round prompt, its reply and more) reuses the first round's prefixes, whose windows were
// kept. Models: gpt-oss (window 8 on the even layers), Gemma 3 (five of six layers) and Phi-3
// (every layer windowed: the main blocks store nothing).
void expect_trimmed_like_untrimmed(const SynthOptions& o, const std::string& name) {
  auto m = synth_and_load(o, name);
  const std::vector<std::vector<int32_t>> prompts = varied_prompts(10);
  const int32_t n = 24;
  const auto want = alone(*m, prompts, n);
  std::vector<std::vector<int32_t>> follow_ups;  // prompt + reply + 5 more tokens
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> p = prompts[i];
    p.insert(p.end(), want[i].begin(), want[i].end());
    for (int t = 0; t < 5; ++t) p.push_back(static_cast<int32_t>(7 + (i * 17 + t * 3) % 400));
    follow_ups.push_back(p);
  }
  const auto want_follow = alone(*m, follow_ups, 10);
  for (int64_t page : {1, 8, 16})
    for (int64_t chunk : {7, 48})
      for (bool tight : {false, true}) {
        const std::string where = name + " page " + std::to_string(page) + " chunk " + std::to_string(chunk) + (tight ? " tight" : "");
        EngineConfig c = small_config(page, true);
        c.scheduler.max_num_batched_tokens = chunk;
        c.max_model_len = 128;
        if (tight) c.kv_cache_bytes = 224 << 10;  // a few sequences' worth: preemption, kept windows evicted
        Engine e(*m, c);
        ASSERT_TRUE(e.pool().trims_windows()) << where << ": " << e.capacity().describe();
        c.window_trim = false;
        if (tight) c.kv_cache_bytes = 4 << 20;  // (the untrimmed cache of one sequence would not fit the tight budget)
        Engine plain(*m, c);
        ASSERT_FALSE(plain.pool().trims_windows());
        if (!tight) {  // the same budget: the trimmed pool holds every sequence in less memory
          EXPECT_LT(e.pool().bytes(), plain.pool().bytes()) << where;
        }
        auto got = run_all(e, prompts, n);
        ASSERT_EQ(got.size(), want.size()) << where;
        for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << where << ": prompt " << i;
        const int64_t cached = e.stats().cached_prompt_tokens;
        auto got_follow = run_all(e, follow_ups, 10);
        ASSERT_EQ(got_follow.size(), want_follow.size()) << where;
        for (size_t i = 0; i < want_follow.size(); ++i) EXPECT_EQ(got_follow[i], want_follow[i]) << where << ": follow-up " << i;
        if (!tight) {
          EXPECT_GT(e.stats().cached_prompt_tokens, cached) << where << ": the follow-ups reused no prefix";
        }
        EXPECT_EQ(run_all(plain, follow_ups, 10), want_follow) << where << " (untrimmed)";
      }
  // Speculative decoding: drafts written past the window and refused ones given back (truncate).
  EngineConfig c = small_config(8, true);
  c.scheduler.max_num_batched_tokens = 7;
  c.max_model_len = 128;
  c.speculative = {5, 1, 3};
  Engine e(*m, c);
  ASSERT_TRUE(e.pool().trims_windows());
  EXPECT_EQ(run_all(e, prompts, n), want) << name << " speculative";
  EXPECT_GT(e.stats().speculative.draft_tokens, 0) << name;
}

TEST(Engine, WindowTrimmingGivesTheUntrimmedTokens) {
  SynthOptions o;
  o.arch = "gpt_oss";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"intermediate_size", 32}, {"num_hidden_layers", 3}, {"vocab_size", 512}, {"num_local_experts", 4},
              {"num_experts_per_tok", 2}, {"sliding_window", 8}};
  o.seed = 51;
  expect_trimmed_like_untrimmed(o, "engine_trim_gpt_oss");
  o = SynthOptions{};
  o.arch = "gemma3";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 32},
              {"intermediate_size", 96}, {"num_hidden_layers", 6}, {"vocab_size", 512}, {"sliding_window", 6},
              {"query_pre_attn_scalar", 32}};
  o.seed = 52;
  expect_trimmed_like_untrimmed(o, "engine_trim_gemma3");
  o = SynthOptions{};
  o.arch = "phi3";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"sliding_window", 5},
              {"max_position_embeddings", 256}};
  o.seed = 53;
  expect_trimmed_like_untrimmed(o, "engine_trim_phi3");
}

// Llama 4's chunked layers keep the KV of their chunk only: trimmed as a window of the chunk's
// length (three layers of four; the NoPE one keeps everything), with the tokens of the untrimmed
// engine in every case above.
TEST(Engine, ChunkedAttentionTrimmingGivesTheUntrimmedTokens) {
  SynthOptions o;
  o.arch = "llama4_text";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"intermediate_size", 32}, {"intermediate_size_mlp", 64}, {"num_hidden_layers", 4}, {"vocab_size", 512},
              {"num_local_experts", 4}, {"interleave_moe_layer_step", 2}, {"attention_chunk_size", 6}, {"floor_scale", 8},
              {"attn_scale", 0.3}, {"max_position_embeddings", 256}};
  o.seed = 54;
  expect_trimmed_like_untrimmed(o, "engine_trim_llama4");
}

TEST(Engine, SharedPrefixComputesOnlyTheSuffix) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  std::vector<int32_t> prefix = m->tokenizer()->encode(story + story + story + story + story + story + story + story, true, false);
  ASSERT_GE(prefix.size(), 200u);
  prefix.resize(200);
  auto a = prefix, b = prefix;
  for (int32_t t : m->tokenizer()->encode(" The dog ran fast.", false, false)) a.push_back(t);
  for (int32_t t : m->tokenizer()->encode(" Tom had a big red ball.", false, false)) b.push_back(t);
  auto want = alone(*m, {b}, 30)[0];

  EngineConfig c = small_config(16, true);
  c.scheduler.max_num_batched_tokens = 512;
  Engine e(*m, c);
  run_all(e, {a}, 30);
  const int64_t computed_before = e.stats().computed_prompt_tokens;
  auto got = run_all(e, {b}, 30)[0];
  EXPECT_EQ(got, want);
  // 200 shared tokens = 12 whole blocks of 16 reused; only the rest is computed.
  const Sequence* s = e.sequence(1);
  EXPECT_EQ(s->cached_tokens, 192);
  EXPECT_EQ(e.stats().computed_prompt_tokens - computed_before, static_cast<int64_t>(b.size()) - 192);
  EXPECT_EQ(e.stats().cached_prompt_tokens, 192);
  EXPECT_GT(e.blocks().prefix_cache()->hit_tokens(), 0);

  // The same request with prefix caching off computes everything and gives the same tokens.
  c.prefix_caching = false;
  Engine off(*m, c);
  run_all(off, {a}, 30);
  EXPECT_EQ(run_all(off, {b}, 30)[0], want);
  EXPECT_EQ(off.stats().computed_prompt_tokens, static_cast<int64_t>(a.size() + b.size()));
}

// The n choices of one request (or requests sent together with one long prompt) compute their
// shared prompt once: the first is admitted, the others wait until its blocks are in the prefix
// cache (a different prompt behind them is not held up), and each gives the tokens it gives alone.
TEST(Engine, ChoicesOfOnePromptComputeItOnce) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  std::vector<int32_t> prompt = m->tokenizer()->encode(story + story + story + story + story + story + story + story, true, false);
  ASSERT_GE(prompt.size(), 200u);
  prompt.resize(200);
  const std::vector<int32_t> other = m->tokenizer()->encode("Tom had a big red ball.", true, false);
  const auto want = alone(*m, {prompt, other}, 20);
  const int64_t L = static_cast<int64_t>(prompt.size()), hit = 192;  // 12 whole blocks of 16; the rest per choice

  struct Case {
    const char* name;
    bool chunked, async, wait;
  };
  for (const Case& k : {Case{"chunked", true, false, true}, Case{"whole prompts", false, false, true},
                        Case{"async", true, true, true}, Case{"not waiting", true, false, false}}) {
    SCOPED_TRACE(k.name);
    EngineConfig c = small_config(16, k.chunked);
    c.scheduler.max_num_batched_tokens = 1024;  // room for every prompt in one step
    c.scheduler.wait_for_shared_prefix = k.wait;
    c.async_scheduling = k.async ? AsyncScheduling::On : AsyncScheduling::Off;
    Engine e(*m, c);
    std::vector<int64_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(e.add_request(greedy(prompt, 20)));
    const int64_t id_other = e.add_request(greedy(other, 20));
    e.step();
    if (!k.async) {  // the first choice and the other prompt run; the siblings wait
      EXPECT_EQ(e.sequence(ids[0])->state, SeqState::Running);
      EXPECT_EQ(e.sequence(ids[1])->state, k.wait ? SeqState::Waiting : SeqState::Running);
      EXPECT_EQ(e.sequence(id_other)->state, SeqState::Running);
    }
    int64_t guard = 0;
    while (e.has_work() && ++guard < 10000) {
      e.step();
      check_block_ownership(e);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    for (int64_t id : ids) {
      const Sequence* s = e.sequence(id);
      EXPECT_EQ(std::vector<int32_t>(s->tokens.begin() + s->n_prompt, s->tokens.end()), want[0]) << "choice " << id;
      EXPECT_EQ(s->cached_tokens, k.wait && id != ids[0] ? hit : 0) << "choice " << id;
    }
    const Sequence* o = e.sequence(id_other);
    EXPECT_EQ(std::vector<int32_t>(o->tokens.begin() + o->n_prompt, o->tokens.end()), want[1]);
    const int64_t own = static_cast<int64_t>(other.size());
    EXPECT_EQ(e.stats().computed_prompt_tokens, k.wait ? L + 3 * (L - hit) + own : 4 * L + own);
    EXPECT_EQ(e.stats().cached_prompt_tokens, k.wait ? 3 * hit : 0);
    if (k.wait) EXPECT_GT(e.stats().prefix_waits, 0);
    else EXPECT_EQ(e.stats().prefix_waits, 0);
  }
}

// vLLM's min_tokens: the end-of-generation token and stop_token_ids cannot be sampled before
// that many tokens, on the host's sampling path and the model's (after min_tokens), with drafts
// and with async scheduling.
TEST(Engine, MinTokensHoldsBackTheEnds) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  const std::vector<int32_t> prompt = m->tokenizer()->encode("Once upon a time, Tom", true, false);
  const auto baseline = alone(*m, {prompt}, 24)[0];
  struct Case {
    const char* name;
    bool async;
    int32_t draft;
  };
  for (const Case& k : {Case{"plain", false, 0}, Case{"async", true, 0}, Case{"drafts", false, 4}}) {
    SCOPED_TRACE(k.name);
    EngineConfig c = small_config(16, true);
    c.async_scheduling = k.async ? AsyncScheduling::On : AsyncScheduling::Off;
    if (k.draft) c.speculative = {k.draft, 1, 3};
    Engine e(*m, c);
    auto finished = [&](const Request& r) {
      const int64_t id = e.add_request(r);
      for (int guard = 0; e.has_work() && guard < 10000; ++guard) e.step();
      return e.sequence(id);
    };
    // End of generation pushed to the top: it ends the reply at once, or right at min_tokens.
    Request r = greedy(prompt, 20);
    r.logit_bias = {{m->tokenizer()->eos_id(), 100.0f}};
    const Sequence* s = finished(r);
    EXPECT_EQ(s->n_generated(), 0);
    r.min_tokens = 4;
    s = finished(r);
    EXPECT_EQ(s->n_generated(), 4);
    EXPECT_EQ(s->finish_reason, "stop");
    // A stop token the greedy reply writes early: held back until min_tokens, the reply the same
    // before it.
    const int32_t stop = baseline[2];
    const auto first = static_cast<int64_t>(std::find(baseline.begin(), baseline.end(), stop) - baseline.begin());
    Request q = greedy(prompt, 24);
    q.stop_token_ids = {stop};
    s = finished(q);
    EXPECT_EQ(s->n_generated(), first);
    q.min_tokens = 8;
    s = finished(q);
    ASSERT_GE(s->n_generated(), 8);
    const std::vector<int32_t> got(s->tokens.begin() + s->n_prompt, s->tokens.end());
    EXPECT_TRUE(std::equal(baseline.begin(), baseline.begin() + first, got.begin()));
    EXPECT_EQ(std::count(got.begin(), got.end(), stop), 0);
  }
  Engine e(*m, small_config(16, true));
  Request bad = greedy(prompt, 4);
  bad.min_tokens = 5;
  test::expect_error([&] { e.add_request(bad); }, {"min_tokens 5", "max_new_tokens 4"});
}

// --scheduling-policy priority: waiting requests run by priority (lower first), not arrival; a
// request short of a sequence slot or of blocks preempts running ones of a lower priority, and
// every request still gives the tokens it gives alone.
TEST(Engine, PriorityPolicyRunsHigherPrioritiesFirstAndPreemptsForThem) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  const auto prompts = make_prompts(*m, 3);
  const auto want = alone(*m, prompts, 12);
  auto finish_order = [&](Engine& e, const std::vector<int32_t>& priorities) {
    std::vector<int64_t> ids, order;
    for (size_t i = 0; i < priorities.size(); ++i) {
      Request r = greedy(prompts[i], 12);
      r.priority = priorities[i];
      ids.push_back(e.add_request(r));
    }
    for (int guard = 0; e.has_work() && guard < 10000; ++guard)
      for (const StepOutput& o : e.step())
        if (o.finished) order.push_back(std::find(ids.begin(), ids.end(), o.id) - ids.begin());
    for (size_t i = 0; i < ids.size(); ++i) {
      const Sequence* s = e.sequence(ids[i]);
      EXPECT_EQ(std::vector<int32_t>(s->tokens.begin() + s->n_prompt, s->tokens.end()), want[i]) << "request " << i;
    }
    return order;
  };
  EngineConfig c = small_config(16, true);
  c.scheduler.max_num_seqs = 1;
  {
    Engine fcfs(*m, c);
    EXPECT_EQ(finish_order(fcfs, {5, 1, 3}), (std::vector<int64_t>{0, 1, 2}));
  }
  c.scheduler.policy = SchedulingPolicy::Priority;
  {
    Engine prio(*m, c);
    EXPECT_EQ(finish_order(prio, {5, 1, 3}), (std::vector<int64_t>{1, 2, 0}));
    EXPECT_EQ(prio.stats().priority_preemptions, 0);
  }

  // Preemption for a slot, then for blocks: two low-priority requests run; a high one arrives.
  std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  std::vector<int32_t> long_prompt = m->tokenizer()->encode(story + story + story + story + story + story, true, false);
  ASSERT_GE(long_prompt.size(), 100u);
  long_prompt.resize(100);
  std::vector<int32_t> other = long_prompt;
  other[1] = prompts[1][1];  // no shared prefix with the first
  std::vector<int32_t> high_prompt(long_prompt.begin(), long_prompt.begin() + 40);  // 3 blocks: more than the 2 left
  high_prompt[1] = prompts[2][1];
  const auto want_long = alone(*m, {long_prompt, other, high_prompt}, 20);
  for (const char* shortage : {"slot", "blocks"}) {
    SCOPED_TRACE(shortage);
    EngineConfig p = small_config(16, true);
    p.scheduler.policy = SchedulingPolicy::Priority;
    p.scheduler.max_num_batched_tokens = 256;
    p.prefix_caching = false;
    p.max_model_len = 128;
    if (std::string(shortage) == "slot") {
      p.scheduler.max_num_seqs = 2;
    } else {
      p.kv_cache_bytes = 16 * 16 * m->kv_layout().bytes_per_token();  // 16 blocks: the low ones take 14
    }
    Engine e(*m, p);
    if (std::string(shortage) == "blocks") {
      ASSERT_EQ(e.pool().n_blocks(), 16);
    }
    std::vector<int64_t> ids;
    for (const auto& q : {long_prompt, other}) {
      Request r = greedy(q, 20);
      r.priority = 5;
      ids.push_back(e.add_request(r));
    }
    e.step();
    ASSERT_EQ(e.sequence(ids[0])->state, SeqState::Running);
    ASSERT_EQ(e.sequence(ids[1])->state, SeqState::Running);
    Request high = greedy(high_prompt, 20);
    high.priority = -1;
    ids.push_back(e.add_request(high));
    e.step();
    EXPECT_EQ(e.sequence(ids[2])->state, SeqState::Running);
    EXPECT_EQ(e.sequence(ids[1])->state, SeqState::Waiting);  // the newer low one made room
    EXPECT_EQ(e.stats().priority_preemptions, 1);
    for (int guard = 0; e.has_work() && guard < 10000; ++guard) {
      e.step();
      check_block_ownership(e);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    EXPECT_LT(e.sequence(ids[2])->t_last_token, e.sequence(ids[1])->t_last_token);
    for (size_t i = 0; i < 3; ++i) {
      const Sequence* s = e.sequence(ids[i]);
      EXPECT_EQ(std::vector<int32_t>(s->tokens.begin() + s->n_prompt, s->tokens.end()), want_long[i]) << "request " << i;
    }
  }
}

// --scheduling-policy priority with chunked prefill: a high-priority arrival takes the step's
// tokens from a running low-priority prompt's chunk, so its first token comes in the step it is
// admitted instead of after the low prompt's chunk; the low prompt goes on in later chunks, and
// both give the tokens they give alone. fcfs: the arrival waits for a step with budget left.
TEST(Engine, PriorityArrivalTakesTheStepsTokensFromALowerPriorityPrompt) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  std::vector<int32_t> low_prompt = m->tokenizer()->encode(story + story + story + story + story + story, true, false);
  ASSERT_GE(low_prompt.size(), 120u);
  low_prompt.resize(120);
  std::vector<int32_t> high_prompt = make_prompts(*m, 2)[1];
  ASSERT_GE(high_prompt.size(), 20u);
  high_prompt.resize(20);  // fits one step's budget of 32
  const auto want = alone(*m, {low_prompt, high_prompt}, 8);
  int steps_to_first[2][2] = {};  // [priority policy][async]
  for (SchedulingPolicy policy : {SchedulingPolicy::Priority, SchedulingPolicy::Fcfs}) {
    for (bool async : {false, true}) {
      const bool prio = policy == SchedulingPolicy::Priority;
      SCOPED_TRACE(std::string(prio ? "priority" : "fcfs") + (async ? ", async" : ""));
      EngineConfig c = small_config(16, true);
      c.scheduler.policy = policy;
      c.scheduler.max_num_batched_tokens = 32;
      c.async_scheduling = async ? AsyncScheduling::On : AsyncScheduling::Off;
      Engine e(*m, c);
      Request low = greedy(low_prompt, 8);
      low.priority = 5;
      const int64_t id_low = e.add_request(low);
      e.step();  // the low prompt's first chunk (32 of 120 tokens)
      Request high = greedy(high_prompt, 8);
      high.priority = 0;
      const int64_t id_high = e.add_request(high);
      // Steps until the high request's first token is out, counted from its arrival.
      int steps = 0;
      while (e.sequence(id_high)->n_generated() == 0 && steps < 100) {
        e.step();
        ++steps;
      }
      steps_to_first[prio][async] = steps;
      EXPECT_EQ(e.stats().priority_reclaimed_chunks > 0, prio);
      EXPECT_EQ(e.stats().preemptions, 0);
      for (int guard = 0; e.has_work() && guard < 10000; ++guard) e.step();
      for (auto [id, w] : {std::pair{id_low, want[0]}, std::pair{id_high, want[1]}}) {
        const Sequence* s = e.sequence(id);
        EXPECT_EQ(std::vector<int32_t>(s->tokens.begin() + s->n_prompt, s->tokens.end()), w) << "request " << id;
      }
    }
  }
  // Synchronous steps: 1 with the reclaimed tokens; fcfs: two more chunks of the low prompt (64
  // of the 88 left), then its last 24 beside the first 8 of the high one, then the high one's last 12.
  EXPECT_EQ(steps_to_first[1][0], 1);
  EXPECT_EQ(steps_to_first[0][0], 4);
  // Async scheduling launches steps ahead, so the counts differ; the order does not.
  EXPECT_LT(steps_to_first[1][1], steps_to_first[0][1]);
}

// A higher-priority arrival does not take the chunk of a lower-priority prompt that another
// waiting request is waiting on for its shared prefix (else a stream of such arrivals would starve
// both): once a waiting request is passed over for a prefix being computed, nothing more is
// reclaimed in that step.
TEST(Engine, PriorityReclaimLeavesAPrefixBeingWaitedOnToItsProvider) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  std::vector<int32_t> provider = m->tokenizer()->encode(story + story + story + story + story + story, true, false);
  ASSERT_GE(provider.size(), 120u);
  provider.resize(120);
  const auto prompts = make_prompts(*m, 2);
  std::vector<int32_t> sharer(provider.begin(), provider.begin() + 64);  // 4 whole blocks of the provider's prompt
  sharer.insert(sharer.end(), prompts[1].begin() + 1, prompts[1].end());
  std::vector<int32_t> other = prompts[1];
  other.resize(20);
  EngineConfig c = small_config(16, true);
  c.scheduler.policy = SchedulingPolicy::Priority;
  c.scheduler.max_num_batched_tokens = 32;
  Engine e(*m, c);
  Request low = greedy(provider, 4);
  low.priority = 5;
  const int64_t id_low = e.add_request(low);
  e.step();  // the provider's first chunk
  ASSERT_EQ(e.sequence(id_low)->n_computed, 32);
  Request w = greedy(sharer, 4), x = greedy(other, 4);
  w.priority = x.priority = 0;
  const int64_t id_w = e.add_request(w);
  const int64_t id_x = e.add_request(x);
  e.step();
  EXPECT_EQ(e.sequence(id_w)->state, SeqState::Waiting);  // waits for the provider's blocks
  EXPECT_EQ(e.sequence(id_low)->n_computed, 64) << "the provider's chunk was taken";
  EXPECT_EQ(e.stats().priority_reclaimed_chunks, 0);
  EXPECT_GT(e.stats().prefix_waits, 0);
  for (int guard = 0; e.has_work() && guard < 10000; ++guard) e.step();
  for (int64_t id : {id_low, id_w, id_x}) EXPECT_EQ(e.sequence(id)->n_generated(), 4) << "request " << id;
}

TEST(Engine, PreemptionUnderASmallBudgetLosesNothing) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  auto prompts = make_prompts(*m, 64);
  const int32_t n = 48;
  EngineConfig big = small_config(16, true);
  big.scheduler.max_num_batched_tokens = 256;
  Engine e_big(*m, big);
  auto want = run_all(e_big, prompts, n);

  // Speculative drafts too: a preempted sequence's draft is not recomputed as its own.
  for (bool prefix : {true, false})
    for (bool spec : {false, true}) {
      EngineConfig small = big;
      small.max_model_len = 160;  // room for about three sequences of 160 tokens
      small.kv_cache_bytes = m->kv_layout().bytes_per_token() * 16 * 32;
      small.prefix_caching = prefix;
      if (spec) small.speculative = {5, 1, 3};
      Engine e(*m, small);
      EXPECT_EQ(e.capacity().n_blocks, 32);
      auto got = run_all(e, prompts, n);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
      EXPECT_GT(e.stats().preemptions, 0) << "the budget was meant to force preemption";
      EXPECT_EQ(e.stats().finished, 64);
      if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
      EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks()) << "blocks leaked";
    }
}

// The requests make(0..count) through an engine without drafts ([0]) and one with `spec` ([1]),
// the block invariants checked after every step: each request's tokens and finish reason.
struct PlainAndDrafted {
  std::vector<std::vector<int32_t>> tokens[2];
  std::vector<std::string> finish[2];
};
PlainAndDrafted plain_and_drafted(Model& m, size_t count, SpeculativeConfig spec, const std::function<Request(size_t)>& make) {
  PlainAndDrafted out;
  for (int with = 0; with < 2; ++with) {
    EngineConfig c = small_config(16, true);
    if (with) c.speculative = spec;
    Engine e(m, c);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < count; ++i) ids.push_back(e.add_request(make(i)));
    while (e.has_work()) {
      e.step();
      check_block_ownership(e);
      if (::testing::Test::HasFatalFailure()) return out;
    }
    for (int64_t id : ids) {
      const Sequence* s = e.sequence(id);
      out.tokens[with].emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
      out.finish[with].push_back(s->finish_reason);
    }
    if (with) {
      EXPECT_GT(e.stats().speculative.accepted_tokens, 0);
    }
    if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
    EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks()) << "blocks leaked";
  }
  return out;
}

// Sampled requests (drafts sampled where the logits are, or on the host under a penalty): a seed
// gives the tokens of plain decoding, since token j always uses the sampler's draw j.
TEST(Engine, SpeculativeDecodingSamplesThePlainTokensForASeed) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  auto prompts = make_prompts(*m, 8);
  const PlainAndDrafted r = plain_and_drafted(*m, prompts.size(), {4, 1, 3}, [&](size_t i) {
    Request q = greedy(prompts[i], 80);
    q.sampling.temperature = 0.7f;
    q.sampling.seed = 100 + i;
    q.sampling.repetition_penalty = i % 2 ? 1.2f : 1.0f;
    q.stop_at_eog = false;
    return q;
  });
  ASSERT_EQ(r.tokens[1].size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(r.tokens[1][i], r.tokens[0][i]) << "prompt " << i;
}

// A stop token (or the end-of-generation token) among a draft's kept tokens ends the sequence
// there, as in plain decoding: the prompts hold "." (id 426), which the stories repeat, so drafts
// carry it.
TEST(Engine, SpeculativeDecodingStopsAtAStopTokenInsideADraft) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  auto prompts = make_prompts(*m, 16);
  const PlainAndDrafted r = plain_and_drafted(*m, prompts.size(), {6, 1, 3}, [&](size_t i) {
    Request q = greedy(prompts[i], 60);
    if (i % 2) q.stop_token_ids = {426};
    q.stop_at_eog = i % 4 != 3;
    return q;
  });
  ASSERT_EQ(r.tokens[1].size(), prompts.size());
  int stopped = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(r.tokens[1][i], r.tokens[0][i]) << "prompt " << i;
    EXPECT_EQ(r.finish[1][i], r.finish[0][i]) << "prompt " << i;
    stopped += r.finish[0][i] == "stop";
  }
  EXPECT_GT(stopped, 4) << "the stop token was meant to end most of the odd requests";
}

// Log-probabilities of the tokens a verification keeps come from their own rows.
TEST(Engine, SpeculativeDecodingReportsEachTokensLogprob) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  auto prompt = make_prompts(*m, 1)[0];
  std::vector<std::vector<StepOutput>> outs(2);
  for (int spec = 0; spec < 2; ++spec) {
    EngineConfig c = small_config(16, true);
    if (spec) c.speculative = {4, 1, 3};
    Engine e(*m, c);
    Request r = greedy(prompt, 50);
    r.logprobs = 2;
    e.add_request(r);
    while (e.has_work())
      for (StepOutput& o : e.step())
        if (o.token >= 0) outs[static_cast<size_t>(spec)].push_back(o);
    if (spec) {
      EXPECT_GT(e.stats().speculative.accepted_tokens, 0);
    }
  }
  // Steps that depend on the draft before them cannot be launched ahead.
  EngineConfig ahead = small_config(16, true);
  ahead.speculative = {4, 1, 3};
  ahead.async_scheduling = AsyncScheduling::On;
  EXPECT_THROW(Engine(*m, ahead), Error);
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t i = 0; i < outs[0].size(); ++i) {
    EXPECT_EQ(outs[1][i].token, outs[0][i].token) << i;
    EXPECT_NEAR(outs[1][i].logprob, outs[0][i].logprob, 1e-3) << i;
    ASSERT_EQ(outs[1][i].top_logprobs.size(), 2u);
    EXPECT_EQ(outs[1][i].top_logprobs[0].first, outs[0][i].top_logprobs[0].first) << i;
  }
}

TEST(Engine, CapacityPlanningArithmetic) {
  // GQA: Llama-3.2-1B (16 layers, 8 KV heads x 64) -> 2 * 16 * 512 * 4 = 65536 B/token.
  KvLayout gqa{16, 8 * 64, 8 * 64};
  EXPECT_EQ(gqa.bytes_per_token(), 65536);
  KvCapacity c = plan_kv_cache(gqa, 16, int64_t{1} << 30, 4096, 256);
  EXPECT_EQ(c.n_blocks, (int64_t{1} << 30) / (65536 * 16));  // 1024 blocks
  EXPECT_EQ(c.tokens(), 16384);
  EXPECT_EQ(c.seqs_at_max_len, 4);
  // Capped at max_num_seqs full sequences.
  EXPECT_EQ(plan_kv_cache(gqa, 16, int64_t{1} << 30, 4096, 2).n_blocks, 512);
  // F16 (or BF16) values: half the bytes per token, twice the blocks for the same budget.
  KvLayout gqa16 = gqa;
  gqa16.dtype = DType::F16;
  EXPECT_EQ(gqa16.bytes_per_token(), 32768);
  KvCapacity c16 = plan_kv_cache(gqa16, 16, int64_t{1} << 30, 4096, 256);
  EXPECT_EQ(c16.n_blocks, 2048);
  EXPECT_EQ(c16.tokens(), 32768);
  EXPECT_EQ(c16.seqs_at_max_len, 8);
  EXPECT_NE(c16.describe().find("1 GiB F16 = 2048 blocks of 16 tokens (32768 tokens, 32768 B/token); 8 sequences"),
            std::string::npos)
      << c16.describe();
  // MLA latent: DeepSeek-V3 (61 layers, 512 + 64 per token, no V rows).
  KvLayout mla{61, 512 + 64, 0};
  EXPECT_EQ(mla.bytes_per_token(), 61 * 576 * 4);
  KvCapacity d = plan_kv_cache(mla, 64, int64_t{8} << 30, 32768, 1000);
  EXPECT_EQ(d.n_blocks, (int64_t{8} << 30) / (61 * 576 * 4 * 64));
  EXPECT_EQ(d.seqs_at_max_len, d.n_blocks / 512);
  KvLayout mla16 = mla;
  mla16.dtype = DType::BF16;
  EXPECT_EQ(mla16.bytes_per_token(), 61 * 576 * 2);
  EXPECT_EQ(plan_kv_cache(mla16, 64, int64_t{8} << 30, 32768, 1000).n_blocks, (int64_t{8} << 30) / (61 * 576 * 2 * 64));
  // A max-model-len that cannot fit is refused with the numbers.
  try {
    plan_kv_cache(gqa, 16, 100 << 20, 4096, 8);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("104857600 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--max-model-len 4096"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1600 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("256 blocks"), std::string::npos) << msg;
  }
  EXPECT_THROW(plan_kv_cache(gqa, 24, int64_t{1} << 30, 4096, 8), Error);  // not a supported page size
  EXPECT_EQ(parse_bytes("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_bytes("1000"), 1000);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("5 parsecs"), Error);
}

TEST(Engine, EngineRefusesAMaxModelLenThatCannotFit) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  EngineConfig c = small_config(16, true);
  c.kv_cache_bytes = m->kv_layout().bytes_per_token() * 100;
  c.max_model_len = 512;
  try {
    Engine e(*m, c);
    FAIL() << "expected a refusal";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--max-model-len 512"), std::string::npos) << err.what();
  }
}

// A forked sequence shares its parent's blocks; its first write into the shared partial block
// copies that block (K and V, every layer) — in each KV dtype.
void check_copy_on_write(DType dt) {
  KvPool pool(KvLayout{2, 4, 4, dt}, 4, 8);
  BlockManager bm(pool, false);
  BlockTable parent, child;
  ASSERT_TRUE(bm.ensure(parent, 0, 6));  // 2 blocks, the second partial
  // The second block's 4 slots get K rows 0..15 and V rows 100..115 (exact in every dtype).
  std::vector<float> k_rows(16), v_rows(16);
  std::vector<int64_t> slots;
  for (size_t i = 0; i < 16; ++i) {
    k_rows[i] = static_cast<float>(i);
    v_rows[i] = 100.0f + static_cast<float>(i);
  }
  for (int64_t t = 0; t < 4; ++t) slots.push_back(parent.blocks[1] * 4 + t);
  for (int64_t l = 0; l < 2; ++l) pool.write(l, slots.data(), 4, k_rows.data(), v_rows.data());
  bm.fork(parent, child);
  EXPECT_EQ(pool.blocks().refcount(parent.blocks[0]), 2);
  // The child writes position 6 (inside the shared partial block): it gets a copy of it.
  ASSERT_TRUE(bm.ensure(child, 6, 7));
  EXPECT_EQ(child.blocks[0], parent.blocks[0]);  // the full block stays shared
  EXPECT_NE(child.blocks[1], parent.blocks[1]);
  EXPECT_EQ(pool.blocks().refcount(parent.blocks[1]), 1);
  for (int64_t t = 0; t < 4; ++t) {
    float k[4], v[4];
    pool.read(1, child.blocks[1] * 4 + t, k, v);
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(k[j], k_rows[static_cast<size_t>(t * 4 + j)]);
      EXPECT_EQ(v[j], v_rows[static_cast<size_t>(t * 4 + j)]);
    }
  }
  bm.release(child);
  bm.release(parent);
  EXPECT_EQ(pool.blocks().n_free(), 8);
}

TEST(Engine, CopyOnWriteForkedSequences) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    check_copy_on_write(dt);
  }
}

TEST(Engine, RandomisedSchedulingKeepsItsInvariants) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3; ++trial) {
    EngineConfig c;
    c.page_size = std::vector<int64_t>{1, 8, 16, 32}[static_cast<size_t>(trial) % 4];
    c.max_model_len = 128;
    c.kv_cache_bytes = m->kv_layout().bytes_per_token() * (160 + 100 * trial);
    c.scheduler.max_num_batched_tokens = 24 + 40 * trial;
    c.scheduler.max_num_seqs = 3 + 5 * trial;
    c.prefix_caching = trial != 1;
    if (trial != 1) c.speculative = {4, 1, 3};  // drafts trimmed by small budgets, dropped on preemption
    Engine e(*m, c);
    std::set<int64_t> live, cancelled;
    std::vector<int64_t> all;
    auto vocab = std::uniform_int_distribution<int32_t>(3, 511);
    int arrivals = 0;
    for (int step = 0; step < 4000 && (arrivals < 60 || e.has_work()); ++step) {
      // Random arrivals (some sharing a prefix), random cancellations.
      if (arrivals < 60 && rng() % 3 == 0) {
        std::vector<int32_t> p{1};
        const int len = 1 + static_cast<int>(rng() % 70);
        const bool shared = rng() % 2;
        for (int i = 0; i < len; ++i) p.push_back(shared && i < 40 ? 10 + i : vocab(rng));
        Request r = greedy(p, 1 + static_cast<int32_t>(rng() % 40));
        r.stop_at_eog = false;
        const int64_t id = e.add_request(r);
        live.insert(id);
        all.push_back(id);
        ++arrivals;
      }
      if (!live.empty() && rng() % 17 == 0) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        if (e.cancel(*it)) cancelled.insert(*it);
        live.erase(it);
      }
      for (const StepOutput& o : e.step())
        if (o.finished) live.erase(o.id);
      check_block_ownership(e);
      if (HasFatalFailure()) return;
      ASSERT_LE(e.stats().last_step_tokens, c.scheduler.max_num_batched_tokens);
      ASSERT_LE(e.scheduler().n_running(), c.scheduler.max_num_seqs);
    }
    EXPECT_FALSE(e.has_work());
    if (c.speculative.enabled()) {
      EXPECT_GT(e.stats().speculative.drafts, 0) << "trial " << trial;
    }
    for (int64_t id : all) {
      const Sequence* s = e.sequence(id);
      ASSERT_TRUE(s);
      EXPECT_EQ(s->state, SeqState::Finished) << "request " << id;
      if (cancelled.count(id)) {
        EXPECT_EQ(s->finish_reason, "cancelled");
      } else {
        EXPECT_EQ(s->finish_reason, "length");
        EXPECT_EQ(s->n_generated(), s->req.max_new_tokens);
      }
    }
    if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
    EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks());
  }
}

// The partitioned pool of data-parallel attention: block b lies in partition b % parts, each
// rank stores only its partition (at b / parts), a copy is a no-op where the block is not stored.
// Window trimming in the block manager alone (layers 0 and 2 of 3 windowed, window 6, pages of
// 4): a table gives its window blocks back as write_from passes them; a released table's window
// blocks whose main blocks are in the prefix tree are kept and serve a hit, which is shortened
// to the prefix whose last window is kept; when the tree evicts a main block its kept window
// block goes too, so a recycled main block id never meets a stale window.
TEST(WindowTrimming, BlockManagerGivesBackKeepsAndForgets) {
  KvLayout layout{3, 2, 2};
  layout.windowed = {true, false, true};
  layout.window = 6;
  KvPool pool(layout, 4, 8, Device::CPU, {}, 9);  // window block 0: the zero block
  ASSERT_TRUE(pool.trims_windows());
  EXPECT_TRUE(pool.in_window_blocks(0) && !pool.in_window_blocks(1) && pool.in_window_blocks(2));
  EXPECT_EQ(pool.layer_slots(0), 9 * 4);
  EXPECT_EQ(pool.layer_slots(1), 8 * 4);
  EXPECT_EQ(pool.bytes(), (2 * 9 + 8) * 4 * 4 * 4);
  EXPECT_EQ(pool.window_blocks().refcount(KvPool::kZeroWindowBlock), 1);
  float k[2], v[2];
  pool.read(0, 3, k, v);  // the zero block holds zeros
  EXPECT_EQ(k[0], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
  BlockManager bm(pool, true);
  EXPECT_EQ(bm.n_window_available(), 8);
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[static_cast<size_t>(i)] = 100 + i;
  BlockTable a;
  ASSERT_TRUE(bm.ensure(a, 0, 12));  // a prompt of 12: 3 blocks each
  EXPECT_EQ(a.window.size(), 3u);
  bm.register_computed(a, tokens.data(), 12);
  ASSERT_TRUE(bm.ensure(a, 12, 13));  // decode at 12 sees 7..12: blocks 1.. (block 0 given back, kept)
  EXPECT_EQ(a.window[0], -1);
  EXPECT_GE(a.window[1], 0);
  EXPECT_EQ(bm.n_window_kept(), 1);
  bm.register_computed(a, tokens.data(), 13);
  ASSERT_TRUE(bm.ensure(a, 16, 17));  // at 16 sees 11..: block 1 (4..7) given back too
  EXPECT_EQ(a.window[1], -1);
  EXPECT_EQ(bm.n_window_kept(), 2);
  bm.register_computed(a, tokens.data(), 16);
  bm.release(a);  // the windows of blocks 2 and 3 (registered) kept, block 4's freed
  EXPECT_EQ(bm.n_window_kept(), 4);
  // A prompt of the same 20 tokens: 4 whole cached blocks (at most (20-1)/4), resuming at 16 needs
  // the windows of blocks 2 and 3 (positions 11..15): kept, so the hit is all 16.
  BlockTable b;
  EXPECT_EQ(bm.attach_prefix(b, tokens.data(), 20), 16);
  EXPECT_EQ(b.window, (std::vector<int32_t>{-1, -1, b.window[2], b.window[3]}));
  EXPECT_GE(b.window[2], 1);
  bm.release(b);
  EXPECT_EQ(bm.n_window_kept(), 4);
  // The tree evicts its leaf, block 3: its kept window goes, and the hit shrinks to 12 (resuming
  // at 12 needs the windows of blocks 1 and 2, both kept).
  PrefixCache* tree = bm.prefix_cache();
  ASSERT_TRUE(tree->evict_one());
  EXPECT_EQ(bm.n_window_kept(), 3);
  BlockTable c;
  EXPECT_EQ(bm.attach_prefix(c, tokens.data(), 20), 12);
  EXPECT_EQ(c.window.size(), 3u);
  EXPECT_EQ(c.window[0], -1);
  EXPECT_GE(c.window[1], 1);
  bm.release(c);
  // Evict every main block the tree holds (no table holds them): the kept windows go with them.
  while (tree->evict_one()) {
  }
  EXPECT_EQ(bm.n_window_kept(), 0);
  EXPECT_EQ(bm.n_window_available(), 8);
  EXPECT_EQ(pool.window_blocks().n_free(), 8);
  EXPECT_EQ(pool.blocks().n_free(), 8);
  BlockTable d;
  EXPECT_EQ(bm.attach_prefix(d, tokens.data(), 20), 0);
}

TEST(PartitionedKvPool, AllocatesStoresAndCopiesByPartition) {
  BlockAllocator a(10, 2);
  EXPECT_EQ(a.parts(), 2);
  EXPECT_EQ(a.n_free(), 10);
  EXPECT_EQ(a.n_free(0), 5);
  EXPECT_EQ(a.allocate(1), 1);  // lowest id of partition 1 first
  EXPECT_EQ(a.allocate(1), 3);
  EXPECT_EQ(a.allocate(0), 0);
  EXPECT_EQ(a.n_free(), 7);
  EXPECT_EQ(a.n_free(1), 3);
  EXPECT_TRUE(a.unref(1));
  EXPECT_EQ(a.allocate(1), 1);
  for (int i = 0; i < 3; ++i) EXPECT_GE(a.allocate(1), 0);
  EXPECT_EQ(a.allocate(1), -1);  // partition 1 is full while partition 0 has 4 free
  EXPECT_EQ(a.n_free(0), 4);
  EXPECT_THROW(a.allocate(2), Error);
  EXPECT_THROW(BlockAllocator(4, 0), Error);

  const KvLayout layout{2, 3, 0};
  KvPool whole(layout, 4, 8);
  KvPool r0(layout, 4, 8, Device::CPU, KvPartition{2, 0}), r1(layout, 4, 8, Device::CPU, KvPartition{2, 1});
  EXPECT_EQ(r1.n_blocks(), 8);
  EXPECT_EQ(r1.storage_blocks(), 4);
  EXPECT_EQ(r1.bytes() * 2, whole.bytes());
  EXPECT_EQ(r1.storage_block(5), 2);
  EXPECT_EQ(r0.storage_block(6), 3);
  EXPECT_EQ(whole.storage_block(5), 5);
  EXPECT_THROW(r0.storage_block(5), Error);  // rank 1 stores block 5
  EXPECT_THROW(KvPool(layout, 4, 7, Device::CPU, KvPartition{2, 0}), Error);  // 7 blocks do not split 2 ways
  EXPECT_THROW(KvPool(layout, 4, 8, Device::CPU, KvPartition{2, 2}), Error);
  // Block 5 -> 7 (both partition 1): rank 1 copies its storage block 2 to 3, rank 0 does nothing.
  std::vector<int64_t> slots;
  std::vector<float> rows;
  for (int64_t t = 0; t < 4; ++t) {
    slots.push_back(2 * 4 + t);
    for (int j = 0; j < 3; ++j) rows.push_back(static_cast<float>(10 * t + j));
  }
  for (int64_t l = 0; l < 2; ++l) r1.write(l, slots.data(), 4, rows.data(), nullptr);
  EXPECT_THROW(r1.write(0, std::vector<int64_t>{16}.data(), 1, rows.data(), nullptr), Error);  // past its 16 slots
  r0.record_copies(true);
  r0.copy_block(5, 7);
  r1.copy_block(5, 7);
  EXPECT_EQ(r0.take_copies(), (std::vector<int32_t>{5, 7}));  // still sent to the other ranks
  EXPECT_THROW(r1.copy_block(5, 6), Error);  // across partitions
  for (int64_t t = 0; t < 4; ++t) {
    float k[3];
    r1.read(1, 3 * 4 + t, k, nullptr);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(k[j], rows[static_cast<size_t>(t * 3 + j)]);
  }
}

TEST(PartitionedKvPool, TablesStayInOnePartitionChosenByFreeBlocks) {
  KvPool pool(KvLayout{1, 4, 4}, 4, 12, Device::CPU, KvPartition{3, 0});
  BlockManager bm(pool, false);
  BlockTable a, b, c, d;
  EXPECT_EQ(bm.partition_of(a), -1);
  ASSERT_TRUE(bm.ensure(a, 0, 9));  // 3 blocks from partition 0 (all tie; the lowest wins)
  EXPECT_EQ(a.blocks, (std::vector<int32_t>{0, 3, 6}));
  ASSERT_TRUE(bm.ensure(b, 0, 2));  // partitions 1 and 2 have 4 free: 1
  EXPECT_EQ(bm.partition_of(b), 1);
  ASSERT_TRUE(bm.ensure(c, 0, 5));
  EXPECT_EQ(bm.partition_of(c), 2);
  ASSERT_TRUE(bm.ensure(b, 1, 13));  // b grows within partition 1: all 4 of its blocks
  EXPECT_EQ(b.blocks, (std::vector<int32_t>{1, 4, 7, 10}));
  EXPECT_FALSE(bm.ensure(b, 13, 17));  // partition 1 is full, though 3 blocks are free elsewhere
  EXPECT_EQ(bm.n_free(), 3);
  ASSERT_TRUE(bm.ensure(d, 0, 8));  // the freer partition 2 (2 free) over partition 0 (1 free)
  EXPECT_EQ(bm.partition_of(d), 2);
  // A fork shares blocks; its copy-on-write comes from the same partition.
  BlockTable e;
  bm.release(d);
  bm.fork(c, e);
  ASSERT_TRUE(bm.ensure(e, 4, 6));
  EXPECT_EQ(bm.partition_of(e), 2);
  EXPECT_NE(e.blocks[1], c.blocks[1]);
  EXPECT_EQ(e.blocks[1] % 3, 2);
  for (BlockTable* t : {&a, &b, &c, &e}) bm.release(*t);
  EXPECT_EQ(bm.n_free(), 12);
}

// Prefix caching over a partitioned pool: one tree per partition; a prompt goes to the partition
// that keeps the most blocks obtainable once it is placed, its cached prefix there counting as
// blocks it need not take; a partition's cached blocks are evicted only for that partition.
TEST(PartitionedKvPool, PrefixTreePerPartitionDrawsPromptsToTheirPrefix) {
  KvPool pool(KvLayout{1, 4, 4}, 4, 12, Device::CPU, KvPartition{2, 0});  // 6 blocks a partition
  BlockManager bm(pool, true);
  ASSERT_TRUE(bm.prefix_cache(0) && bm.prefix_cache(1));
  std::vector<int32_t> prompt(13), other(13);
  for (int i = 0; i < 13; ++i) prompt[static_cast<size_t>(i)] = 100 + i, other[static_cast<size_t>(i)] = 500 + i;
  BlockTable a, b, c, d, e;
  EXPECT_EQ(bm.attach_prefix(a, prompt.data(), 13), 0);  // nothing cached anywhere
  ASSERT_TRUE(bm.ensure(a, 0, 13));                       // partition 0 (tie, the lowest)
  EXPECT_EQ(bm.partition_of(a), 0);
  bm.register_computed(a, prompt.data(), 13);             // its 3 full blocks into tree 0
  EXPECT_EQ(bm.prefix_cache(0)->n_cached(), 3);
  EXPECT_EQ(bm.prefix_cache(1)->n_cached(), 0);
  // The same prompt: partition 0 keeps 2 obtainable + 3 cached = 5, partition 1 keeps 6: the
  // emptier partition 1 wins and computes the prompt itself (which caches it there too).
  EXPECT_EQ(bm.attach_prefix(b, prompt.data(), 13), 0);
  ASSERT_TRUE(bm.ensure(b, 0, 13));
  EXPECT_EQ(bm.partition_of(b), 1);
  bm.register_computed(b, prompt.data(), 13);
  // Now both hold it and have 2 free: a tie on score and length, the lowest partition; the 3
  // blocks are a's own.
  EXPECT_EQ(bm.attach_prefix(c, prompt.data(), 13), 12);
  EXPECT_EQ(bm.partition_of(c), 0);
  EXPECT_EQ(c.blocks, std::vector<int32_t>(a.blocks.begin(), a.blocks.begin() + 3));
  ASSERT_TRUE(bm.ensure(c, 12, 14));  // its last token in a block of its own, from partition 0
  EXPECT_EQ(c.blocks.back() % 2, 0);
  // A different prompt: partition 1 (2 free) over partition 0 (1 free): no hit.
  EXPECT_EQ(bm.attach_prefix(d, other.data(), 13), 0);
  ASSERT_TRUE(bm.ensure(d, 0, 5));
  EXPECT_EQ(bm.partition_of(d), 1);
  // Released, a's and c's blocks stay cached in tree 0 (evictable): partition 0 has 6 blocks
  // obtainable (3 free + 3 cached); e (another prompt, 5 blocks) goes there, evicting tree 0's
  // blocks and none of tree 1's.
  bm.release(a);
  bm.release(c);
  EXPECT_EQ(bm.n_available(0), 6);
  EXPECT_EQ(bm.n_available(1), 0);  // b (4 blocks) and d (2) hold all of partition 1
  std::vector<int32_t> third(20, 7);
  EXPECT_EQ(bm.attach_prefix(e, third.data(), 20), 0);
  ASSERT_TRUE(bm.ensure(e, 0, 20));
  EXPECT_EQ(bm.partition_of(e), 0);
  for (int32_t blk : e.blocks) EXPECT_EQ(blk % 2, 0);
  EXPECT_LE(bm.prefix_cache(0)->n_cached(), 1);
  EXPECT_EQ(bm.prefix_cache(1)->n_cached(), 3);
  EXPECT_EQ(bm.prefix_hit_tokens(), 12);
  EXPECT_GT(bm.prefix_lookup_tokens(), 12);
  for (BlockTable* t : {&b, &d, &e}) bm.release(*t);
  bm.prefix_cache(0)->clear();
  bm.prefix_cache(1)->clear();
  EXPECT_EQ(bm.n_free(), 12);
}

// A capacity plan for data-parallel attention: the budget is each rank's, the pool has `ranks`
// times the blocks, and one sequence must fit in one rank's partition.
TEST(PartitionedKvPool, CapacityIsPerRankTimesRanks) {
  KvLayout mla{61, 512 + 64, 0};
  const int64_t per_rank = (int64_t{8} << 30) / (61 * 576 * 4 * 64);
  KvCapacity c = plan_kv_cache(mla, 64, int64_t{8} << 30, 32768, 1000, 4);
  EXPECT_EQ(c.partitions, 4);
  EXPECT_EQ(c.n_blocks, per_rank * 4);
  EXPECT_EQ(c.seqs_at_max_len, per_rank / 512 * 4);
  EXPECT_NE(c.describe().find("per rank; data-parallel attention: 4 ranks hold " + std::to_string(per_rank * 4) + " blocks"),
            std::string::npos)
      << c.describe();
  // Capped at max_num_seqs sequences over all ranks: 3 over 4 ranks -> 1 per rank.
  EXPECT_EQ(plan_kv_cache(mla, 64, int64_t{8} << 30, 32768, 3, 4).n_blocks, 512 * 4);
  // One rank's budget must hold a sequence, whatever the ranks hold together.
  EXPECT_THROW(plan_kv_cache(mla, 64, int64_t{8} << 30, per_rank * 64 + 64, 1000, 4), Error);
}

// The scheduler over a partitioned pool, driven without a model, with and without prefix caching:
// random arrivals, lengths and cancellations; after every step each table lies in one partition,
// each prefix tree holds only its partition's blocks, reference counts match the tables and the
// trees, the token budget and sequence cap hold; preemption (of the newest sequence of the
// partition that ran out) loses nothing: every request completes and the pool ends free.
TEST(PartitionedKvPool, RandomisedSchedulingKeepsItsInvariants) {
  std::mt19937 rng(99);
  for (bool prefix_caching : {false, true})
  for (int parts : {2, 3}) {
    SCOPED_TRACE(std::to_string(parts) + (prefix_caching ? " partitions, prefix caching" : " partitions"));
    KvPool pool(KvLayout{1, 2, 2}, 8, 12 * parts, Device::CPU, KvPartition{parts, 0});
    BlockManager bm(pool, prefix_caching);
    SchedulerConfig sc;
    sc.max_num_batched_tokens = 40;
    sc.max_num_seqs = 10;
    Scheduler sched(sc, bm);
    std::vector<std::unique_ptr<Sequence>> seqs;
    int64_t preemptions = 0, arrivals = 0, cancelled = 0;
    for (int step = 0; step < 20000 && (arrivals < 80 || !sched.empty()); ++step) {
      if (arrivals < 80 && rng() % 2 == 0) {
        auto s = std::make_unique<Sequence>();
        s->id = arrivals;
        s->arrival = arrivals++;
        s->tokens.assign(1 + rng() % 50, 5);  // prompts of one token: shared prefixes
        s->n_prompt = static_cast<int64_t>(s->tokens.size());
        s->req.max_new_tokens = 1 + static_cast<int32_t>(rng() % 40);  // at most 90 tokens: 12 blocks of 8
        sched.add(s.get());
        seqs.push_back(std::move(s));
      }
      if (rng() % 23 == 0 && !sched.running().empty()) {  // cancel a running sequence
        Sequence* s = sched.running()[rng() % sched.running().size()];
        sched.remove(s);
        s->state = SeqState::Finished;
        ++cancelled;
      }
      const std::vector<ScheduledSeq> batch = sched.schedule();
      int64_t tokens = 0;
      for (const ScheduledSeq& x : batch) tokens += x.n_tokens;
      ASSERT_LE(tokens, sc.max_num_batched_tokens);
      ASSERT_LE(sched.n_running(), sc.max_num_seqs);
      sched.commit(batch);
      for (const ScheduledSeq& x : batch) {
        Sequence* s = x.seq;
        if (!x.samples) continue;
        s->tokens.push_back(7);
        if (s->n_generated() >= s->req.max_new_tokens) {
          sched.remove(s);
          s->state = SeqState::Finished;
        }
      }
      preemptions = sched.stats().preemptions;
      std::vector<int32_t> owners(static_cast<size_t>(pool.n_blocks()), 0);
      for (const auto& s : seqs) {
        for (int32_t b : s->table.blocks) {
          ++owners[static_cast<size_t>(b)];
          ASSERT_EQ(b % parts, s->table.blocks[0] % parts) << "sequence " << s->id << " spans partitions";
        }
        if (s->state == SeqState::Running) {
          ASSERT_GE(static_cast<int64_t>(s->table.blocks.size()) * 8, s->n_computed);
        }
      }
      for (int p = 0; prefix_caching && p < parts; ++p)  // each tree holds blocks of its own partition
        for (int32_t b : bm.prefix_cache(p)->cached_blocks()) {
          ++owners[static_cast<size_t>(b)];
          ASSERT_EQ(b % parts, p) << "tree " << p << " holds block " << b;
        }
      for (int32_t b = 0; b < pool.n_blocks(); ++b) ASSERT_EQ(pool.blocks().refcount(b), owners[static_cast<size_t>(b)]);
    }
    if (prefix_caching) {
      EXPECT_GT(bm.prefix_hit_tokens(), 0);
      for (int p = 0; p < parts; ++p) bm.prefix_cache(p)->clear();
    }
    EXPECT_TRUE(sched.empty());
    EXPECT_GT(preemptions, 0) << "the pool should be small enough to preempt";
    EXPECT_GT(cancelled, 0);
    for (const auto& s : seqs) {
      EXPECT_EQ(s->state, SeqState::Finished);
      EXPECT_TRUE(s->table.blocks.empty());
    }
    EXPECT_EQ(pool.blocks().n_free(), pool.n_blocks());
  }
}

}  // namespace
}  // namespace fp

namespace fp {
namespace {

// logit_bias: +100 makes a token the only greedy choice, -100 rules one out, and a moderate bias
// under seeded sampling gives the same tokens with and without speculative drafts (each draft
// row biased as plain decoding's row is).
TEST(Engine, LogitBiasShapesSamplingWithAndWithoutDrafts) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_stories();
  const std::vector<int32_t> prompt = m->tokenizer()->encode("Once upon a time, there was a little girl.", true, false);
  auto run = [&](const std::vector<std::pair<int32_t, float>>& bias, float temp, bool drafts) {
    EngineConfig c = small_config(16, false);
    if (drafts) c.speculative = {3, 1, 3};
    Engine e(*m, c);
    Request r = greedy(prompt, 24);
    r.sampling.temperature = temp;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = 5;
    r.logit_bias = bias;
    const int64_t id = e.add_request(r);
    while (e.has_work()) e.step();
    const Sequence* s = e.sequence(id);
    return std::vector<int32_t>(s->tokens.begin() + s->n_prompt, s->tokens.end());
  };
  const std::vector<int32_t> plain = run({}, 0, false);
  ASSERT_FALSE(plain.empty());
  const int32_t forced = plain[0] == 410 ? 411 : 410;
  EXPECT_EQ(run({{forced, 100.0f}}, 0, false), std::vector<int32_t>(24, forced));
  const std::vector<int32_t> without_first = run({{plain[0], -100.0f}}, 0, false);
  ASSERT_FALSE(without_first.empty());
  EXPECT_NE(without_first[0], plain[0]);
  std::vector<std::pair<int32_t, float>> moderate;
  for (int32_t t = 400; t < 440; ++t) moderate.push_back({t, 2.5f});
  const std::vector<int32_t> sampled = run(moderate, 1.0f, false);
  EXPECT_EQ(run(moderate, 1.0f, true), sampled);
  EXPECT_NE(sampled, run({}, 1.0f, false)) << "the bias changed nothing";
  // Out-of-vocabulary ids are refused by name.
  Engine e(*m, small_config(16, false));
  Request r = greedy(prompt, 4);
  r.logit_bias = {{m->config().n_vocab, 1.0f}};
  test::expect_error([&] { e.add_request(r); }, {"logit_bias", "outside the vocabulary"});
}

}  // namespace
}  // namespace fp
