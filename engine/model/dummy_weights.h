// Random weights of any shape (`--load-format dummy`): benchmarks need no download and tests
// get small deterministic models.
//
// Values come from a self-contained counter-based generator: element i of tensor `name` is a
// function of (seed, name, i) alone, computed with integer hashing and exactly rounded fp64
// arithmetic (no std:: distributions, no libm transcendentals), so the weights are bit-identical
// on every platform and compiler, and any slice of any tensor can be generated on its own, in
// any order, on any number of threads. That makes generation streaming-friendly: a GPU loader
// or a checkpoint writer can fill one chunk at a time (FillDummyTensor) without holding the
// model in host memory.
//
// Size: the CPU backend is meant for small models. An 8B-parameter config is 32 GB in fp32,
// more than a 24 GB machine holds: LoadDummyWeights refuses configs over max_bytes with
// ResourceExhausted; such models are for the CUDA backend (bf16), filled chunk by chunk.
#ifndef TOKENSELECT_ENGINE_MODEL_DUMMY_WEIGHTS_H_
#define TOKENSELECT_ENGINE_MODEL_DUMMY_WEIGHTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

enum class DummyInit {
  // Like transformers' _init_weights: embeddings and linear weights N(0, 0.02), biases
  // N(0, 0.02) (small rather than zero, so that they matter), norms exactly 1.
  kHuggingFace,
  // "Trained-looking" scales for test models whose greedy output should not be degenerate
  // (standard deviations): linear weights 1/sqrt(fan_in), so activations stay O(1) through every
  // layer; q_proj and k_proj 2/sqrt(fan_in), so attention logits are O(4) and heads pick out
  // tokens (the next token depends on the context, not only on the last token); embeddings
  // 1/sqrt(hidden), small against the layers' contributions to the residual stream, so that tied
  // embeddings do not favour repeating the last token; lm_head 3/sqrt(hidden) (logits of O(3));
  // biases 0.1; norms 1 + 0.1 noise (so that a test notices a norm weight that is not applied).
  kScaled,
};

struct DummyWeightOptions {
  uint64_t seed = 0;
  DummyInit init = DummyInit::kHuggingFace;
  // Refuse configs whose fp32 weights exceed this (ResourceExhausted). 0: no limit.
  int64_t max_bytes = int64_t{16} << 30;
};

// Deterministic random weights for `config` (validated first: InvalidArgument as
// ValidateModelConfig). Multi-threaded with OpenMP; the result does not depend on the thread
// count.
absl::StatusOr<ModelWeights> LoadDummyWeights(const ModelConfig& config,
                                              const DummyWeightOptions& options);
absl::StatusOr<ModelWeights> LoadDummyWeights(const ModelConfig& config, uint64_t seed);

// Elements [begin, begin + count) of the tensor `name` (kind and fan_in as ListWeights gives
// them) exactly as LoadDummyWeights produces them.
void FillDummyTensor(const std::string& name, WeightKind kind, int64_t fan_in,
                     const DummyWeightOptions& options, int64_t begin, int64_t count, float* out);

// A standard-normal-like value (mean 0, variance 1; the scaled sum of four uniforms, bounded by
// +-2 sqrt 3) for counter `index` of stream `key`. Exposed for tests.
double DummyNormal(uint64_t key, uint64_t index);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_DUMMY_WEIGHTS_H_
