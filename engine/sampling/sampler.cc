#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/sampling/logit_scan.h"
#include "engine/sampling/prng.h"
#include "engine/sampling/token_distribution.h"

namespace tokenselect::engine {
namespace {

// The largest logit. InvalidArgument on NaN or +inf, or when every logit is -inf.
absl::StatusOr<float> MaxLogit(absl::Span<const float> logits) {
  const LogitScan scan = ScanLogits(logits);
  if (scan.has_nan_or_pos_inf) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!(logits[i] < std::numeric_limits<float>::infinity())) {
        return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is ", logits[i]));
      }
    }
  }
  if (scan.max == -std::numeric_limits<float>::infinity()) {
    return absl::InvalidArgumentError("every logit is -inf");
  }
  return scan.max;
}

// Greedy: the first (lowest) id holding the maximum.
int32_t ArgMax(absl::Span<const float> logits, float max) {
  const auto it = std::find(logits.begin(), logits.end(), max);
  return static_cast<int32_t>(it - logits.begin());
}

// Per-step buffers, shared by the samplers a thread runs.
struct Scratch {
  std::vector<float> penalized;  // [vocab_size]
  TokenDistribution distribution;
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int vocab_size, uint64_t seed)
    : params_(params), vocab_size_(vocab_size), seed_(seed), penalties_(params, vocab_size) {}

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params, int vocab_size) {
  RETURN_IF_ERROR(Validate(params, vocab_size));
  const uint64_t seed = params.seed.has_value() ? *params.seed : RandomSeed();
  return Sampler(params, vocab_size, seed);
}

absl::StatusOr<SampleResult> Sampler::Sample(absl::Span<const float> logits,
                                             absl::Span<const int32_t> prompt_ids,
                                             absl::Span<const int32_t> generated_ids) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits hold ", logits.size(), " values, the vocab has ", vocab_size_));
  }
  ASSIGN_OR_RETURN(float max_logit, MaxLogit(logits));

  Scratch& scratch = ThreadScratch();
  absl::Span<const float> processed = logits;
  if (penalties_.active()) {
    RETURN_IF_ERROR(penalties_.Sync(prompt_ids, generated_ids));
    scratch.penalized.assign(logits.begin(), logits.end());
    penalties_.Apply(absl::MakeSpan(scratch.penalized));
    processed = scratch.penalized;
  }

  SampleResult result;
  if (params_.temperature == 0.0f) {
    result.token_id =
        ArgMax(processed, penalties_.active() ? ScanLogits(processed).max : max_logit);
  } else {
    RETURN_IF_ERROR(scratch.distribution.Build(processed, params_));
    Prng prng = Prng::ForStep(seed_, generated_ids.size());
    result.token_id = scratch.distribution.Pick(prng.NextDouble());
  }

  if (params_.logprobs) {
    const double log_normalizer = LogSumExp(logits);
    result.logprob = static_cast<float>(logits[result.token_id] - log_normalizer);
    result.top_logprobs = TopLogprobs(logits, params_.top_logprobs, log_normalizer);
  }
  return result;
}

}  // namespace tokenselect::engine
