#include "engine/model/fp8.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/model/kv_cache_dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::HasSubstr;

// Every code's value from the format's definition (sign, 4-bit exponent with bias 7, 3-bit
// mantissa, subnormals at exponent 0, S.1111.111 NaN), computed independently of E4m3ToFloat.
double Reference(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * m / 8.0 / 64.0;
  return sign * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}

TEST(Fp8Test, DecodesEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float v = E4m3ToFloat(static_cast<uint8_t>(code));
    const double want = Reference(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(v), want) << code;
      EXPECT_EQ(std::signbit(v), (code & 0x80) != 0) << code;
    }
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8Test, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float v = E4m3ToFloat(static_cast<uint8_t>(code));
    const uint8_t want = std::isnan(v) ? 0x7f : static_cast<uint8_t>(code);
    EXPECT_EQ(FloatToE4m3(v), want) << code;
  }
}

// Between neighbouring codes of the same sign: the exact midpoint goes to the even code (lower
// mantissa bit 0), one float step either side goes to the nearer code.
TEST(Fp8Test, MidpointsAndTiesRoundToNearestEven) {
  int ties = 0;
  for (int sign : {0, 0x80}) {
    for (int code = 0; code < 0x7e; ++code) {
      const uint8_t lo = static_cast<uint8_t>(sign | code), hi = static_cast<uint8_t>(lo + 1);
      const float a = E4m3ToFloat(lo), b = E4m3ToFloat(hi);
      const float mid = (a + b) / 2;  // exact: few significant bits
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
      const uint8_t even = (lo & 1) == 0 ? lo : hi;
      EXPECT_EQ(FloatToE4m3(mid), even) << "between codes " << int{lo} << " and " << int{hi};
      const float toward_a = std::nextafter(mid, a), toward_b = std::nextafter(mid, b);
      EXPECT_EQ(FloatToE4m3(toward_a), lo) << int{lo};
      EXPECT_EQ(FloatToE4m3(toward_b), hi) << int{hi};
      ++ties;
    }
  }
  EXPECT_EQ(ties, 2 * 0x7e);
  // Examples across the subnormal / normal boundary and at the top.
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -10)), 0x00);        // half of the smallest: tie to 0
  EXPECT_EQ(FloatToE4m3(std::ldexp(3.0f, -10)), 0x02);        // 1.5 steps: tie to 2
  EXPECT_EQ(FloatToE4m3(std::ldexp(15.0f, -10)), 0x08);       // 7.5 steps: tie to 8 = 2^-6
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(FloatToE4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(FloatToE4m3(432.0f), 0x7e);                       // tie between 416 and 448: even
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);                      // tie between 1 and 1.125
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3a);                      // tie between 1.125 and 1.25
}

TEST(Fp8Test, SaturatesNaNAndZeros) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e6f, 3e38f, inf}) {
    EXPECT_EQ(FloatToE4m3(x), 0x7e) << x;
    EXPECT_EQ(FloatToE4m3(-x), 0xfe) << x;
  }
  EXPECT_EQ(FloatToE4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(FloatToE4m3(-std::nanf("")), 0x7f);
  EXPECT_EQ(FloatToE4m3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3(-1e-30f), 0x80);  // rounds to zero, keeps the sign
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// Against a brute-force nearest-code search (ties to even) over many values of all magnitudes.
TEST(Fp8Test, MatchesNearestCodeSearch) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float x = std::ldexp(static_cast<float>(state >> 8) / (1 << 24) * 2 - 1,
                               static_cast<int>(state % 32) - 14);
    int best = -1;
    double best_err = 0;
    for (int code = 0; code < 256; ++code) {
      const double v = Reference(code);
      if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
      const double err = std::fabs(v - static_cast<double>(x));
      if (best < 0 || err < best_err || (err == best_err && (code & 1) == 0)) {
        best = code;
        best_err = err;
      }
    }
    ASSERT_EQ(FloatToE4m3(x), best) << x;
  }
}

TEST(Fp8Test, QuantizeDequantizeWithPowerOfTwoScale) {
  EXPECT_EQ(QuantizeDequantizeE4m3(3.0f, 0.25f), 3.0f);       // 12 is a code
  EXPECT_EQ(QuantizeDequantizeE4m3(1000.0f, 2.0f), 896.0f);   // saturates at 448 s
  EXPECT_EQ(QuantizeDequantizeE4m3(0.3f, 1.0f), 0.3125f);
}

TEST(KvCacheDTypeTest, ParsesNamesAndSizes) {
  EXPECT_EQ(ParseKvCacheDType("bf16").value(), KvCacheDType::kBF16);
  EXPECT_EQ(ParseKvCacheDType("fp8").value(), KvCacheDType::kFP8E4M3);
  for (KvCacheDType t : {KvCacheDType::kBF16, KvCacheDType::kFP8E4M3}) {
    EXPECT_EQ(ParseKvCacheDType(KvCacheDTypeName(t)).value(), t);
  }
  EXPECT_EQ(KvCacheElementBytes(KvCacheDType::kBF16), 2);
  EXPECT_EQ(KvCacheElementBytes(KvCacheDType::kFP8E4M3), 1);
  const auto bad = ParseKvCacheDType("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--kv_dtype"));
  EXPECT_THAT(bad.status().message(), HasSubstr("fp16"));
}

}  // namespace
}  // namespace tokenselect::engine
