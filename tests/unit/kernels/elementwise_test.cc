// Embedding, RmsNorm, SwiGlu, AddInPlace and Softmax (kernels/cpu/elementwise.cc) against
// double-precision loops.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/reference.h"

namespace tokenselect::kernels {
namespace {

using testing::RandomVector;

TEST(EmbeddingTest, CopiesRows) {
  std::mt19937 rng(1);
  const int64_t vocab = 11, dim = 7;
  const std::vector<float> table = RandomVector(static_cast<size_t>(vocab * dim), rng);
  const std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(ids.size() * dim, std::numeric_limits<float>::quiet_NaN());
  cpu::Embedding(out.data(), table.data(), ids.data(), 4, dim);
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      EXPECT_EQ(out[static_cast<size_t>(t * dim + c)],
                table[static_cast<size_t>(ids[t] * dim + c)]);
    }
  }
}

TEST(RmsNormTest, MatchesLlamaRmsNormInPlaceAndOutOfPlace) {
  std::mt19937 rng(2);
  for (int64_t dim : {1, 5, 4096}) {
    const int64_t rows = 9;
    const float eps = 1e-5f;
    const std::vector<float> x = RandomVector(static_cast<size_t>(rows * dim), rng, -4.0f, 4.0f);
    const std::vector<float> w = RandomVector(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
    std::vector<float> out(x.size());
    cpu::RmsNorm(out.data(), x.data(), w.data(), rows, dim, eps);
    std::vector<float> in_place = x;
    cpu::RmsNorm(in_place.data(), in_place.data(), w.data(), rows, dim, eps);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t c = 0; c < dim; ++c) ss += double(x[r * dim + c]) * x[r * dim + c];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t c = 0; c < dim; ++c) {
        const double want = w[c] * (x[r * dim + c] * inv);
        EXPECT_NEAR(out[r * dim + c], want, 1e-6 * (1.0 + std::fabs(want)));
        EXPECT_EQ(in_place[r * dim + c], out[r * dim + c]);
      }
    }
  }
}

TEST(SwiGluTest, SiluOfGateTimesUp) {
  std::mt19937 rng(3);
  const int64_t n = 100003;
  std::vector<float> gate = RandomVector(n, rng, -20.0f, 20.0f);
  const std::vector<float> up = RandomVector(n, rng, -3.0f, 3.0f);
  gate[0] = -100.0f;  // exp(100) overflows to inf; silu must still give -0
  std::vector<float> out(n);
  cpu::SwiGlu(out.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(out[i], want, 1e-6 * (1.0 + std::fabs(want))) << gate[i];
  }
  std::vector<float> aliased = gate;
  cpu::SwiGlu(aliased.data(), aliased.data(), up.data(), n);
  EXPECT_EQ(aliased, out);
}

TEST(AddInPlaceTest, Adds) {
  std::mt19937 rng(4);
  const int64_t n = 70001;
  std::vector<float> x = RandomVector(n, rng);
  const std::vector<float> y = RandomVector(n, rng);
  const std::vector<float> before = x;
  cpu::AddInPlace(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], before[i] + y[i]);
}

TEST(SoftmaxTest, StableAndNormalised) {
  std::mt19937 rng(5);
  const int64_t rows = 5, cols = 1001;
  std::vector<float> x = RandomVector(static_cast<size_t>(rows * cols), rng, -30.0f, 30.0f);
  x[0] = 1000.0f;                                         // would overflow without the max shift
  x[cols + 3] = -std::numeric_limits<float>::infinity();  // a masked entry
  const std::vector<float> original = x;
  cpu::Softmax(x.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    double max_v = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) max_v = std::max<double>(max_v, original[r * cols + c]);
    double total = 0.0;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(original[r * cols + c] - max_v);
    for (int64_t c = 0; c < cols; ++c) {
      const double want = std::exp(original[r * cols + c] - max_v) / total;
      ASSERT_NEAR(x[r * cols + c], want, 1e-6 * want + 1e-12) << r << "," << c;
    }
  }
  EXPECT_EQ(x[cols + 3], 0.0f);
}

}  // namespace
}  // namespace tokenselect::kernels
