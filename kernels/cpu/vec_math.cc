// Vectorisable math for the CPU kernels; see vec_math.h for the contracts.
//
// Every function here is a plain loop without calls or data-dependent branches so that GCC
// vectorises it; TS_CPU_CLONES builds it for AVX2 and for baseline x86-64 and lets the dynamic
// loader pick (an ifunc), so the binary stays portable. Rounding to integers uses the
// add-and-subtract-a-magic-constant trick (round to nearest in the default rounding mode), which
// needs no SSE4.1 and is not folded away without -ffast-math.
#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TS_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TS_CPU_CLONES
#endif

namespace tokenselect::kernels::cpu {
namespace {

// pi/2 as the sum of three doubles: the first two have at most 29 significant bits, so k * part
// is exact for |k| < 2^24 and the reduction r = x - k * pi/2 keeps ~1e-16 absolute accuracy.
constexpr double kPio2Part1 = 0x1.921fb54p+0;
constexpr double kPio2Part2 = 0x1.10b4611p-30;
constexpr double kPio2Part3 = 0x1.4c4c6628b80dcp-59;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
constexpr double kRoundMagicD = 0x1.8p52;  // (v + m) - m rounds v to an integer, |v| < 2^51
constexpr float kMaxRopeAngle = 0x1.0p23f;

// Taylor coefficients; on |r| <= pi/4 the truncation errors are below 1e-11 (sin, degree 11)
// and 1e-12 (cos, degree 12), far under half an fp32 ulp.
constexpr double kSin3 = -1.0 / 6.0;
constexpr double kSin5 = 1.0 / 120.0;
constexpr double kSin7 = -1.0 / 5040.0;
constexpr double kSin9 = 1.0 / 362880.0;
constexpr double kSin11 = -1.0 / 39916800.0;
constexpr double kCos2 = -1.0 / 2.0;
constexpr double kCos4 = 1.0 / 24.0;
constexpr double kCos6 = -1.0 / 720.0;
constexpr double kCos8 = 1.0 / 40320.0;
constexpr double kCos10 = -1.0 / 3628800.0;
constexpr double kCos12 = 1.0 / 479001600.0;

// exp: t = k ln2 + r with |r| <= ln2 / 2; ln2 split so that k * kLn2Hi is exact for |k| < 2^7.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0x1.62e4p-1f;             // 17 significant bits
constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kLn2Hi
constexpr float kRoundMagicF = 0x1.8p23f;          // rounds |v| < 2^22 to an integer
constexpr float kExpMin = -87.0f;                  // exp(-87) ~ 1.6e-38, still a normal float
constexpr float kExpMax = 88.0f;

inline void RotateHalfInline(float* __restrict__ out, const float* __restrict__ x,
                             const float* __restrict__ cos, const float* __restrict__ sin,
                             int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[i];
    const float x1 = x[i + half];
    out[i] = x0 * cos[i] - x1 * sin[i];
    out[i + half] = x1 * cos[i] + x0 * sin[i];
  }
}

}  // namespace

TS_CPU_CLONES void RopeCosSin(int32_t position, const float* __restrict__ inv_freq, int64_t half,
                              float* __restrict__ cos_out, float* __restrict__ sin_out) {
  const float p = static_cast<float>(position);
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const double x = static_cast<double>(p * inv_freq[i]);
    const double k = (x * kTwoOverPi + kRoundMagicD) - kRoundMagicD;
    const double r = ((x - k * kPio2Part1) - k * kPio2Part2) - k * kPio2Part3;
    const double r2 = r * r;
    const double s =
        r + r * r2 * (kSin3 + r2 * (kSin5 + r2 * (kSin7 + r2 * (kSin9 + r2 * kSin11))));
    const double c =
        1.0 +
        r2 * (kCos2 + r2 * (kCos4 + r2 * (kCos6 + r2 * (kCos8 + r2 * (kCos10 + r2 * kCos12)))));
    // Quadrant q = k mod 4, exactly, in double: floor(k / 4) = round(k / 4 - 3/8). The sign and
    // swap selection below is arithmetic on exact 0/1 values (no compares, so it vectorises).
    const double floor_quarter = ((k * 0.25 - 0.375) + kRoundMagicD) - kRoundMagicD;
    const double q = k - 4.0 * floor_quarter;                            // 0, 1, 2 or 3
    const double hi = ((q * 0.5 - 0.25) + kRoundMagicD) - kRoundMagicD;  // q >= 2
    const double odd = q - 2.0 * hi;                                     // q is 1 or 3
    const double sin_mag = (1.0 - odd) * s + odd * c;
    const double cos_mag = (1.0 - odd) * c + odd * s;
    const double cos_negative = hi + odd - 2.0 * hi * odd;  // q is 1 or 2
    sin_out[i] = static_cast<float>((1.0 - 2.0 * hi) * sin_mag);
    cos_out[i] = static_cast<float>((1.0 - 2.0 * cos_negative) * cos_mag);
  }
  // Rare: huge angles (or NaN) take libm's double cos/sin (its reduction is exact at any size).
  for (int64_t i = 0; i < half; ++i) {
    const float angle = p * inv_freq[i];
    if (!(std::fabs(angle) < kMaxRopeAngle)) {
      cos_out[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_out[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

TS_CPU_CLONES float ExpShiftedInPlace(float* __restrict__ x, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float t = x[i] - shift;
    float tc = t < kExpMin ? kExpMin : t;  // -inf too
    tc = tc > kExpMax ? kExpMax : tc;
    const float k = (tc * kLog2e + kRoundMagicF) - kRoundMagicF;
    const float r = (tc - k * kLn2Hi) - k * kLn2Lo;
    float poly = 1.0f / 5040.0f;
    poly = poly * r + 1.0f / 720.0f;
    poly = poly * r + 1.0f / 120.0f;
    poly = poly * r + 1.0f / 24.0f;
    poly = poly * r + 1.0f / 6.0f;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) * (1 << 23);  // 2^k, k in [-126, 127]
    const float scale = __builtin_bit_cast(float, bits);
    const float e = t < kExpMin ? 0.0f : poly * scale;
    x[i] = e;
    sum += e;
  }
  return sum;
}

TS_CPU_CLONES float RowMax(const float* __restrict__ x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

TS_CPU_CLONES void RotateHalf(float* out, const float* x, const float* __restrict__ cos,
                              const float* __restrict__ sin, int64_t half) {
  // out may alias x: each pair (i, i + half) is read before it is written.
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[i];
    const float x1 = x[i + half];
    out[i] = x0 * cos[i] - x1 * sin[i];
    out[i + half] = x1 * cos[i] + x0 * sin[i];
  }
}

TS_CPU_CLONES void GatherRotateRows(float* __restrict__ dst, const float* __restrict__ src,
                                    const int32_t* __restrict__ slots, int64_t n,
                                    int64_t slot_stride, const float* __restrict__ cos,
                                    const float* __restrict__ sin, int64_t half) {
  const int64_t dim = 2 * half;
  for (int64_t j = 0; j < n; ++j) {
    RotateHalfInline(dst + j * dim, src + static_cast<int64_t>(slots[j]) * slot_stride,
                     cos + j * half, sin + j * half, half);
  }
}

void GatherRows(float* __restrict__ dst, const float* __restrict__ src,
                const int32_t* __restrict__ slots, int64_t n, int64_t slot_stride,
                int64_t row_len) {
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(dst + j * row_len, src + static_cast<int64_t>(slots[j]) * slot_stride,
                sizeof(float) * static_cast<size_t>(row_len));
  }
}

}  // namespace tokenselect::kernels::cpu
