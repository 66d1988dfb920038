#include "engine/selection/selection_query.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::HasSubstr;

// inv_freq[i] = theta^(-2i / d), computed here in double (independent of kernels/).
std::vector<float> InvFreq(int64_t head_dim, double theta) {
  std::vector<float> f(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    f[i] = static_cast<float>(std::pow(theta, -2.0 * i / head_dim));
  }
  return f;
}

// Reference: "rotate_half" RoPE at n_local + i in double, then the mean over the chunk.
std::vector<double> Reference(const std::vector<float>& q, int64_t num_q, int64_t heads, int64_t d,
                              int64_t n_local, const std::vector<float>& inv_freq) {
  std::vector<double> out(heads * d, 0.0);
  for (int64_t i = 0; i < num_q; ++i) {
    const double pos = static_cast<double>(n_local + i);
    for (int64_t h = 0; h < heads; ++h) {
      const float* x = &q[(i * heads + h) * d];
      for (int64_t e = 0; e < d / 2; ++e) {
        const double angle = pos * inv_freq[e];
        const double x1 = x[e], x2 = x[e + d / 2];
        out[h * d + e] += (x1 * std::cos(angle) - x2 * std::sin(angle)) / num_q;
        out[h * d + e + d / 2] += (x2 * std::cos(angle) + x1 * std::sin(angle)) / num_q;
      }
    }
  }
  return out;
}

std::vector<float> RandomQ(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
}

TEST(SelectionQueryTest, MatchesRotateHalfReferenceForChunksAndDecode) {
  struct Case {
    int64_t num_q, heads, d, n_local;
  };
  for (const Case& c :
       {Case{1, 4, 64, 512}, Case{512, 8, 128, 512}, Case{7, 2, 16, 0}, Case{33, 32, 128, 100}}) {
    const std::vector<float> inv_freq = InvFreq(c.d, 500000.0);
    const std::vector<float> q = RandomQ(c.num_q * c.heads * c.d, static_cast<uint32_t>(c.d));
    absl::StatusOr<std::vector<float>> got =
        BuildSelectionQuery(q.data(), c.num_q, c.heads, c.d, c.n_local, inv_freq.data());
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<double> want = Reference(q, c.num_q, c.heads, c.d, c.n_local, inv_freq);
    ASSERT_EQ(got->size(), want.size());
    // fp32 angles at positions up to ~1000 differ from double by ~1e-4 rad.
    for (size_t e = 0; e < want.size(); ++e) {
      EXPECT_NEAR((*got)[e], want[e], 2e-3) << "num_q=" << c.num_q << " element " << e;
    }
  }
}

TEST(SelectionQueryTest, DecodeRotatesAtNLocalNotZero) {
  const int64_t d = 8;
  const std::vector<float> inv_freq = InvFreq(d, 10000.0);
  const std::vector<float> q = {1, 0, 0, 0, 0, 0, 0, 0};
  absl::StatusOr<std::vector<float>> got =
      BuildSelectionQuery(q.data(), 1, 1, d, 3, inv_freq.data());
  ASSERT_TRUE(got.ok());
  // Pair (0, 4) rotates by 3 * inv_freq[0] = 3 rad.
  EXPECT_NEAR((*got)[0], std::cos(3.0), 1e-5);
  EXPECT_NEAR((*got)[4], std::sin(3.0), 1e-5);
  EXPECT_NEAR((*got)[1], 0.0, 1e-6);
}

TEST(SelectionQueryTest, RejectsBadArguments) {
  const std::vector<float> inv_freq = InvFreq(8, 10000.0);
  const std::vector<float> q(64, 1.0f);
  auto message = [&](const float* qp, int64_t num_q, int64_t heads, int64_t d, int64_t n_local) {
    absl::StatusOr<std::vector<float>> r =
        BuildSelectionQuery(qp, num_q, heads, d, n_local, inv_freq.data());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message(q.data(), 0, 1, 8, 0), HasSubstr("num_q"));
  EXPECT_THAT(message(q.data(), 1, 0, 8, 0), HasSubstr("num_heads"));
  EXPECT_THAT(message(q.data(), 1, 1, 0, 0), HasSubstr("head_dim"));
  EXPECT_THAT(message(q.data(), 1, 1, 7, 0), HasSubstr("head_dim must be even"));
  EXPECT_THAT(message(q.data(), 1, 1, 8, -1), HasSubstr("n_local"));
  EXPECT_THAT(message(nullptr, 1, 1, 8, 0), HasSubstr("q and inv_freq"));
}

}  // namespace
}  // namespace tokenselect::engine
