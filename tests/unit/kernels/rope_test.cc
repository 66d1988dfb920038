// RopeInverseFrequencies (kernels/rope.cc) against tables dumped from transformers itself
// (hf_rope_golden.h) and against the transformers formulas evaluated in double; the RoPE cos/sin
// (kernels/cpu/vec_math.h) against transformers' own cos/sin; cpu::ApplyRope against the double
// rotate_half reference.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/hf_rope_golden.h"
#include "tests/unit/kernels/reference.h"

namespace tokenselect::kernels {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::vector<double> DefaultInvFreq(int64_t head_dim, double theta) {
  std::vector<double> inv;
  for (int64_t i = 0; i < head_dim; i += 2) {
    inv.push_back(1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(head_dim)));
  }
  return inv;
}

// Distance in units in the last place between two floats of the same sign.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

RopeParams GoldenParams(const testing::HfRopeGolden& g) {
  RopeParams p;
  p.head_dim = g.head_dim;
  p.theta = g.theta;
  p.scaling = g.scaling == 0   ? RopeScaling::kNone
              : g.scaling == 1 ? RopeScaling::kLinear
                               : RopeScaling::kLlama3;
  p.factor = g.factor;
  p.low_freq_factor = g.low_freq_factor;
  p.high_freq_factor = g.high_freq_factor;
  p.original_max_position = g.original_max_position;
  return p;
}

// Bit-exact with transformers wherever torch's fp32 pow (Sleef, within 1 ulp) is correctly
// rounded, as libm's powf is. Where it is not, the two differ by 1 ulp; in the golden set that
// happens at three near-ties of the exact power (checked in high precision: ours is the
// correctly rounded one), listed here so that any other difference fails.
TEST(RopeInverseFrequenciesTest, MatchesTransformersTables) {
  const std::set<std::pair<std::string, size_t>> known_pow_ties = {
      {"qwen2_7b", 37}, {"default_d96", 20}, {"linear_x2_5_d96", 20}};
  for (const testing::HfRopeGolden& g : testing::HfRopeGoldens()) {
    SCOPED_TRACE(g.name);
    const std::vector<float> got = RopeInverseFrequencies(GoldenParams(g));
    ASSERT_EQ(got.size(), g.inv_freq.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (known_pow_ties.count({g.name, i}) > 0) {
        EXPECT_EQ(UlpDistance(got[i], g.inv_freq[i]), 1) << "index " << i;
      } else {
        EXPECT_EQ(got[i], g.inv_freq[i]) << "index " << i;
      }
    }
  }
}

// cos/sin of the fp32 angle float(position) * inv_freq[i], given transformers' own inv_freq:
// torch's fp32 cos/sin are within 1 ulp and ours are correctly rounded but for rare ties, so the
// two differ by at most 1 ulp (and mostly not at all).
TEST(RopeCosSinTest, MatchesTransformersCosSin) {
  int64_t values = 0, exact = 0;
  for (const testing::HfRopeGolden& g : testing::HfRopeGoldens()) {
    if (g.cos.empty()) continue;
    SCOPED_TRACE(g.name);
    const int64_t half = g.head_dim / 2;
    std::vector<float> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half));
    for (size_t p = 0; p < testing::kHfRopePositions.size(); ++p) {
      cpu::RopeCosSin(testing::kHfRopePositions[p], g.inv_freq.data(), half, cos.data(),
                      sin.data());
      for (size_t i = 0; i < cos.size(); ++i) {
        EXPECT_LE(UlpDistance(cos[i], g.cos[p][i]), 1) << "position " << p << " index " << i;
        EXPECT_LE(UlpDistance(sin[i], g.sin[p][i]), 1) << "position " << p << " index " << i;
        values += 2;
        exact += (cos[i] == g.cos[p][i]) + (sin[i] == g.sin[p][i]);
      }
    }
  }
  EXPECT_GT(exact, values * 9 / 10);
}

enum class Band { kHigh, kMedium, kLow };

// Llama 3.1 scaling in double, straight from the published formula; also reports the band.
double Llama3InvFreq(double inv, const RopeParams& p, Band* band) {
  const double wavelen = 2.0 * kPi / inv;
  const double old_len = static_cast<double>(p.original_max_position);
  const double low_freq_wavelen = old_len / p.low_freq_factor;
  const double high_freq_wavelen = old_len / p.high_freq_factor;
  if (wavelen < high_freq_wavelen) {
    *band = Band::kHigh;
    return inv;
  }
  if (wavelen > low_freq_wavelen) {
    *band = Band::kLow;
    return inv / p.factor;
  }
  *band = Band::kMedium;
  const double smooth =
      (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
  return (1.0 - smooth) * inv / p.factor + smooth * inv;
}

// fp32 evaluation (the exponent 2i/d rounded to fp32 first, as torch does) moves the result by a
// few 1e-7 relative to the exact formula when 2i/d is not a binary fraction.
constexpr double kRelTolerance = 2e-6;

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], kRelTolerance * want[i]) << "index " << i;
  }
}

TEST(RopeInverseFrequenciesTest, DefaultMatchesFormula) {
  for (int64_t head_dim : {2, 64, 96, 128}) {
    for (double theta : {10000.0, 500000.0, 1000000.0}) {
      RopeParams p;
      p.head_dim = head_dim;
      p.theta = theta;
      ExpectClose(RopeInverseFrequencies(p), DefaultInvFreq(head_dim, theta));
    }
  }
  RopeParams p;
  p.head_dim = 128;
  p.theta = 10000.0;
  const std::vector<float> inv = RopeInverseFrequencies(p);
  EXPECT_EQ(inv[0], 1.0f);  // theta^0
}

TEST(RopeInverseFrequenciesTest, LinearDividesByFactor) {
  RopeParams p;
  p.head_dim = 96;
  p.theta = 10000.0;
  p.scaling = RopeScaling::kLinear;
  p.factor = 2.5;
  std::vector<double> want = DefaultInvFreq(96, 10000.0);
  for (double& w : want) w /= 2.5;
  ExpectClose(RopeInverseFrequencies(p), want);
}

TEST(RopeInverseFrequenciesTest, Llama31MatchesFormulaInEveryBand) {
  RopeParams p;  // Llama-3.1 rope_scaling
  p.head_dim = 128;
  p.theta = 500000.0;
  p.scaling = RopeScaling::kLlama3;
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position = 8192;
  const std::vector<float> got = RopeInverseFrequencies(p);
  const std::vector<double> base = DefaultInvFreq(128, 500000.0);
  ASSERT_EQ(got.size(), 64u);
  std::vector<double> want;
  std::vector<Band> bands;
  for (double inv : base) {
    Band band;
    want.push_back(Llama3InvFreq(inv, p, &band));
    bands.push_back(band);
  }
  ExpectClose(got, want);
  // Wavelengths 2 pi 500000^(i/64) cross 2048 between i = 28 and 29 and 8192 between 34 and 35.
  for (int i : {0, 1, 17, 28}) {
    EXPECT_EQ(bands[static_cast<size_t>(i)], Band::kHigh) << i;
    EXPECT_NEAR(got[static_cast<size_t>(i)], base[static_cast<size_t>(i)],
                kRelTolerance * base[static_cast<size_t>(i)]);
  }
  for (int i : {29, 31, 34}) {
    EXPECT_EQ(bands[static_cast<size_t>(i)], Band::kMedium) << i;
    EXPECT_LT(got[static_cast<size_t>(i)], base[static_cast<size_t>(i)]);
    EXPECT_GT(got[static_cast<size_t>(i)], base[static_cast<size_t>(i)] / 8.0);
  }
  for (int i : {35, 50, 63}) {
    EXPECT_EQ(bands[static_cast<size_t>(i)], Band::kLow) << i;
    EXPECT_NEAR(got[static_cast<size_t>(i)], base[static_cast<size_t>(i)] / 8.0,
                kRelTolerance * base[static_cast<size_t>(i)] / 8.0);
  }
}

TEST(RopeInverseFrequenciesTest, Llama3WithOtherParameters) {
  RopeParams p;
  p.head_dim = 64;
  p.theta = 10000.0;
  p.scaling = RopeScaling::kLlama3;
  p.factor = 4.0;
  p.low_freq_factor = 2.0;
  p.high_freq_factor = 8.0;
  p.original_max_position = 2048;
  std::vector<double> want;
  int medium = 0;
  for (double inv : DefaultInvFreq(64, 10000.0)) {
    Band band;
    want.push_back(Llama3InvFreq(inv, p, &band));
    medium += band == Band::kMedium;
  }
  EXPECT_GT(medium, 0);
  ExpectClose(RopeInverseFrequencies(p), want);
}

TEST(ApplyRopeTest, MatchesRotateHalfReference) {
  std::mt19937 rng(3);
  for (int64_t head_dim : {2, 64, 128, 18}) {
    const int64_t num_tokens = 6, num_heads = 3;
    RopeParams rp;
    rp.head_dim = head_dim;
    rp.theta = 500000.0;
    const std::vector<float> inv_freq = RopeInverseFrequencies(rp);
    std::vector<float> x =
        testing::RandomVector(static_cast<size_t>(num_tokens * num_heads * head_dim), rng);
    const std::vector<float> original = x;
    const std::vector<int32_t> positions = {0, 1, 7, 4095, 1000003, 16777216};
    cpu::ApplyRope(x.data(), positions.data(), num_tokens, num_heads, head_dim, inv_freq.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t off = (t * num_heads + h) * head_dim;
        const std::vector<double> want = testing::ReferenceRotate(
            original.data() + off, head_dim, positions[static_cast<size_t>(t)], inv_freq);
        for (int64_t c = 0; c < head_dim; ++c) {
          ASSERT_NEAR(x[static_cast<size_t>(off + c)], want[static_cast<size_t>(c)], 1e-6)
              << "d=" << head_dim << " t=" << t << " h=" << h << " c=" << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokenselect::kernels
