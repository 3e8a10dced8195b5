// tests/kv_dtype_test.cpp — the KV cache stored as F16 or BF16 (--kv-cache-dtype): logits stay
// within a stated distance of the F32 cache (stories260K's GQA cache and a DeepSeek-shaped MLA
// latent cache), the engine's capacity doubles for the same budget, half-width caches keep batch
// invariance, the fast attention kernel (not the reference) reads them, and bad names are refused.
// Rows move between pools as stored (the context-parallel exchange).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {


// Logits of every position of `ids` with the cache in `kv`: the first half as one prefill, the
// rest one token at a time, so the prefill and the decode attention paths both read the cache.
std::vector<float> logits_with_kv(Model& m, const std::vector<int32_t>& ids, DType kv) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = m.config().n_vocab, half = n / 2;
  auto cache = m.new_cache(n, 16, kv);
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> out(static_cast<size_t>(n * V));
  m.forward(ids.data(), pos.data(), half, *cache, out.data(), true);
  for (int64_t i = half; i < n; ++i) m.forward(&ids[static_cast<size_t>(i)], &pos[static_cast<size_t>(i)], 1, *cache, out.data() + i * V, false);
  return out;
}

// F16 keeps 11 significant bits, BF16 8: the rounding of K/V moves the logits by about that
// relative amount. Measured on stories260K: F16 7.0e-4, BF16 5.6e-3; on the MLA synth model:
// F16 2.3e-4, BF16 1.8e-3. The bounds leave about 4x room.
constexpr double kF16Tol = 3e-3, kBf16Tol = 2e-2;

TEST(KvDtype, StoriesHalfWidthCacheLogitsStayNearF32) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  auto ids = m->tokenizer()->encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she saw a big "
      "red ball in the park. She ran to it and kicked it very hard.",
      true, false);
  ASSERT_GE(ids.size(), 40u);
  auto f32 = logits_with_kv(*m, ids, DType::F32);
  const double f16 = test::rel_err(logits_with_kv(*m, ids, DType::F16), f32);
  const double bf16 = test::rel_err(logits_with_kv(*m, ids, DType::BF16), f32);
  std::printf("logits vs the F32 cache (normalised): F16 %.3g, BF16 %.3g\n", f16, bf16);
  EXPECT_LE(f16, kF16Tol);
  EXPECT_LE(bf16, kBf16Tol);
  // The cache really stored the narrower values (a cache silently kept in F32 would give 0).
  EXPECT_GT(f16, 0.0);
  EXPECT_GT(bf16, f16);
}

TEST(KvDtype, MlaLatentCacheHalfWidthLogitsStayNearF32) {
  SynthOptions o;
  o.arch = "deepseek_v3";
  o.config = {{"hidden_size", 128}, {"num_attention_heads", 4}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
              {"vocab_size", 256}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 64},
              {"n_shared_experts", 1}, {"first_k_dense_replace", 1}, {"q_lora_rank", 64}, {"kv_lora_rank", 64},
              {"qk_rope_head_dim", 16}, {"qk_nope_head_dim", 32}, {"v_head_dim", 32}};
  o.seed = 5;
  o.type = DType::F32;
  o.out = test::temp_dir("kv_dtype_mla") + "/m.gguf";
  synth_model(o);
  auto m = load_model(o.out);
  const KvLayout kv = m->kv_layout();
  EXPECT_EQ(kv.v_width, 0);
  KvLayout half = kv;
  half.dtype = DType::BF16;
  EXPECT_EQ(half.bytes_per_token() * 2, kv.bytes_per_token());
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back((i * 37 + 11) % 256);
  auto f32 = logits_with_kv(*m, ids, DType::F32);
  const double f16 = test::rel_err(logits_with_kv(*m, ids, DType::F16), f32);
  const double bf16 = test::rel_err(logits_with_kv(*m, ids, DType::BF16), f32);
  std::printf("logits vs the F32 cache (normalised): F16 %.3g, BF16 %.3g\n", f16, bf16);
  EXPECT_LE(f16, kF16Tol);
  EXPECT_LE(bf16, kBf16Tol);
  EXPECT_GT(f16, 0.0);
  EXPECT_GT(bf16, f16);
}

TEST(KvDtype, EngineCapacityDoublesAtHalfWidth) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  EngineConfig c;
  c.page_size = 16;
  c.max_model_len = 256;
  c.kv_cache_bytes = m->kv_layout().bytes_per_token() * 16 * 64;  // 64 blocks of F32
  c.scheduler.max_num_seqs = 1000;                                // no cap below the budget
  c.kv_dtype = DType::F32;
  Engine e32(*m, c);
  c.kv_dtype = DType::F16;
  Engine e16(*m, c);
  c.kv_dtype = DType::BF16;
  Engine ebf(*m, c);
  EXPECT_EQ(e32.capacity().n_blocks, 64);
  EXPECT_EQ(e16.capacity().n_blocks, 128);
  EXPECT_EQ(ebf.capacity().n_blocks, 128);
  EXPECT_EQ(e16.capacity().tokens(), 2 * e32.capacity().tokens());
  EXPECT_EQ(e16.capacity().seqs_at_max_len, 2 * e32.capacity().seqs_at_max_len);
  EXPECT_EQ(e16.capacity().bytes_per_token * 2, e32.capacity().bytes_per_token);
  EXPECT_EQ(e16.pool().dtype(), DType::F16);
  EXPECT_EQ(e16.pool().bytes(), e32.pool().bytes());  // the same memory, twice the tokens
  EXPECT_NE(e16.capacity().describe().find(" F16 = 128 blocks"), std::string::npos) << e16.capacity().describe();
}

TEST(KvDtype, HalfWidthCacheKeepsBatchInvariance) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"Once upon a time, a little dog", "Tom and Lily went to the park. They saw", "The sun was hot and",
                           "One day, a tiny bird wanted to fly high in the sky, but it", "Mom said"})
    prompts.push_back(m->tokenizer()->encode(text, true, false));
  const int32_t n = 24;
  for (DType kv : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(kv));
    EngineConfig c;
    c.page_size = 16;
    c.kv_dtype = kv;
    c.kv_cache_bytes = 8 << 20;
    c.max_model_len = 512;
    c.scheduler.max_num_batched_tokens = 24;  // prompts split into chunks mixed with decodes
    Engine e(*m, c);
    std::vector<int64_t> ids;
    for (auto& p : prompts) {
      Request r;
      r.prompt = p;
      r.max_new_tokens = n;
      r.sampling.temperature = 0;
      ids.push_back(e.add_request(r));
    }
    while (e.has_work()) e.step();
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest g;
      g.prompt = prompts[i];
      g.max_new_tokens = n;
      g.sampling.temperature = 0;
      g.kv_dtype = kv;
      const Sequence* s = e.sequence(ids[i]);
      std::vector<int32_t> got(s->tokens.begin() + s->n_prompt, s->tokens.end());
      EXPECT_EQ(got, generate(*m, g).tokens) << "prompt " << i;
    }
  }
}

TEST(KvDtype, NamesAndRefusals) {
  DType t = DType::Q8_0;
  ASSERT_TRUE(kv_dtype_from_name("auto", &t));
  EXPECT_EQ(t, kDefaultKvDtype);
  ASSERT_TRUE(kv_dtype_from_name("AUTO", &t, DType::BF16));  // what auto means is the caller's
  EXPECT_EQ(t, DType::BF16);
  ASSERT_TRUE(kv_dtype_from_name("f16", &t));
  EXPECT_EQ(t, DType::F16);
  ASSERT_TRUE(kv_dtype_from_name("BF16", &t));
  EXPECT_EQ(t, DType::BF16);
  EXPECT_FALSE(kv_dtype_from_name("q8_0", &t));  // a dtype, but not one the cache stores
  EXPECT_FALSE(kv_dtype_from_name("fp8", &t));   // not yet
  EXPECT_FALSE(kv_dtype_from_name("fp4", &t));
  EXPECT_THROW(KvPool(KvLayout{1, 8, 8, DType::Q8_0}, 16, 1), Error);
}

// Rows packed from one pool's slots (kv_move) and unpacked into another's at other slots, through
// a row map, read back the same values, bit for bit in the stored dtype; the packed rows are the
// stored bytes (a row of an F16 / BF16 cache is half its f32 width). Slots outside the pool are
// refused with the slot named.
TEST(KvDtype, PackedRowsMoveBetweenPoolsAsStored) {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (auto [kw, vw] : std::vector<std::pair<int64_t, int64_t>>{{24, 16}, {7, 0}}) {
      const KvLayout layout{2, kw, vw, t};
      KvPool a(layout, 8, 4), b(layout, 8, 4);
      const int64_t n = 9;
      std::vector<float> k(static_cast<size_t>(n * kw)), v(static_cast<size_t>(n * std::max<int64_t>(vw, 1)));
      for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.23f * static_cast<float>(i)) * 2.0f;
      std::vector<int64_t> from(static_cast<size_t>(n)), to(static_cast<size_t>(n));
      std::vector<int32_t> row_of(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        from[static_cast<size_t>(i)] = (i * 7 + 3) % 32;
        to[static_cast<size_t>(i)] = 31 - i;
        row_of[static_cast<size_t>(i)] = static_cast<int32_t>(n - 1 - i);  // packed in reverse
      }
      a.write(1, from.data(), n, k.data(), vw ? v.data() : nullptr);
      std::vector<uint8_t> packed(static_cast<size_t>(n * a.slot_bytes()));
      EXPECT_EQ(a.slot_bytes(), row_bytes(t, kw) + row_bytes(t, vw));
      a.pack_rows(1, from.data(), n, packed.data());
      // Slot `to[i]` takes packed row row_of[i], which holds slot from[row_of[i]].
      b.unpack_rows(1, to.data(), n, packed.data(), row_of.data());
      std::vector<float> ka(static_cast<size_t>(kw)), va(static_cast<size_t>(std::max<int64_t>(vw, 1))), kb = ka, vb = va;
      for (int64_t i = 0; i < n; ++i) {
        a.read(1, from[static_cast<size_t>(row_of[static_cast<size_t>(i)])], ka.data(), va.data());
        b.read(1, to[static_cast<size_t>(i)], kb.data(), vb.data());
        EXPECT_EQ(ka, kb) << dtype_name(t) << " slot " << to[static_cast<size_t>(i)];
        EXPECT_EQ(va, vb) << dtype_name(t) << " slot " << to[static_cast<size_t>(i)];
      }
      const int64_t bad = 40;
      try {
        a.pack_rows(1, &bad, 1, packed.data());
        ADD_FAILURE() << "a slot outside the pool was packed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("KV pack: slot 40 is outside the pool (32 slots)"), std::string::npos) << e.what();
      }
      EXPECT_THROW(b.unpack_rows(2, to.data(), 1, packed.data()), Error);  // no layer 2
    }
}

TEST(KvDtype, CommandLineRefusesAnUnknownDtypeNamingIt) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  int rc = 0;
  const std::string out = test::run_command(
      test::fastpath_bin() + " generate -q -n 4 -p hi --kv-cache-dtype fp4 -m " + test::testdata(test::kStoriesGguf) + " 2>&1", &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--kv-cache-dtype fp4 is not one of auto, f32, f16, bf16"), std::string::npos) << out;
}

TEST(KvDtype, AuditShowsTheFastKernelReadingAHalfWidthCache) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  if (!test::cpu_has_avx2()) GTEST_SKIP() << "the fast attention kernel needs AVX2";
  int rc = 0;
  const std::string out = test::run_command(
      test::fastpath_bin() + " audit -q --strict --kv-cache-dtype f16 -m " + test::testdata(test::kStoriesGguf) + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;  // --strict: no op fell back to a reference kernel
  EXPECT_NE(out.find("KV cache F16"), std::string::npos) << out;
  EXPECT_NE(out.find("kv=F16"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
