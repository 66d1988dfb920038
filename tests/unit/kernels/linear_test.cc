// cpu::Linear (kernels/cpu/linear.cc): y = x W^T (+ b), W in nn.Linear [out, in] layout, against
// a double loop; covers the sgemv (m == 1) and sgemm paths, odd sizes and k == 0.
#include <omp.h>

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

TEST(LinearTest, MatchesReference) {
  std::mt19937 rng(7);
  for (int64_t m : {1, 3, 17}) {
    for (int64_t k : {1, 5, 64, 130}) {
      for (int64_t n : {1, 7, 33}) {
        for (bool with_bias : {false, true}) {
          const std::vector<float> x = testing::RandomVector(static_cast<size_t>(m * k), rng);
          const std::vector<float> w = testing::RandomVector(static_cast<size_t>(n * k), rng);
          const std::vector<float> b = testing::RandomVector(static_cast<size_t>(n), rng);
          std::vector<float> y(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
          cpu::Linear(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, m, k, n);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < n; ++c) {
              double want = with_bias ? b[c] : 0.0;
              for (int64_t i = 0; i < k; ++i) want += double(x[r * k + i]) * w[c * k + i];
              ASSERT_NEAR(y[r * n + c], want, 1e-6 * (1.0 + static_cast<double>(k)))
                  << "m=" << m << " k=" << k << " n=" << n << " bias=" << with_bias;
            }
          }
        }
      }
    }
  }
}

TEST(LinearTest, ResultsDoNotDependOnTheThreadCount) {
  // Column blocks have a fixed size, so every output is the same BLAS call whatever the number
  // of OpenMP threads: bit-identical results for decode (m = 1) and prefill shapes, odd n.
  std::mt19937 rng(11);
  for (int64_t m : {1, 37}) {
    const int64_t k = 300, n = 1031;
    const std::vector<float> x = testing::RandomVector(static_cast<size_t>(m * k), rng);
    const std::vector<float> w = testing::RandomVector(static_cast<size_t>(n * k), rng);
    const std::vector<float> b = testing::RandomVector(static_cast<size_t>(n), rng);
    std::vector<float> one(static_cast<size_t>(m * n)), many(static_cast<size_t>(m * n));
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu::Linear(one.data(), x.data(), w.data(), b.data(), m, k, n);
    omp_set_num_threads(4);
    cpu::Linear(many.data(), x.data(), w.data(), b.data(), m, k, n);
    omp_set_num_threads(saved);
    EXPECT_EQ(one, many) << "m=" << m;
  }
}

TEST(LinearTest, EmptyReductionGivesBiasOrZero) {
  const std::vector<float> b = {1.5f, -2.0f};
  std::vector<float> y(6, std::numeric_limits<float>::quiet_NaN());
  cpu::Linear(y.data(), nullptr, nullptr, b.data(), 3, 0, 2);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 1.5f, -2.0f, 1.5f, -2.0f}));
  cpu::Linear(y.data(), nullptr, nullptr, nullptr, 3, 0, 2);
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  cpu::Linear(nullptr, nullptr, nullptr, nullptr, 0, 4, 2);  // m == 0: nothing to do
}

}  // namespace
}  // namespace tokenselect::kernels
