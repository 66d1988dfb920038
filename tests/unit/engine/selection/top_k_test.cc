#include "engine/selection/top_k.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Reference: full sort by (score desc, index asc), NaN below everything; result ascending.
std::vector<int32_t> SortReference(const std::vector<float>& scores, int64_t k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(scores[a]);
    const bool nb = std::isnan(scores[b]);
    if (na != nb) return nb;  // the number first
    if (!na && scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(k)));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> TopK(const std::vector<float>& scores, int64_t k) {
  std::vector<int32_t> out = {99};  // must be cleared
  TopKByScore(scores.data(), static_cast<int64_t>(scores.size()), k, &out);
  return out;
}

TEST(TopKByScoreTest, PicksTheLargestInAscendingIndexOrder) {
  EXPECT_THAT(TopK({0.5f, 3.0f, -1.0f, 2.0f, 2.5f}, 3), ElementsAre(1, 3, 4));
}

TEST(TopKByScoreTest, TiesGoToTheLowerIndex) {
  EXPECT_THAT(TopK({1.0f, 2.0f, 2.0f, 2.0f, 0.0f, 2.0f}, 2), ElementsAre(1, 2));
  EXPECT_THAT(TopK({1.0f, 1.0f, 1.0f, 1.0f}, 3), ElementsAre(0, 1, 2));
  // Signed zeros compare equal: index decides.
  EXPECT_THAT(TopK({-0.0f, 0.0f, -1.0f}, 1), ElementsAre(0));
}

TEST(TopKByScoreTest, NanRanksBelowEverything) {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THAT(TopK({nan, -inf, 0.0f, nan}, 2), ElementsAre(1, 2));
  EXPECT_THAT(TopK({nan, nan, -inf}, 2), ElementsAre(0, 2));
  EXPECT_THAT(TopK({nan, 1.0f, nan, nan}, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(TopK({nan, nan}, 1), ElementsAre(0));
}

TEST(TopKByScoreTest, DegenerateSizes) {
  EXPECT_THAT(TopK({}, 3), IsEmpty());
  EXPECT_THAT(TopK({1.0f, 2.0f}, 0), IsEmpty());
  EXPECT_THAT(TopK({3.0f, 1.0f, 2.0f}, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(TopK({3.0f, 1.0f, 2.0f}, 10), ElementsAre(0, 1, 2));
}

TEST(TopKByScoreTest, MatchesFullSortOnRandomInputsWithManyTies) {
  std::mt19937 rng(7);
  std::vector<float> scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 600)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(0, n + 2)(rng);
    const int range = trial % 3 == 0 ? 3 : 1000;  // few distinct values: many ties
    std::uniform_int_distribution<int> value(0, range);
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(value(rng)) * 0.25f;
    if (trial % 5 == 0) {
      for (int i = 0; i < 1 + trial % 4; ++i) scores[value(rng) % n] = std::nanf("");
    }
    std::vector<int32_t> out;
    TopKByScore(scores.data(), n, k, &out, &scratch);
    EXPECT_EQ(out, SortReference(scores, k)) << "trial " << trial;
  }
}

TEST(TopKByTwoScoresTest, PrimaryThenSecondaryThenIndex) {
  //                           0     1     2     3     4     5
  const std::vector<float> primary = {2.0f, 1.0f, 2.0f, 3.0f, 2.0f, 0.0f};
  const std::vector<float> secondary = {5.0f, 9.0f, 7.0f, 0.0f, 7.0f, 9.0f};
  std::vector<int32_t> out;
  TopKByTwoScores({0, 1, 2, 3, 4, 5}, primary.data(), secondary.data(), 2, &out);
  EXPECT_THAT(out, ElementsAre(2, 3));  // 3 (primary 3), then 2 beats 4 by index, 0 by secondary
  TopKByTwoScores({0, 1, 2, 3, 4, 5}, primary.data(), secondary.data(), 3, &out);
  EXPECT_THAT(out, ElementsAre(2, 3, 4));
  TopKByTwoScores({0, 1, 4, 5}, primary.data(), secondary.data(), 2, &out);
  EXPECT_THAT(out, ElementsAre(0, 4));
  TopKByTwoScores({1, 5}, primary.data(), secondary.data(), 5, &out);
  EXPECT_THAT(out, ElementsAre(1, 5));
}

TEST(TopKByTwoScoresTest, MatchesFullSortOnRandomSubsets) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    std::uniform_int_distribution<int> value(0, 4);
    std::vector<float> primary(n);
    std::vector<float> secondary(n);
    for (int64_t i = 0; i < n; ++i) {
      primary[i] = static_cast<float>(value(rng));
      secondary[i] = static_cast<float>(value(rng));
    }
    std::vector<int32_t> subset;
    for (int64_t i = 0; i < n; ++i) {
      if (value(rng) != 0) subset.push_back(static_cast<int32_t>(i));
    }
    const int64_t k = std::uniform_int_distribution<int64_t>(0, n)(rng);
    std::vector<int32_t> expected = subset;
    std::sort(expected.begin(), expected.end(), [&](int32_t a, int32_t b) {
      if (primary[a] != primary[b]) return primary[a] > primary[b];
      if (secondary[a] != secondary[b]) return secondary[a] > secondary[b];
      return a < b;
    });
    expected.resize(std::min<size_t>(expected.size(), static_cast<size_t>(k)));
    std::sort(expected.begin(), expected.end());
    std::vector<int32_t> out;
    TopKByTwoScores(subset, primary.data(), secondary.data(), k, &out);
    EXPECT_EQ(out, expected) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tokenselect::engine
