#include "engine/sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log(e^1 + e^2 + e^3) = 3 + log(1 + e^-1 + e^-2) = 3.40760596444438...
constexpr double kLse123 = 3.4076059644443806;

TEST(LogprobsTest, LogSumExpMatchesHandComputedValue) {
  EXPECT_NEAR(LogSumExp({1.0f, 2.0f, 3.0f}), kLse123, 1e-6);
  EXPECT_NEAR(LogSumExp({1.0f, kNegInf, 2.0f, 3.0f}), kLse123, 1e-6);  // -inf adds nothing
  EXPECT_NEAR(LogSumExp({0.0f, 0.0f, 0.0f, 0.0f}), std::log(4.0), 1e-6);
  // Stable for large logits: 1000 + log 2, where a naive sum of exp overflows.
  EXPECT_NEAR(LogSumExp({1000.0f, 1000.0f}), 1000.0 + std::log(2.0), 1e-6);
}

TEST(LogprobsTest, TopLogprobsAreSortedWithLowerIdOnTies) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, kNegInf, 0.0f};
  const double lse = LogSumExp(logits);
  const std::vector<TokenLogprob> top = TopLogprobs(logits, 3, lse);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token_id, 1);
  EXPECT_EQ(top[1].token_id, 3);
  EXPECT_EQ(top[2].token_id, 2);
  EXPECT_NEAR(top[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(top[1].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(top[2].logprob, 2.0 - lse, 1e-6);
}

TEST(LogprobsTest, TopLogprobsMatchHandComputedLogSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const std::vector<TokenLogprob> top = TopLogprobs(logits, 3, LogSumExp(logits));
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token_id, 2);
  EXPECT_NEAR(top[0].logprob, -0.4076059644443806, 1e-6);
  EXPECT_NEAR(top[1].logprob, -1.4076059644443806, 1e-6);
  EXPECT_NEAR(top[2].logprob, -2.4076059644443806, 1e-6);
}

TEST(LogprobsTest, MaskedTokensAndZeroCountAreLeftOut) {
  const std::vector<float> logits = {kNegInf, 0.5f, kNegInf};
  const std::vector<TokenLogprob> top = TopLogprobs(logits, 5, LogSumExp(logits));
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].token_id, 1);
  EXPECT_FLOAT_EQ(top[0].logprob, 0.0f);
  EXPECT_TRUE(TopLogprobs(logits, 0, 0.0).empty());
}

TEST(LogprobsTest, TopLogprobsOnALargeVocabMatchAFullSort) {
  std::vector<float> logits(50000);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = static_cast<float>((i * 7919) % 1009) * 0.01f;  // many ties
  }
  const std::vector<TokenLogprob> top = TopLogprobs(logits, 20, 0.0);
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(top.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(top[i].token_id, ids[i]) << i;
    EXPECT_EQ(top[i].logprob, logits[ids[i]]);
  }
}

}  // namespace
}  // namespace tokenselect::engine
