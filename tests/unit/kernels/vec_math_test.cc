// The vectorised helpers of kernels/cpu/vec_math.cc against libm in double.
#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/reference.h"

namespace tokenselect::kernels::cpu {
namespace {

// Distance to the next float away from zero at |x|.
double Ulp(double x) {
  const float f = static_cast<float>(std::fabs(x));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

TEST(RopeCosSinTest, WithinOneUlpOfTheFp32Angle) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> small_pos(0, 70000);
  std::uniform_int_distribution<int32_t> large_pos(0, 1 << 24);
  std::vector<float> inv_freq = testing::RandomVector(200, rng, 0.0f, 1.0f);
  inv_freq.push_back(1.0f);
  inv_freq.push_back(1e-7f);
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> cos(inv_freq.size()), sin(inv_freq.size());
  int64_t checked = 0, exact = 0;
  std::vector<int32_t> positions = {0, 1, 2, 3, 100, 8388607, 16777216, 33554432, 2147483647};
  for (int t = 0; t < 300; ++t) positions.push_back(t % 2 ? small_pos(rng) : large_pos(rng));
  for (int32_t position : positions) {
    RopeCosSin(position, inv_freq.data(), half, cos.data(), sin.data());
    for (int64_t i = 0; i < half; ++i) {
      const double angle = testing::RopeAngle(position, inv_freq[static_cast<size_t>(i)]);
      const double want_cos = std::cos(angle), want_sin = std::sin(angle);
      const double tol_cos = std::max(Ulp(want_cos), 1e-15);
      const double tol_sin = std::max(Ulp(want_sin), 1e-15);
      ASSERT_LE(std::fabs(cos[static_cast<size_t>(i)] - want_cos), tol_cos)
          << "position " << position << " inv_freq " << inv_freq[static_cast<size_t>(i)];
      ASSERT_LE(std::fabs(sin[static_cast<size_t>(i)] - want_sin), tol_sin)
          << "position " << position << " inv_freq " << inv_freq[static_cast<size_t>(i)];
      exact += cos[static_cast<size_t>(i)] == static_cast<float>(want_cos);
      exact += sin[static_cast<size_t>(i)] == static_cast<float>(want_sin);
      checked += 2;
    }
  }
  // Double-precision reduction and polynomials: essentially always correctly rounded.
  EXPECT_GT(static_cast<double>(exact), 0.999 * static_cast<double>(checked));
}

TEST(ExpShiftedInPlaceTest, AccurateAndFlushesTheFarTail) {
  std::mt19937 rng(12);
  std::vector<float> x = testing::RandomVector(10000, rng, -90.0f, 5.0f);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(5.0f);
  x.push_back(-87.5f);
  const std::vector<float> original = x;
  const float shift = 5.0f;
  const float sum = ExpShiftedInPlace(x.data(), static_cast<int64_t>(x.size()), shift);
  double want_sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = static_cast<double>(original[i] - shift);  // the fp32 difference
    if (t < -87.0) {
      EXPECT_EQ(x[i], 0.0f) << original[i];
      continue;
    }
    const double want = std::exp(t);
    want_sum += want;
    EXPECT_LE(std::fabs(x[i] - want), 2.0 * Ulp(want)) << original[i];
  }
  EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum);
}

TEST(RowMaxTest, FindsTheMaximum) {
  std::vector<float> x = {-3.0f, 2.5f, 7.0f, -1.0f, 6.5f};
  EXPECT_EQ(RowMax(x.data(), 5), 7.0f);
  EXPECT_EQ(RowMax(x.data(), 2), 2.5f);
  EXPECT_EQ(RowMax(x.data(), 0), -std::numeric_limits<float>::infinity());
}

TEST(GatherRowsTest, GathersAndRotatesRowsBySlot) {
  std::mt19937 rng(13);
  const int64_t half = 5, dim = 10, heads = 3, slots = 7;
  const std::vector<float> src =
      testing::RandomVector(static_cast<size_t>(slots * heads * dim), rng);
  const std::vector<int32_t> slot_list = {6, 0, 3, 3};
  std::vector<float> cos = testing::RandomVector(4 * half, rng);
  std::vector<float> sin = testing::RandomVector(4 * half, rng);
  std::vector<float> rotated(4 * dim), copied(4 * dim);
  const int64_t head = 2;
  GatherRotateRows(rotated.data(), src.data() + head * dim, slot_list.data(), 4, heads * dim,
                   cos.data(), sin.data(), half);
  GatherRows(copied.data(), src.data() + head * dim, slot_list.data(), 4, heads * dim, dim);
  for (int64_t j = 0; j < 4; ++j) {
    const float* row = src.data() + (slot_list[static_cast<size_t>(j)] * heads + head) * dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cos[static_cast<size_t>(j * half + i)];
      const float s = sin[static_cast<size_t>(j * half + i)];
      EXPECT_EQ(rotated[static_cast<size_t>(j * dim + i)], row[i] * c - row[i + half] * s);
      EXPECT_EQ(rotated[static_cast<size_t>(j * dim + i + half)], row[i + half] * c + row[i] * s);
    }
    for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(copied[static_cast<size_t>(j * dim + i)], row[i]);
  }
}

}  // namespace
}  // namespace tokenselect::kernels::cpu
