#include "engine/model/kv_scales.h"

#include <cmath>
#include <limits>
#include <vector>

#include "engine/model/dtype.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/fp8.h"
#include "engine/model/model_presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::HasSubstr;

TEST(KvScalesTest, ScaleIsTheNextPowerOfTwo) {
  EXPECT_EQ(KvScaleFromBound(0.0), 1.0f);
  EXPECT_EQ(KvScaleFromBound(448.0), 1.0f);                       // exactly 448: 2^0
  EXPECT_EQ(KvScaleFromBound(std::nextafter(448.0, 1e9)), 2.0f);  // just above: 2^1
  EXPECT_EQ(KvScaleFromBound(447.0), 1.0f);
  EXPECT_EQ(KvScaleFromBound(224.0), 0.5f);
  EXPECT_EQ(KvScaleFromBound(225.0), 1.0f);
  EXPECT_EQ(KvScaleFromBound(7.0), 0.015625f);                    // 7/448 = 2^-6
  EXPECT_EQ(KvScaleFromBound(1e-300), std::ldexp(1.0f, -116));    // clamped
  for (double b : {0.001, 0.3, 5.5, 31.7, 1000.0, 123456.0}) {
    const float s = KvScaleFromBound(b);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << b;  // a power of two
    EXPECT_GE(448.0 * s, b) << b;             // covers the bound
    EXPECT_LT(448.0 * s / 2, b) << b;         // and is the smallest that does
  }
}

TEST(KvScalesTest, RowBoundRoundsToBf16AndAddsTheBias) {
  const std::vector<float> w = {1.0f, 2.0f, 1.00001f};  // the last rounds to 1 in bf16
  const std::vector<float> g = {1.0f, 0.5f, 2.0f};
  // sqrt(3) * ||(1, 1, 2)|| + |-0.5| = sqrt(3) sqrt(6) + 0.5
  EXPECT_DOUBLE_EQ(KvRowBound(w.data(), g.data(), -0.5f, 3), std::sqrt(18.0) + 0.5);
}

// The rule on a small model, recomputed here in the most direct form, and the bound it promises:
// no RMSNorm output can produce a key beyond 448 s.
TEST(KvScalesTest, SmallModelScalesMatchTheRuleAndBoundTheKeys) {
  PresetOptions po;
  po.vocab_size = 64;
  const ModelConfig config = PresetConfig("qwen2-bias", po).value();  // has k/v biases
  const ModelWeights w = LoadDummyWeights(config, 3).value();
  const std::vector<float> scales = ComputeKvScales(config, w).value();
  const int64_t hidden = config.hidden_size, d = config.head_dim, hkv = config.num_kv_heads;
  ASSERT_EQ(static_cast<int64_t>(scales.size()), config.num_layers * 2 * hkv);
  auto r = [](float x) { return static_cast<double>(Bf16ToFloat(FloatToBf16(x))); };
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    for (int v = 0; v < 2; ++v) {
      const std::vector<float>& proj = v == 0 ? lw.k_proj : lw.v_proj;
      const std::vector<float>& bias = v == 0 ? lw.k_bias : lw.v_bias;
      ASSERT_FALSE(bias.empty());
      for (int64_t h = 0; h < hkv; ++h) {
        double bound = 0;
        for (int64_t i = h * d; i < (h + 1) * d; ++i) {
          double sq = 0;
          for (int64_t j = 0; j < hidden; ++j) {
            sq += std::pow(r(proj[i * hidden + j]) * r(lw.input_layernorm[j]), 2);
          }
          bound = std::max(bound, std::sqrt(hidden * sq) + std::fabs(r(bias[i])));
        }
        const float s = scales[KvScaleIndex(l, v, h, hkv)];
        EXPECT_EQ(s, KvScaleFromBound(bound));
        EXPECT_GE(448.0 * s, bound);
        EXPECT_LT(448.0 * s / 2, bound);
        // The worst input for row h*d: x / rms(x) along W_i (.) g, scaled to norm sqrt(hidden).
        const int64_t i = h * d;
        double dot = 0, norm = 0;
        for (int64_t j = 0; j < hidden; ++j) {
          const double a = r(proj[i * hidden + j]) * r(lw.input_layernorm[j]);
          norm += a * a;
        }
        for (int64_t j = 0; j < hidden; ++j) {
          const double a = r(proj[i * hidden + j]) * r(lw.input_layernorm[j]);
          dot += a * (a / std::sqrt(norm) * std::sqrt(static_cast<double>(hidden)));
        }
        EXPECT_LE(std::fabs(dot + r(bias[i])), 448.0 * s);
      }
    }
  }
}

TEST(KvScalesTest, NonFiniteWeightsAreRefusedByName) {
  PresetOptions po;
  po.vocab_size = 64;
  const ModelConfig config = PresetConfig("llama-gqa", po).value();
  ModelWeights w = LoadDummyWeights(config, 1).value();
  w.layers[2].v_proj[5] = std::numeric_limits<float>::quiet_NaN();
  const auto scales = ComputeKvScales(config, w);
  ASSERT_FALSE(scales.ok());
  EXPECT_EQ(scales.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scales.status().message(), HasSubstr("model.layers.2.self_attn.v_proj"));
}

}  // namespace
}  // namespace tokenselect::engine
