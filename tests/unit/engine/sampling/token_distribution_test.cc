#include "engine/sampling/token_distribution.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/sampling/prng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::vector<float> LogitsFromProbs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

SamplingParams Truncation(float top_p, int32_t top_k = 0, float min_p = 0.0f,
                          float temperature = 1.0f) {
  SamplingParams params;
  params.top_p = top_p;
  params.top_k = top_k;
  params.min_p = min_p;
  params.temperature = temperature;
  return params;
}

std::vector<int32_t> Kept(const TokenDistribution& d) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < d.size(); ++i) ids.push_back(d.id(i));
  return ids;
}

std::vector<int32_t> KeptFor(const std::vector<float>& logits, const SamplingParams& params) {
  TokenDistribution d;
  EXPECT_TRUE(d.Build(logits, params).ok());
  return Kept(d);
}

TEST(TokenDistributionTest, NoTruncationIsTheSoftmaxInIdOrder) {
  TokenDistribution d;
  ASSERT_TRUE(d.Build(LogitsFromProbs({0.1, 0.2, 0.3, 0.4}), Truncation(1.0f)).ok());
  EXPECT_THAT(Kept(d), ElementsAre(0, 1, 2, 3));
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(d.probability(i), 0.1 * (i + 1), 1e-6);
}

TEST(TokenDistributionTest, TemperatureScalesLogits) {
  // logits {0, ln 2}: T = 1 gives {1/3, 2/3}; T = 0.5 doubles them: {1/5, 4/5}; T = 2 halves
  // them: {1/(1+sqrt 2), sqrt 2/(1+sqrt 2)}.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(2.0))};
  TokenDistribution d;
  ASSERT_TRUE(d.Build(logits, Truncation(1.0f, 0, 0.0f, 0.5f)).ok());
  EXPECT_NEAR(d.probability(0), 0.2, 1e-6);
  EXPECT_NEAR(d.probability(1), 0.8, 1e-6);
  ASSERT_TRUE(d.Build(logits, Truncation(1.0f, 0, 0.0f, 2.0f)).ok());
  EXPECT_NEAR(d.probability(1), std::sqrt(2.0) / (1 + std::sqrt(2.0)), 1e-6);
}

TEST(TokenDistributionTest, TopPKeepsTheSmallestSetWithMassAtLeastP) {
  // Sorted: id1 .40, id2 .30, id3 .15, id4 .10, id0 .05; cumulative .40 .70 .85 .95 1.
  const std::vector<float> logits = LogitsFromProbs({0.05, 0.4, 0.3, 0.15, 0.1});
  EXPECT_THAT(KeptFor(logits, Truncation(0.35f)), ElementsAre(1));
  EXPECT_THAT(KeptFor(logits, Truncation(0.41f)), ElementsAre(1, 2));
  EXPECT_THAT(KeptFor(logits, Truncation(0.69f)), ElementsAre(1, 2));
  EXPECT_THAT(KeptFor(logits, Truncation(0.71f)), ElementsAre(1, 2, 3));
  EXPECT_THAT(KeptFor(logits, Truncation(0.9f)), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(KeptFor(logits, Truncation(0.96f)), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f)), ElementsAre(0, 1, 2, 3, 4));

  TokenDistribution d;
  ASSERT_TRUE(d.Build(logits, Truncation(0.5f)).ok());  // renormalised over the kept set
  EXPECT_NEAR(d.probability(0), 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(d.probability(1), 0.3 / 0.7, 1e-6);
}

TEST(TokenDistributionTest, TiesGoToTheLowerId) {
  const std::vector<float> uniform(4, 0.0f);
  EXPECT_THAT(KeptFor(uniform, Truncation(0.3f)), ElementsAre(0, 1));
  EXPECT_THAT(KeptFor(uniform, Truncation(1.0f, 3)), ElementsAre(0, 1, 2));
  EXPECT_THAT(KeptFor({1.0f, 2.0f, 2.0f, 0.0f}, Truncation(1.0f, 1)), ElementsAre(1));
  EXPECT_THAT(KeptFor({1.0f, 2.0f, 2.0f, 0.0f}, Truncation(1.0f, 2)), ElementsAre(1, 2));
}

TEST(TokenDistributionTest, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f, 2.5f, 0.0f};
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 3)), ElementsAre(1, 3, 4));  // ascending ids
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 6)), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 100)), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, -1)), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(TokenDistributionTest, MinPIsRelativeToTheMostLikelyToken) {
  // p = {.5, .2, .1, .15, .05}: min_p .25 keeps p >= .125; .35 keeps p >= .175.
  const std::vector<float> logits = LogitsFromProbs({0.5, 0.2, 0.1, 0.15, 0.05});
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 0, 0.25f)), ElementsAre(0, 1, 3));
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 0, 0.35f)), ElementsAre(0, 1));
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 0, 1.0f)), ElementsAre(0));
  // min_p applies after temperature: at T = 2, p ~ sqrt(p), so .1 / .5 -> sqrt(.2) = .447.
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 0, 0.4f, 2.0f)), ElementsAre(0, 1, 2, 3));
}

TEST(TokenDistributionTest, FiltersApplyInOrderMinPTopKTopP) {
  const std::vector<float> logits = LogitsFromProbs({0.5, 0.2, 0.1, 0.15, 0.05});
  // min_p .25 keeps {0, 1, 3} (mass .85); top_p .8 of that renormalised set: .5/.85 = .59,
  // (.5+.2)/.85 = .82 -> {0, 1}. (top_p on the full distribution would keep {0, 1, 3}.)
  EXPECT_THAT(KeptFor(logits, Truncation(0.8f, 0, 0.25f)), ElementsAre(0, 1));
  // top_k 2 keeps {0, 1}, renormalised {.714, .286}; top_p .65 then keeps {0}. (top_p first
  // would keep {0, 1}.)
  EXPECT_THAT(KeptFor(logits, Truncation(0.65f, 2)), ElementsAre(0));
  // min_p .35 -> {0, 1}; top_k 3 keeps both.
  EXPECT_THAT(KeptFor(logits, Truncation(1.0f, 3, 0.35f)), ElementsAre(0, 1));
}

TEST(TokenDistributionTest, MaskedTokensAreNeverKept) {
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(KeptFor({ninf, 1.0f, ninf, 0.5f}, Truncation(1.0f)), ElementsAre(1, 3));
  EXPECT_THAT(KeptFor({ninf, 1.0f, ninf, 0.5f}, Truncation(1.0f, 3)), ElementsAre(1, 3));
  TokenDistribution d;
  absl::Status status = d.Build({ninf, ninf}, Truncation(1.0f));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "no token has a finite logit");
  EXPECT_FALSE(d.Build({1.0f}, Truncation(1.0f, 0, 0.0f, 0.0f)).ok());
}

TEST(TokenDistributionTest, TinyTemperatureLeavesOnlyTheArgmax) {
  TokenDistribution d;
  ASSERT_TRUE(d.Build({1.0f, 1.5f, 1.49f}, Truncation(1.0f, 0, 0.0f, 1e-5f)).ok());
  EXPECT_THAT(Kept(d), ElementsAre(1));  // the others' weights underflow to 0 and are dropped
  EXPECT_EQ(d.Pick(0.0), 1);
  EXPECT_EQ(d.Pick(0.999999), 1);
}

TEST(TokenDistributionTest, PickIsTheInverseCdf) {
  TokenDistribution d;
  ASSERT_TRUE(d.Build(LogitsFromProbs({0.1, 0.2, 0.3, 0.4}), Truncation(1.0f)).ok());
  EXPECT_EQ(d.Pick(0.0), 0);
  EXPECT_EQ(d.Pick(0.09), 0);
  EXPECT_EQ(d.Pick(0.11), 1);
  EXPECT_EQ(d.Pick(0.29), 1);
  EXPECT_EQ(d.Pick(0.31), 2);
  EXPECT_EQ(d.Pick(0.61), 3);
  EXPECT_EQ(d.Pick(std::nextafter(1.0, 0.0)), 3);
  // top_p .6 keeps {2: .3, 3: .4}, renormalised {3/7, 4/7}, still in id order.
  ASSERT_TRUE(d.Build(LogitsFromProbs({0.1, 0.2, 0.3, 0.4}), Truncation(0.6f)).ok());
  EXPECT_THAT(Kept(d), ElementsAre(2, 3));
  EXPECT_EQ(d.Pick(0.42), 2);
  EXPECT_EQ(d.Pick(0.43), 3);
}

// Reference: full sort of the whole vocab by (logit desc, id asc), weights computed the same way
// (float exp of the scaled logit), returned in ascending id order.
std::vector<int32_t> ReferenceTopP(const std::vector<float>& logits, float top_p) {
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<int32_t> order(logits.size());
  std::vector<double> weight(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    order[i] = static_cast<int32_t>(i);
    weight[i] = std::exp(static_cast<float>(static_cast<double>(logits[i]) - max));
    total += weight[i];
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<int32_t> kept;
  double cumulative = 0.0;
  for (int32_t id : order) {
    kept.push_back(id);
    cumulative += weight[id];
    if (cumulative >= top_p * total) break;
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

std::vector<std::vector<float>> LargeVocabCases() {
  constexpr int kVocab = 128 * 1024;
  Prng prng(99);
  std::vector<std::vector<float>> cases;
  for (float spread : {2.0f, 8.0f, 30.0f}) {  // flat to peaked: from ~100K kept to a few
    std::vector<float> logits(kVocab);
    for (float& x : logits) x = static_cast<float>(prng.NextDouble()) * spread;
    cases.push_back(logits);
    for (float& x : logits) x = std::floor(x);  // heavy ties
    cases.push_back(logits);
  }
  return cases;
}

TEST(TokenDistributionTest, TopPOnALargeVocabMatchesAFullSort) {
  for (const std::vector<float>& logits : LargeVocabCases()) {
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.99f}) {
      const std::vector<int32_t> expected = ReferenceTopP(logits, top_p);
      EXPECT_THAT(KeptFor(logits, Truncation(top_p)), ElementsAreArray(expected))
          << "top_p " << top_p << " kept " << expected.size();
    }
  }
}

TEST(TokenDistributionTest, TopKOnALargeVocabMatchesAFullSort) {
  for (const std::vector<float>& logits : LargeVocabCases()) {
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int k : {1, 50, 1000}) {
      std::vector<int32_t> expected(order.begin(), order.begin() + k);
      std::sort(expected.begin(), expected.end());
      EXPECT_THAT(KeptFor(logits, Truncation(1.0f, k)), ElementsAreArray(expected)) << k;
    }
  }
}

}  // namespace
}  // namespace tokenselect::engine
