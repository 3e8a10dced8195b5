// tests/sampler_test.cpp — sampling filters and reproducibility, checked on hand-made logits.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace fp {
namespace {

std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(SamplingParams p, const std::vector<double>& probs, int draws) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) {
    auto l = logits_for(probs);
    h[s.sample(l.data(), static_cast<int64_t>(l.size()), {})]++;
  }
  return h;
}

const std::vector<double> kProbs = {0.5, 0.25, 0.15, 0.06, 0.04};

TEST(Sampler, GreedyPicksTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  auto h = histogram(p, kProbs, 10);
  EXPECT_EQ(h[0], 10);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 123;
  std::vector<float> flat(50, 0.0f);
  std::vector<int32_t> a, b, c;
  Sampler s1(p), s2(p);
  p.seed = 124;
  Sampler s3(p);
  for (int i = 0; i < 32; ++i) {
    auto l = flat;
    a.push_back(s1.sample(l.data(), 50, {}));
    l = flat;
    b.push_back(s2.sample(l.data(), 50, {}));
    l = flat;
    c.push_back(s3.sample(l.data(), 50, {}));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 9;
  int draws = 20000;
  auto h = histogram(p, kProbs, draws);
  for (size_t i = 0; i < kProbs.size(); ++i)
    EXPECT_NEAR(h[static_cast<int32_t>(i)] / static_cast<double>(draws), kProbs[i], 0.015) << i;
}

TEST(Sampler, TopKTopPMinPCutTheTail) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.top_k = 2;
  auto h = histogram(p, kProbs, 3000);
  EXPECT_EQ(h.size(), 2u);  // only ids 0 and 1
  EXPECT_NEAR(h[0] / 3000.0, 0.5 / 0.75, 0.04);
  p.top_k = 0;
  p.top_p = 0.8f;  // 0.5 + 0.25 < 0.8 <= 0.9: keeps three
  h = histogram(p, kProbs, 3000);
  EXPECT_EQ(h.size(), 3u);
  p.top_p = 1.0f;
  p.min_p = 0.2f;  // keeps p >= 0.1: ids 0, 1, 2
  h = histogram(p, kProbs, 3000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 3.0f;
  Sampler s(p);
  std::vector<float> l = {2.0f, 1.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {0}), 1);  // 2/3 < 1
  EXPECT_FLOAT_EQ(l[0], 2.0f / 3);
  std::vector<float> m = {-1.0f, -2.0f};
  EXPECT_EQ(s.sample(m.data(), 2, {0}), 1);  // -1*3 = -3 < -2
}

}  // namespace
}  // namespace fp
