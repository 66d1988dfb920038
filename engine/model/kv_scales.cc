#include "engine/model/kv_scales.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/dtype.h"
#include "engine/model/fp8.h"

namespace tokenselect::engine {
namespace {

double RoundBf16(float x) { return static_cast<double>(Bf16ToFloat(FloatToBf16(x))); }

}  // namespace

float KvScaleFromBound(double bound) {
  if (!(bound > 0.0)) return 1.0f;
  int e = 0;
  const double m = std::frexp(bound / static_cast<double>(kE4m3Max), &e);  // m in [0.5, 1)
  if (m == 0.5) --e;  // an exact power of two is its own ceiling
  e = std::clamp(e, -116, 127);
  return std::ldexp(1.0f, e);
}

double KvRowBound(const float* w_row, const float* norm, float bias, int64_t hidden) {
  double sum = 0.0;
  for (int64_t j = 0; j < hidden; ++j) {
    const double p = RoundBf16(w_row[j]) * RoundBf16(norm[j]);  // exact in double
    sum += p * p;
  }
  return std::sqrt(static_cast<double>(hidden)) * std::sqrt(sum) + std::fabs(RoundBf16(bias));
}

absl::StatusOr<std::vector<float>> ComputeKvScales(const ModelConfig& config,
                                                   const ModelWeights& weights) {
  RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  const int64_t hidden = config.hidden_size, d = config.head_dim, hkv = config.num_kv_heads;
  std::vector<float> scales(static_cast<size_t>(config.num_layers * 2 * hkv));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerWeights& w = weights.layers[static_cast<size_t>(l)];
    for (int v = 0; v < 2; ++v) {
      const std::vector<float>& proj = v == 0 ? w.k_proj : w.v_proj;
      const std::vector<float>& bias = v == 0 ? w.k_bias : w.v_bias;
      for (int64_t h = 0; h < hkv; ++h) {
        double bound = 0.0;
        bool finite = true;
        for (int64_t i = h * d; i < (h + 1) * d; ++i) {
          const float b = bias.empty() ? 0.0f : bias[static_cast<size_t>(i)];
          const double row =
              KvRowBound(proj.data() + i * hidden, w.input_layernorm.data(), b, hidden);
          finite = finite && std::isfinite(row);
          bound = std::max(bound, row);
        }
        if (!finite) {
          return absl::InvalidArgumentError(absl::StrCat(
              "FP8 KV scales: model.layers.", l, ".self_attn.", v == 0 ? "k" : "v",
              "_proj (or its bias, or input_layernorm) of KV head ", h,
              " has non-finite values"));
        }
        scales[static_cast<size_t>(KvScaleIndex(l, v, h, hkv))] = KvScaleFromBound(bound);
      }
    }
  }
  return scales;
}

}  // namespace tokenselect::engine
