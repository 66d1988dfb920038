#include "engine/sampling/prng.h"

#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

// Reference values computed with an independent transcription of the published algorithms
// (splitmix64.c and xoshiro256starstar.c from prng.di.unimi.it).
TEST(PrngTest, SplitMix64MatchesReference) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64(&state), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(&state), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(SplitMix64(&state), 0x06c45d188009454fULL);
}

TEST(PrngTest, Xoshiro256StarStarMatchesReference) {
  Prng prng(42);
  EXPECT_EQ(prng.Next(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(prng.Next(), 0x6104d9866d113a7eULL);
  EXPECT_EQ(prng.Next(), 0xae17533239e499a1ULL);
  EXPECT_EQ(prng.Next(), 0xecb8ad4703b360a1ULL);
  Prng zero(0);
  EXPECT_EQ(zero.Next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(zero.Next(), 0xbf6e1f784956452aULL);
}

TEST(PrngTest, ForStepIsAFunctionOfSeedAndStep) {
  EXPECT_EQ(Prng::ForStep(7, 3).Next(), 0xb99ad9c2b562888fULL);
  EXPECT_EQ(Prng::ForStep(7, 3).Next(), Prng::ForStep(7, 3).Next());
  std::set<uint64_t> firsts;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    for (uint64_t step = 0; step < 32; ++step) firsts.insert(Prng::ForStep(seed, step).Next());
  }
  EXPECT_EQ(firsts.size(), 32u * 32u);
}

TEST(PrngTest, NextDoubleIsUniformInUnitInterval) {
  Prng prng(2024);
  constexpr int kDraws = 100000;
  double sum = 0.0;
  int below_quarter = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = prng.NextDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_quarter += u < 0.25;
  }
  // Mean 0.5 with standard error sqrt(1/12 / n) ~ 0.0009; P(u < 1/4) = 0.25, s.e. ~ 0.0014.
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  EXPECT_NEAR(static_cast<double>(below_quarter) / kDraws, 0.25, 0.007);
}

}  // namespace
}  // namespace tokenselect::engine
