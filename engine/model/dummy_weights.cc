#include "engine/model/dummy_weights.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace tokenselect::engine {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// SplitMix64's output function: a bijective 64-bit mixer.
uint64_t Mix(uint64_t z) {
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The stream key of one tensor: FNV-1a of its name, mixed with the seed.
uint64_t StreamKey(uint64_t seed, const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return Mix(hash ^ Mix(seed));
}

// Mean and standard deviation of each tensor.
void Moments(const std::string& name, WeightKind kind, int64_t fan_in, DummyInit init, double* mean,
             double* stddev) {
  *mean = 0.0;
  if (init == DummyInit::kHuggingFace) {
    *stddev = kind == WeightKind::kNorm ? 0.0 : 0.02;
    if (kind == WeightKind::kNorm) *mean = 1.0;
    return;
  }
  const double inv_sqrt_fan_in = 1.0 / std::sqrt(static_cast<double>(fan_in));
  switch (kind) {
    case WeightKind::kEmbedding:
      *stddev = inv_sqrt_fan_in;
      return;
    case WeightKind::kLinear:
      if (name == "lm_head.weight") {
        *stddev = 3.0 * inv_sqrt_fan_in;
      } else if (absl::EndsWith(name, "q_proj.weight") || absl::EndsWith(name, "k_proj.weight")) {
        *stddev = 2.0 * inv_sqrt_fan_in;  // attention logits of O(4): heads pick tokens
      } else {
        *stddev = inv_sqrt_fan_in;
      }
      return;
    case WeightKind::kBias:
      *stddev = 0.1;
      return;
    case WeightKind::kNorm:
      *mean = 1.0;
      *stddev = 0.1;
      return;
  }
}

}  // namespace

double DummyNormal(uint64_t key, uint64_t index) {
  const uint64_t h = Mix(key + index * kGolden);
  // Four 16-bit uniforms u = (h_k + 0.5) / 2^16; their sum has mean 2 and variance 1/3. Every
  // step but the last multiplication is exact in fp64.
  const uint64_t sum = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
  constexpr double kSqrt3 = 1.7320508075688772;
  return (static_cast<double>(sum + 2) * (1.0 / 65536.0) - 2.0) * kSqrt3;
}

void FillDummyTensor(const std::string& name, WeightKind kind, int64_t fan_in,
                     const DummyWeightOptions& options, int64_t begin, int64_t count, float* out) {
  double mean = 0.0, stddev = 0.0;
  Moments(name, kind, fan_in, options.init, &mean, &stddev);
  const uint64_t key = StreamKey(options.seed, name);
  if (stddev == 0.0) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(mean);
    return;
  }
  // std::fma rounds once on every platform, whether or not the compiler contracts a * b + c.
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) {
    const double z = DummyNormal(key, static_cast<uint64_t>(begin + i));
    out[i] = static_cast<float>(mean == 0.0 ? z * stddev : std::fma(z, stddev, mean));
  }
}

absl::StatusOr<ModelWeights> LoadDummyWeights(const ModelConfig& config,
                                              const DummyWeightOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  const int64_t bytes = NumParameters(config) * static_cast<int64_t>(sizeof(float));
  if (options.max_bytes > 0 && bytes > options.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dummy weights: %d parameters need %.1f GiB in fp32, over the limit of %.1f GiB; the "
        "CPU backend is meant for small models (fill large ones chunk by chunk with "
        "FillDummyTensor)",
        NumParameters(config), bytes / double(1 << 30), options.max_bytes / double(1 << 30)));
  }
  ModelWeights weights;
  for (const WeightEntry& entry : ListWeights(config, &weights)) {
    entry.data->resize(entry.num_elements());
    FillDummyTensor(entry.name, entry.kind, entry.fan_in, options, 0, entry.num_elements(),
                    entry.data->data());
  }
  return weights;
}

absl::StatusOr<ModelWeights> LoadDummyWeights(const ModelConfig& config, uint64_t seed) {
  DummyWeightOptions options;
  options.seed = seed;
  return LoadDummyWeights(config, options);
}

}  // namespace tokenselect::engine
