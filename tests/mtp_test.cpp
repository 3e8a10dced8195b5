// tests/mtp_test.cpp — drafting with a model's multi-token-prediction layer (engine/mtp_drafter.h)
// on GLM-4.5- and DeepSeek-V3-shaped models with random weights: the draft layer's cache, kept
// step by step over whatever rows were kept or refused, gives the drafts a run over the whole
// sequence gives; `generate` and the engine with MTP drafts give plain decoding's tokens. (The
// layer's arithmetic is checked against a reference in hf_golden_test.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/mtp_drafter.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

// One multi-token-prediction layer after the model's, GGUF with the synth vocabulary.
std::string synth_with_mtp(const std::string& arch, const std::string& dir) {
  SynthOptions o;
  o.arch = arch;
  if (arch == "glm4_moe")
    o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"n_routed_experts", 8},
                {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}, {"n_shared_experts", 1},
                {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}, {"norm_topk_prob", true},
                {"routed_scaling_factor", 2.5}, {"attention_bias", true}, {"partial_rotary_factor", 0.5},
                {"num_nextn_predict_layers", 1}};
  else
    o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
                {"vocab_size", 512}, {"n_routed_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 48},
                {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"n_group", 4}, {"topk_group", 2},
                {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5}, {"q_lora_rank", 32}, {"kv_lora_rank", 32},
                {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}, {"num_nextn_predict_layers", 1}};
  o.seed = 41;
  o.out = dir + "/" + arch + "_mtp.gguf";
  synth_model(o);
  return o.out;
}

std::unique_ptr<Model> load_with_mtp(const std::string& path, bool mtp) {
  LoadOptions lo;
  lo.prefault = false;
  lo.mtp = mtp;
  return load_model(path, lo);
}

const char* const kArchs[] = {"glm4_moe", "deepseek_v3"};

// Steps of 1-4 fed tokens of which a random number are kept (the rest garbage that the next step
// writes over, as a refused draft's), the draft layer run over the kept rows each time: its
// drafts (chained up to 3 tokens) equal those of a fresh cache fed the whole sequence at once.
TEST(MtpDrafter, StepByStepDraftsEqualDraftsOverTheWholeSequence) {
  const std::string dir = test::temp_dir("mtp_drafter");
  for (const char* arch : kArchs) {
    auto m = load_with_mtp(synth_with_mtp(arch, dir), true);
    ASSERT_TRUE(m->has_mtp());
    const int64_t V = m->config().n_vocab;
    std::mt19937 rng(5);
    std::vector<int32_t> seq(60);
    for (auto& t : seq) t = 3 + static_cast<int32_t>(rng() % static_cast<uint32_t>(V - 3));
    auto cache = m->new_cache(64, 8);
    MtpDrafter drafter(*m);
    std::vector<float> logits(static_cast<size_t>(8 * V));
    std::vector<std::vector<int32_t>> step_drafts, whole_drafts;
    auto rows_of = [&](KvCache& c, int64_t start, int64_t n, const int32_t* next) {
      MtpRows r;
      r.n = n;
      r.next = next;
      r.start = static_cast<int32_t>(start);
      r.pages = c.pages.data();
      r.n_pages = static_cast<int64_t>(c.pages.size());
      r.max_draft = 3;
      return r;
    };
    auto positions = [](int64_t start, int64_t n) {
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(start + i);
      return pos;
    };
    int64_t p = 0, checks = 0, refused = 0;
    while (p + 6 < static_cast<int64_t>(seq.size())) {
      const int64_t fed = p == 0 ? 6 : 1 + static_cast<int64_t>(rng() % 4);
      const int64_t kept = p == 0 ? fed : 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(fed));
      std::vector<int32_t> feed(seq.begin() + p, seq.begin() + p + kept);
      while (static_cast<int64_t>(feed.size()) < fed) feed.push_back(3 + static_cast<int32_t>(rng() % 500));  // refused
      refused += fed - kept;
      cache->len = p;
      auto pos = positions(p, fed);
      m->forward(feed.data(), pos.data(), fed, *cache, logits.data(), true);
      drafter.run({rows_of(*cache, p, kept, seq.data() + p + 1)}, *cache->pool, step_drafts);
      p += kept;
      // The same sequence at once, in a fresh cache.
      auto whole = m->new_cache(64, 8);
      std::vector<float> all(static_cast<size_t>(p * V));
      auto wpos = positions(0, p);
      m->forward(seq.data(), wpos.data(), p, *whole, all.data(), true);
      drafter.run({rows_of(*whole, 0, p, seq.data() + 1)}, *whole->pool, whole_drafts);
      ASSERT_EQ(step_drafts[0].size(), 3u) << arch;
      EXPECT_EQ(step_drafts[0], whole_drafts[0]) << arch << ": after " << p << " tokens";
      ++checks;
    }
    EXPECT_GT(checks, 10) << arch;
    EXPECT_GT(refused, 10) << arch << ": the steps were meant to refuse rows";
  }
}

// generate with MTP drafts gives plain decoding's tokens, greedy and sampled with a seed.
TEST(MtpDrafter, GenerateGivesThePlainTokens) {
  const std::string dir = test::temp_dir("mtp_generate");
  for (const char* arch : kArchs) {
    const std::string path = synth_with_mtp(arch, dir);
    auto plain_model = load_with_mtp(path, false);
    auto mtp_model = load_with_mtp(path, true);
    for (float temp : {0.0f, 0.9f}) {
      GenerateRequest req;
      req.prompt = {1, 40, 41, 300, 7, 99};
      req.max_new_tokens = 40;
      req.stop_at_eog = false;
      req.sampling.temperature = temp;
      req.sampling.seed = 17;
      const GenerateResult plain = generate(*plain_model, req);
      for (int32_t k : {1, 3}) {
        GenerateRequest r = req;
        r.speculative.num_tokens = k;
        r.speculative.method = DraftMethod::Mtp;
        const GenerateResult drafted = generate(*mtp_model, r);
        EXPECT_EQ(drafted.tokens, plain.tokens) << arch << " temperature " << temp << " k " << k;
        EXPECT_GT(drafted.speculative.drafts, 10) << arch;
      }
    }
  }
}

// The engine with MTP drafts: prompts sharing a prefix (prefix cache), chunked prefill (the
// draft layer runs over every chunk), pages of 8 tokens (chained drafts stop where a sequence's
// blocks end), greedy and sampled; the tokens of a plain engine, no block leaked, and each
// draft the one the draft layer gives over the whole sequence.
TEST(MtpDrafter, EngineGivesThePlainTokens) {
  const std::string dir = test::temp_dir("mtp_engine");
  for (const char* arch : kArchs) {
    const std::string path = synth_with_mtp(arch, dir);
    auto plain_model = load_with_mtp(path, false);
    auto mtp_model = load_with_mtp(path, true);
    std::mt19937 rng(9);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int32_t> shared = {1};
    for (int i = 0; i < 20; ++i) shared.push_back(3 + static_cast<int32_t>(rng() % 500));
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> p = i % 2 ? shared : std::vector<int32_t>{1};
      for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(3 + static_cast<int32_t>(rng() % 500));
      prompts.push_back(p);
    }
    std::vector<std::vector<int32_t>> out[2];
    for (int with = 0; with < 2; ++with) {
      Model& m = with ? *mtp_model : *plain_model;
      EngineConfig c;
      c.page_size = 8;
      c.kv_cache_bytes = 8 << 20;
      c.kv_dtype = DType::F32;  // as the fresh caches the drafts are checked against
      c.max_model_len = 256;
      c.scheduler.max_num_batched_tokens = 24;
      c.scheduler.max_num_seqs = 8;
      if (with) c.speculative = {3, 2, 4, DraftMethod::Mtp};
      Engine e(m, c);
      std::vector<int64_t> ids;
      for (size_t i = 0; i < prompts.size(); ++i) {
        Request q;
        q.prompt = prompts[i];
        q.max_new_tokens = 30;
        q.stop_at_eog = false;
        q.sampling.temperature = i % 2 ? 0.8f : 0.0f;
        q.sampling.seed = 50 + i;
        ids.push_back(e.add_request(q));
      }
      MtpDrafter scratch(*mtp_model);
      int64_t compared = 0;
      while (e.has_work()) {
        e.step();
        if (!with) continue;
        // Each decoding sequence's next draft is what the draft layer gives over its whole
        // sequence in a fresh cache (up to the length the engine drafted).
        for (const Sequence* s : e.sequences()) {
          const auto L = static_cast<int64_t>(s->tokens.size());
          if (s->state != SeqState::Running || s->mtp_draft.empty() || s->mtp_draft_at != L) continue;
          auto fresh = m.new_cache(L + 8, 8);
          std::vector<float> lg(static_cast<size_t>((L - 1) * m.config().n_vocab));
          std::vector<int32_t> pos(static_cast<size_t>(L - 1));
          for (int64_t i = 0; i < L - 1; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
          m.forward(s->tokens.data(), pos.data(), L - 1, *fresh, lg.data(), true);
          MtpRows r;
          r.n = L - 1;
          r.next = s->tokens.data() + 1;
          r.pages = fresh->pages.data();
          r.n_pages = static_cast<int64_t>(fresh->pages.size());
          r.max_draft = static_cast<int64_t>(s->mtp_draft.size());
          std::vector<std::vector<int32_t>> want;
          scratch.run({r}, *fresh->pool, want);
          EXPECT_EQ(s->mtp_draft, want[0]) << arch << ": sequence " << s->id << " at " << L << " tokens";
          ++compared;
        }
      }
      if (with) {
        EXPECT_GT(compared, 50) << arch;
      }
      for (int64_t id : ids) {
        const Sequence* s = e.sequence(id);
        out[with].emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
      }
      if (with) {
        EXPECT_GT(e.stats().speculative.drafts, 50) << arch;
      }
      if (e.blocks().prefix_cache()) e.blocks().prefix_cache()->clear();
      EXPECT_EQ(e.pool().blocks().n_free(), e.pool().n_blocks()) << arch << ": blocks leaked";
    }
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out[1][i], out[0][i]) << arch << " prompt " << i;
  }
}

// An engine asked for MTP drafts on a model loaded without its draft layer says so.
TEST(MtpDrafter, EngineRefusesAModelWithoutTheLayer) {
  const std::string dir = test::temp_dir("mtp_refuse");
  auto m = load_with_mtp(synth_with_mtp("glm4_moe", dir), false);
  EngineConfig c;
  c.kv_cache_bytes = 1 << 20;
  c.speculative = {1, 2, 4, DraftMethod::Mtp};
  try {
    Engine e(*m, c);
    ADD_FAILURE() << "an engine drafted with a layer that was not loaded";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("multi-token-prediction"), std::string::npos) << ex.what();
  }
}

}  // namespace
}  // namespace fp
