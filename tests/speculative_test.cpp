// tests/speculative_test.cpp — speculative decoding by prompt lookup: the n-gram proposer against
// its definition on random sequences, the acceptance test (greedy: the argmax, penalties seeing
// the draft; sampling: the first token's distribution equals the sampler's, drafts the sampler
// would never pick never kept), and generation on stories260K giving the same greedy tokens with
// and without drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/generator.h"
#include "engine/speculative.h"
#include "test_util.h"

namespace fp {
namespace {

SpeculativeConfig lookup(int32_t k, int32_t lo, int32_t hi) {
  SpeculativeConfig c;
  c.num_tokens = k;
  c.ngram_min = lo;
  c.ngram_max = hi;
  return c;
}

bool occurs_at(const std::vector<int32_t>& t, int64_t i, int64_t g) {
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t j = 0; j < g; ++j)
    if (t[static_cast<size_t>(i + j)] != t[static_cast<size_t>(n - g + j)]) return false;
  return true;
}

TEST(NgramDraft, HandMadeCases) {
  std::vector<int32_t> out;
  //                         0  1  2  3  4  5  6  7  8  9 10 11
  std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3};
  EXPECT_EQ(propose_ngram_draft(t.data(), 12, lookup(3, 2, 3), 3, out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 5, 1}));  // the latest earlier "1 2 3", at 4
  EXPECT_EQ(propose_ngram_draft(t.data(), 12, lookup(3, 2, 3), 10, out), 10);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 5, 1, 2, 3, 7, 5, 1, 2, 3}));  // past the end: the text repeating
  std::vector<int32_t> loop = {4, 6, 6, 6};  // "6 6" last at 1..2: what follows is the last 6, then the draft
  EXPECT_EQ(propose_ngram_draft(loop.data(), 4, lookup(3, 2, 3), 3, out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 6, 6}));
  EXPECT_EQ(propose_ngram_draft(t.data(), 12, lookup(3, 2, 3), 0, out), 0);
  EXPECT_TRUE(out.empty());
  // The longest n-gram wins over a later shorter one: "8 2 3" at 0, "2 3" alone later at 5.
  std::vector<int32_t> u = {8, 2, 3, 4, 6, 2, 3, 5, 8, 2, 3};
  EXPECT_EQ(propose_ngram_draft(u.data(), 11, lookup(2, 2, 3), 2, out), 2);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 6}));
  EXPECT_EQ(propose_ngram_draft(u.data(), 11, lookup(2, 2, 2), 2, out), 2);
  EXPECT_EQ(out, (std::vector<int32_t>{5, 8}));  // 2-grams only: the latest "2 3", at 5
  // Nothing matches, and sequences shorter than the n-gram.
  std::vector<int32_t> v = {1, 2, 3, 4, 5};
  EXPECT_EQ(propose_ngram_draft(v.data(), 5, lookup(4, 1, 3), 4, out), 0);
  EXPECT_EQ(propose_ngram_draft(v.data(), 1, lookup(4, 1, 3), 4, out), 0);
  EXPECT_EQ(propose_ngram_draft(v.data(), 0, lookup(4, 1, 3), 4, out), 0);
}

// On random sequences over a small alphabet: a draft is the continuation of the latest earlier
// occurrence of the longest suffix n-gram in range (the sequence extended by copying from there
// on, which continues the period); no draft means no suffix n-gram recurs.
TEST(NgramDraft, MatchesItsDefinitionOnRandomSequences) {
  std::mt19937 rng(7);
  std::vector<int32_t> out;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int32_t alphabet = std::uniform_int_distribution<int32_t>(2, 6)(rng);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = std::uniform_int_distribution<int32_t>(0, alphabet - 1)(rng);
    const int32_t lo = std::uniform_int_distribution<int32_t>(1, 3)(rng);
    const int32_t hi = lo + std::uniform_int_distribution<int32_t>(0, 3)(rng);
    const int64_t max_tokens = std::uniform_int_distribution<int64_t>(0, 6)(rng);
    const int64_t k = propose_ngram_draft(t.data(), n, lookup(4, lo, hi), max_tokens, out);
    ASSERT_EQ(k, static_cast<int64_t>(out.size()));
    // The definition, spelled out: the largest g, then the largest i.
    int64_t want_g = -1, want_i = -1;
    for (int64_t g = std::min<int64_t>(hi, n - 1); g >= lo && want_g < 0; --g)
      for (int64_t i = n - g - 1; i >= 0; --i)
        if (occurs_at(t, i, g)) {
          want_g = g, want_i = i;
          break;
        }
    if (want_g < 0 || max_tokens == 0) {
      EXPECT_EQ(k, 0) << "trial " << trial;
      continue;
    }
    // What followed, the sequence read as repeating from the match onwards past its end.
    std::vector<int32_t> want, ext = t;
    for (int64_t j = 0; j < max_tokens; ++j) ext.push_back(ext[static_cast<size_t>(want_i + want_g + j)]);
    want.assign(ext.begin() + n, ext.end());
    EXPECT_EQ(out, want) << "trial " << trial;
  }
}

// Logit rows for a vocabulary of 6 whose argmax is the given token.
std::vector<float> rows_with_argmax(const std::vector<int32_t>& argmax) {
  std::vector<float> rows;
  for (int32_t a : argmax)
    for (int32_t j = 0; j < 6; ++j) rows.push_back(j == a ? 2.0f : 0.1f * static_cast<float>(j));
  return rows;
}

TEST(VerifyDraft, GreedyKeepsTheArgmaxPrefix) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  // Context: tokens 0..2 (the fed token last), then the draft 4 1 3.
  std::vector<int32_t> tokens = {0, 5, 2, 4, 1, 3};
  auto rows = rows_with_argmax({4, 1, 0, 5});
  DraftVerdict v = verify_draft(s, rows.data(), 6, tokens.data(), 3, 3, 1);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 0);  // row 2 prefers 0 to the draft's 3
  rows = rows_with_argmax({4, 1, 3, 5});
  v = verify_draft(s, rows.data(), 6, tokens.data(), 3, 3, 1);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 5);  // every draft token kept: the token after them
  rows = rows_with_argmax({2, 1, 3, 5});
  v = verify_draft(s, rows.data(), 6, tokens.data(), 3, 3, 1);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 2);
  // No draft: the one row's token.
  rows = rows_with_argmax({3});
  v = verify_draft(s, rows.data(), 6, tokens.data(), 3, 0, 1);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 3);
}

TEST(VerifyDraft, PenaltiesSeeTheDraftTokensBeforeEachRow) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  std::vector<int32_t> tokens = {0, 4, 1};  // context 0, draft 4 1
  // Row 1: token 1 (2.0) narrowly ahead of token 3 (1.9); the draft's 4 does not matter. With the
  // penalty, 1 is not yet in the history at row 1 -> kept. Row 2 (after draft 4 1): 1 again
  // leads, but now it was seen: 2.0 / 1.5 < 1.9, so 3 wins.
  std::vector<float> rows(18, 0.0f);
  rows[0 * 6 + 4] = 3.0f;
  rows[1 * 6 + 1] = 2.0f;
  rows[1 * 6 + 3] = 1.9f;
  rows[2 * 6 + 1] = 2.0f;
  rows[2 * 6 + 3] = 1.9f;
  DraftVerdict v = verify_draft(s, rows.data(), 6, tokens.data(), 1, 2, 1);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 3);
}

// The first token a verification produces (the draft's, when kept, else the model's choice) is
// distributed as the sampler's distribution of that row, whatever the draft (the rejection rule
// with a one-hot draft: kept with probability p(d), else drawn from p without d).
std::vector<double> first_token_frequencies(const SamplingParams& p, const std::vector<float>& row0, int32_t draft, int trials) {
  std::vector<double> freq(row0.size(), 0.0);
  const int64_t V = static_cast<int64_t>(row0.size());
  std::vector<int32_t> tokens = {0, draft};
  for (int t = 0; t < trials; ++t) {
    SamplingParams q = p;
    q.seed = static_cast<uint64_t>(t) * 7919 + 1;
    Sampler s(q);
    std::vector<float> rows = row0;
    rows.insert(rows.end(), row0.begin(), row0.end());
    const DraftVerdict v = verify_draft(s, rows.data(), V, tokens.data(), 1, 1, 1);
    freq[static_cast<size_t>(v.accepted >= 1 ? draft : v.next)] += 1.0 / trials;
  }
  return freq;
}

TEST(VerifyDraft, SamplingKeepsTheSamplersDistribution) {
  const std::vector<double> probs = {0.4, 0.25, 0.2, 0.1, 0.05};
  std::vector<float> row0;
  for (double q : probs) row0.push_back(static_cast<float>(std::log(q)));
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  const int trials = 40000;  // a frequency's standard error is at most 0.0025
  for (int32_t draft : {0, 2, 4}) {
    auto f = first_token_frequencies(p, row0, draft, trials);
    for (size_t j = 0; j < probs.size(); ++j) EXPECT_NEAR(f[j], probs[j], 0.012) << "draft " << draft << " token " << j;
  }
  // Filters: top-k 3 keeps 0.4 0.25 0.2 (renormalised); a draft outside them is never kept.
  p.top_k = 3;
  for (int32_t draft : {1, 4}) {
    auto f = first_token_frequencies(p, row0, draft, trials);
    EXPECT_NEAR(f[0], 0.4 / 0.85, 0.012) << "draft " << draft;
    EXPECT_NEAR(f[1], 0.25 / 0.85, 0.012) << "draft " << draft;
    EXPECT_NEAR(f[2], 0.2 / 0.85, 0.012) << "draft " << draft;
    EXPECT_EQ(f[3], 0.0);
    EXPECT_EQ(f[4], 0.0);
  }
  // Temperature 0.5 sharpens: p^2 renormalised.
  p.top_k = 0;
  p.temperature = 0.5f;
  double z = 0;
  for (double q : probs) z += q * q;
  auto f = first_token_frequencies(p, row0, 1, trials);
  for (size_t j = 0; j < probs.size(); ++j) EXPECT_NEAR(f[j], probs[j] * probs[j] / z, 0.012) << "token " << j;
}

TEST(VerifyDraft, JudgedFromRowsSampledElsewhere) {
  const std::vector<int32_t> draft = {4, 1, 3};
  const std::vector<int32_t> all = {4, 1, 3, 5}, two = {4, 1, 0, 9}, none = {2, 1, 3, 5};
  DraftVerdict v = judge_sampled_draft(all.data(), draft.data(), 3);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 5);
  v = judge_sampled_draft(two.data(), draft.data(), 3);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 0);
  v = judge_sampled_draft(none.data(), draft.data(), 3);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 2);
  v = judge_sampled_draft(none.data(), draft.data(), 0);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 2);
}

TEST(SpeculativeConfig, DraftLengthRisesWhileDraftsHoldAndFallsWhenRefused) {
  const SpeculativeConfig c = lookup(6, 1, 3);
  EXPECT_EQ(next_draft_length(0, 6, 6, c), 6);  // first draft at the configured length, kept: capped
  EXPECT_EQ(next_draft_length(0, 6, 2, c), 5);
  EXPECT_EQ(next_draft_length(5, 5, 0, c), 4);
  EXPECT_EQ(next_draft_length(1, 1, 0, c), 1);  // never below one guess
  EXPECT_EQ(next_draft_length(1, 1, 1, c), 3);
  EXPECT_EQ(next_draft_length(3, 2, 2, c), 5);  // a draft cut short (room) and kept whole counts as kept
  int32_t len = 0;
  for (int i = 0; i < 10; ++i) len = next_draft_length(len, len ? len : 6, 0, c);
  EXPECT_EQ(len, 1);
  for (int i = 0; i < 10; ++i) len = next_draft_length(len, len, len, c);
  EXPECT_EQ(len, 6);
}

TEST(SpeculativeConfig, RefusesOutOfRangeSettings) {
  EXPECT_NO_THROW(lookup(0, 0, 0).check());  // off: the n-gram sizes are not looked at
  EXPECT_NO_THROW(lookup(5, 1, 4).check());
  EXPECT_THROW(lookup(-1, 1, 4).check(), Error);
  EXPECT_THROW(lookup(65, 1, 4).check(), Error);
  EXPECT_THROW(lookup(4, 0, 4).check(), Error);
  EXPECT_THROW(lookup(4, 3, 2).check(), Error);
}

// stories260K: greedy generation with drafts gives the tokens it gives without them, and the
// drafts are used (its stories repeat their phrases).
TEST(SpeculativeGenerate, GreedyTokensEqualPlainDecoding) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  for (const char* text : {"Once upon a time", "Lily and Tom went to the park. Lily and Tom", "The cat"})
    for (float penalty : {1.0f, 1.3f}) {
      GenerateRequest g;
      g.prompt = m->tokenizer()->encode(text, true, false);
      g.max_new_tokens = 120;
      g.sampling.temperature = 0;
      g.sampling.repetition_penalty = penalty;
      const auto plain = generate(*m, g);
      for (SpeculativeConfig c : {lookup(4, 2, 4), lookup(8, 1, 3)}) {
        g.speculative = c;
        const auto fast = generate(*m, g);
        EXPECT_EQ(fast.tokens, plain.tokens) << text << " penalty " << penalty << " k " << c.num_tokens;
        EXPECT_EQ(fast.finish_reason, plain.finish_reason);
        EXPECT_GT(fast.speculative.drafts, 0) << text;
        EXPECT_GT(fast.speculative.accepted_tokens, 0) << text;
        // Each forward gave one token and its kept draft tokens (the first came from the prefill).
        if (fast.finish_reason == "length") {
          EXPECT_EQ(1 + fast.decode_forwards + fast.speculative.accepted_tokens, static_cast<int64_t>(fast.tokens.size()))
              << text;
        }
      }
    }
}

// Sampling with drafts: token j uses the sampler's draw j, so a seed gives the tokens of plain
// decoding; the budget is kept.
TEST(SpeculativeGenerate, SampledTokensEqualPlainDecodingForASeed) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto m = load_model(test::testdata(test::kStoriesGguf));
  GenerateRequest g;
  g.prompt = m->tokenizer()->encode("Once upon a time", true, false);
  g.sampling.temperature = 0.7f;
  g.sampling.seed = 11;
  g.speculative = lookup(6, 1, 3);
  g.stop_at_eog = false;
  for (int32_t n : {1, 2, 7, 150})
    for (float penalty : {1.0f, 1.2f}) {
      g.max_new_tokens = n;
      g.sampling.repetition_penalty = penalty;
      GenerateRequest plain = g;
      plain.speculative = {};
      const auto a = generate(*m, g);
      EXPECT_EQ(a.tokens, generate(*m, plain).tokens) << n << " tokens, penalty " << penalty;
      EXPECT_EQ(static_cast<int32_t>(a.tokens.size()), n);
      if (n == 150) {
        EXPECT_GT(a.speculative.accepted_tokens, 0);
      }
    }
}

}  // namespace
}  // namespace fp
