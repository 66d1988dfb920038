// OCP FP8 E4M3 ("e4m3fn") on the CPU: the element type of the FP8 KV cache (docs/fp8_kv.md).
//
// Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, one NaN pattern
// per sign (S.1111.111). Normals (1 + m/8) 2^(e-7) for e in [1, 15] (largest 0x7e = 448),
// subnormals m 2^-9 for e = 0. Every code is exact in fp32, fp16 and bf16.
//
// FloatToE4m3 is bit-exact with CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (the
// cvt.rn.satfinite.e4m3x2.f32 instruction): round to nearest, ties to even; |x| >= 448 (and
// +-inf) saturates to +-448; NaN gives 0x7f; the sign of zero and of values that round to zero
// is kept. E4m3ToFloat is the exact decode (the device's fp8 -> half -> float). Header-only so
// that the CPU model, the fidelity harness and the GPU tests share one definition.
#ifndef TOKENSELECT_ENGINE_MODEL_FP8_H_
#define TOKENSELECT_ENGINE_MODEL_FP8_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tokenselect::engine {

constexpr float kE4m3Max = 448.0f;

inline uint8_t FloatToE4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                   // NaN
  if (a >= 0x43e00000u) return sign | 0x7eu;          // >= 448 (and inf): saturate
  if (a >= 0x3c800000u) {                             // >= 2^-6: normal in e4m3
    // Keep 3 of fp32's 23 mantissa bits, round to nearest even at bit 20; a carry into the
    // exponent is the right result (below 448 it never passes 0x7e).
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return sign | static_cast<uint8_t>((r >> 20) - (120u << 3));
  }
  // Subnormal in e4m3: the result is round(|x| 2^9) as an integer 0..8 (8 is the smallest
  // normal, code 0x08). |x| = mant 2^(exp - 150) with the implicit bit, so the integer part is
  // mant >> (141 - exp).
  const uint32_t exp = a >> 23;
  if (exp == 0) return sign;  // fp32 zero or subnormal: far below 2^-10
  const uint32_t shift = 141u - exp;  // >= 21 here (exp <= 120)
  if (shift > 25) return sign;        // below 2^-11: rounds to zero
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
  return sign | static_cast<uint8_t>(q);
}

inline float E4m3ToFloat(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xfu, m = code & 7u;
  float v;
  if (e == 0xf && m == 7) {
    v = std::nanf("");
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
  }
  return (code & 0x80u) != 0 ? -v : v;
}

// The FP8 cache's round trip of one value: float(e4m3(x / scale)) * scale, with `scale` a power
// of two (so x * (1 / scale) is x / scale exactly and the product is exact).
inline float QuantizeDequantizeE4m3(float x, float scale) {
  return E4m3ToFloat(FloatToE4m3(x * (1.0f / scale))) * scale;
}

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_FP8_H_
