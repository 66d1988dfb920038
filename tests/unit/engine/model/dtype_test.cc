#include "engine/model/dtype.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

TEST(DTypeTest, NamesSizesAndParsing) {
  EXPECT_STREQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeSize(DType::kF64), 8);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
  for (DType d :
       {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
        DType::kI8, DType::kU8, DType::kBool, DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  }
  EXPECT_FALSE(ParseDType("float32").has_value());
  EXPECT_TRUE(IsFloat32Convertible(DType::kBF16));
  EXPECT_FALSE(IsFloat32Convertible(DType::kF64));
}

TEST(DTypeTest, KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);  // tie with 2^16 rounds to even: infinity
  EXPECT_EQ(FloatToFp16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);              // smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);              // tie: to even (zero)
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);              // tie: to even (2)
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // tie down to even
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);        // tie up to even
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  EXPECT_EQ(Fp16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(Fp16ToFloat(0x8000)));
}

// Every 16-bit pattern converts to fp32 and back unchanged (NaNs stay NaN).
void CheckRoundTrip(float (*to_float)(uint16_t), uint16_t (*from_float)(float)) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = to_float(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(from_float(f))));
    } else {
      ASSERT_EQ(from_float(f), bits) << std::hex << bits;
    }
  }
}

TEST(DTypeTest, Bf16RoundTripsEveryPattern) { CheckRoundTrip(Bf16ToFloat, FloatToBf16); }
TEST(DTypeTest, Fp16RoundTripsEveryPattern) { CheckRoundTrip(Fp16ToFloat, FloatToFp16); }

// Between every two neighbouring finite positive values: the midpoint goes to the even one,
// anything above it up, anything below it down.
void CheckRoundsToNearestEven(float (*to_float)(uint16_t), uint16_t (*from_float)(float),
                              uint16_t max_finite) {
  for (uint32_t a = 0; a < max_finite; ++a) {
    const float lo = to_float(static_cast<uint16_t>(a));
    const float hi = to_float(static_cast<uint16_t>(a + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: 16-bit formats have < 24 mantissa bits
    const uint16_t even = (a % 2 == 0) ? a : a + 1;
    ASSERT_EQ(from_float(mid), even) << std::hex << a;
    ASSERT_EQ(from_float(std::nextafter(mid, hi)), a + 1) << std::hex << a;
    ASSERT_EQ(from_float(std::nextafter(mid, lo)), a) << std::hex << a;
    ASSERT_EQ(from_float(-mid), 0x8000 | even) << std::hex << a;
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  CheckRoundsToNearestEven(Bf16ToFloat, FloatToBf16, 0x7f7f);
}
TEST(DTypeTest, Fp16RoundsToNearestEven) {
  CheckRoundsToNearestEven(Fp16ToFloat, FloatToFp16, 0x7bff);
}

TEST(DTypeTest, BulkConversionMatchesScalar) {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159f, 1e-6f, -65504.0f, 1e30f};
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<unsigned char> bytes(values.size() * DTypeSize(d) + 1);
    // Deliberately misaligned.
    ConvertFromFloat32(d, values.data(), values.size(), bytes.data() + 1);
    std::vector<float> back(values.size());
    ConvertToFloat32(d, bytes.data() + 1, values.size(), back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = d == DType::kF32   ? values[i]
                             : d == DType::kF16 ? Fp16ToFloat(FloatToFp16(values[i]))
                                                : Bf16ToFloat(FloatToBf16(values[i]));
      EXPECT_EQ(back[i], expected) << DTypeName(d) << " " << values[i];
    }
  }
}

}  // namespace
}  // namespace tokenselect::engine
