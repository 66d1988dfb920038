// Picks the next token of one request from the model's logits.
//
//   ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(params, vocab_size));
//   ASSIGN_OR_RETURN(SampleResult r, sampler.Sample(logits, prompt_ids, generated_ids));
//
// Processing order (vLLM's): penalties (repetition, then frequency and presence), temperature,
// min_p, top_k, top_p, then one draw. Greedy (temperature 0) takes the argmax of the penalised
// logits; ties go to the lowest id, so greedy decoding is deterministic whatever the logits.
//
// Random draws come from Prng::ForStep(seed, generated_ids.size()): step t's draw depends only on
// the seed and t, so the same seed, prompt and logits give the same tokens on any machine and
// across a hand-over between processes (see prng.h). Bit-exact agreement also assumes the same
// float exp() results, which libms give to within an ulp; only a draw that falls within ~1e-7
// (relative) of a cumulative boundary could go the other way.
//
// Logprobs are those of the model's raw distribution (see logprobs.h), not of the distribution
// that was sampled. Not thread-safe: one Sampler per request. The O(vocab) per-step buffers are
// per thread, not per request, so a live Sampler costs only its penalty state.
#ifndef TOKENSELECT_ENGINE_SAMPLING_SAMPLER_H_
#define TOKENSELECT_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/sampling/logprobs.h"
#include "engine/sampling/penalties.h"
#include "engine/sampling/sampling_params.h"

namespace tokenselect::engine {

struct SampleResult {
  int32_t token_id = -1;
  // log_softmax(raw logits)[token_id]; set when params.logprobs.
  std::optional<float> logprob;
  // The params.top_logprobs most likely tokens under the raw distribution, most likely first,
  // ties to the lower id (may include token_id; fewer when fewer tokens have finite logits).
  std::vector<TokenLogprob> top_logprobs;
};

class Sampler {
 public:
  // Returns InvalidArgument if Validate(params, vocab_size) fails. Without params.seed, draws a
  // seed from std::random_device.
  static absl::StatusOr<Sampler> Create(const SamplingParams& params, int vocab_size);

  // Samples the token that follows `prompt_ids` + `generated_ids`.
  //   logits: [vocab_size], the model's raw output for the last position; -inf masks a token.
  //   prompt_ids, generated_ids: the request's ids so far. Read only for penalties (append-only
  //     across calls, see penalties.h); generated_ids.size() is the step number that keys the
  //     random draw.
  // Returns InvalidArgument if logits.size() != vocab_size, a logit is NaN or +inf, every logit
  // is -inf, or (with penalties) an id is outside the vocab.
  absl::StatusOr<SampleResult> Sample(absl::Span<const float> logits,
                                      absl::Span<const int32_t> prompt_ids,
                                      absl::Span<const int32_t> generated_ids);

  // Whether Sample's pick is the plain argmax of the raw logits (temperature 0, no penalties,
  // no logprobs): then a backend may pick on its own (SequenceRunner::ForwardGreedy) and Sample
  // need not see the logits.
  bool PicksArgmaxOfRawLogits() const {
    return params_.temperature == 0.0f && !penalties_.active() && !params_.logprobs;
  }

  // The seed in use (params.seed or the drawn one); hand it on with the request so another
  // process continues the same random stream.
  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return params_; }

 private:
  Sampler(const SamplingParams& params, int vocab_size, uint64_t seed);

  SamplingParams params_;
  int vocab_size_;
  uint64_t seed_;
  PenaltyState penalties_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_SAMPLER_H_
