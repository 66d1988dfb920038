// The scales of the FP8 KV cache (docs/fp8_kv.md): one power of two per (layer, KV head) for K
// and one for V, derived from the weights alone (no calibration data), so that every machine,
// tensor-parallel rank, prefill and decode worker gets the same numbers.
//
// For the key (value) projection's rows i of head h, with W_i the row of k_proj (v_proj), g the
// layer's input_layernorm weight and b_i the bias (0 without one), all rounded to bf16 as the
// GPU holds them:
//   B_i = sqrt(hidden_size) * || W_i (.) g ||_2 + |b_i|,  B_h = max_i B_i over the head's rows,
//   s_h = 2^ceil(log2(B_h / 448))                          (s_h = 1 when B_h = 0).
// RMSNorm's output r = g (.) x / rms(x) has || x / rms(x) ||_2 = sqrt(hidden), so by
// Cauchy-Schwarz |k_i| = |(W_i (.) g) . (x / rms(x)) + b_i| <= B_i: no input can produce a key
// beyond 448 s_h (keys are cached un-rotated; RoPE is applied at gather), nothing saturates.
// (The eps inside rms() only shrinks the norm; bf16 rounding of the normed activations and of
// k itself can move it by ~2^-8 relative, far inside the power-of-two's headroom except when B_h
// sits just under 448 s_h; then the one value saturates at 448 s_h, the nearest e4m3 value.)
// A power of two makes x / s and q * s exact, so dequantized values are exact in bf16/fp32.
//
// Scales are laid out [num_layers, 2, num_kv_heads]: per layer the K scales, then the V scales.
#ifndef TOKENSELECT_ENGINE_MODEL_KV_SCALES_H_
#define TOKENSELECT_ENGINE_MODEL_KV_SCALES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

// s = 2^ceil(log2(bound / 448)), exact (frexp, no log2 rounding); 1 for bound == 0. The
// exponent is clamped to [-116, 127] so that every dequantized value (>= 2^-9 s) is a normal
// float. bound must be finite and >= 0 (checked by the callers).
float KvScaleFromBound(double bound);

// B_i of one row in double: w_row [hidden], norm [hidden] and bias, each rounded to bf16 first.
double KvRowBound(const float* w_row, const float* norm, float bias, int64_t hidden);

// All scales of a model ([num_layers, 2, num_kv_heads], see above) from its weights (any
// precision: they are rounded to bf16 here). InvalidArgument naming the layer and tensor when a
// bound is not finite (NaN or inf weights), or for weights that do not match the config.
absl::StatusOr<std::vector<float>> ComputeKvScales(const ModelConfig& config,
                                                   const ModelWeights& weights);

// Index of a scale in the [num_layers, 2, num_kv_heads] layout (v: 0 for K, 1 for V).
inline int64_t KvScaleIndex(int64_t layer, int v, int64_t kv_head, int64_t num_kv_heads) {
  return (layer * 2 + v) * num_kv_heads + kv_head;
}

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_KV_SCALES_H_
