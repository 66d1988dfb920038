#include "engine/model/dtype.h"

#include <cmath>
#include <cstring>

#include "common/logging.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this code assumes a little-endian host"
#endif

namespace tokenselect::engine {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8},        {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},          {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  TS_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
  return kDTypes[0];
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

const char* DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

int64_t DTypeSize(DType dtype) { return Info(dtype).size; }

bool IsFloat32Convertible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

float Bf16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return BitsToFloat(FloatBits(magnitude) | sign);
  }
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN: keep it a (quiet) NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

uint16_t FloatToFp16(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t x = bits & 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  // 65520 and above (the midpoint between fp16's largest finite value and 2^16) round to inf.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x < 0x38800000u) {
    // Below 2^-14: an fp16 subnormal; the scaled value is exact in fp32 and nearbyint rounds
    // ties to even (the default rounding mode). 0x400 is the smallest normal, correctly encoded.
    const float scaled = std::ldexp(BitsToFloat(x), 24);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  x += 0xfffu + ((x >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return static_cast<uint16_t>(sign | ((x - 0x38000000u) >> 13));
}

void ConvertToFloat32(DType dtype, const void* src, int64_t count, float* out) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, bytes, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, sizeof(bits));
        out[i] = dtype == DType::kBF16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
      }
      return;
    default:
      TS_CHECK(false, "cannot convert {} to F32", DTypeName(dtype));
  }
}

void ConvertFromFloat32(DType dtype, const float* src, int64_t count, void* out) {
  auto* bytes = static_cast<unsigned char*>(out);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(bytes, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16(src[i]) : FloatToFp16(src[i]);
        std::memcpy(bytes + 2 * i, &bits, sizeof(bits));
      }
      return;
    default:
      TS_CHECK(false, "cannot convert F32 to {}", DTypeName(dtype));
  }
}

}  // namespace tokenselect::engine
