// Log-probabilities under the model's raw distribution: log_softmax(logits) before penalties,
// temperature and truncation. That is what vLLM returns by default ("raw logprobs") and what the
// OpenAI API documents; it measures the model, not the sampling settings, and a truncated token
// never gets -inf.
#ifndef TOKENSELECT_ENGINE_SAMPLING_LOGPROBS_H_
#define TOKENSELECT_ENGINE_SAMPLING_LOGPROBS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tokenselect::engine {

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
};

// log(sum_i exp(logits[i])), computed stably around the maximum, summed in double. -inf logits add
// nothing. `logits` must hold a finite value and no NaN or +inf.
double LogSumExp(absl::Span<const float> logits);

// The `n` tokens with the highest logits, most likely first, ties to the lower id, with logprob
// = logit - log_normalizer (pass LogSumExp(logits)). Tokens with a -inf logit are left out, so
// fewer than n come back when fewer are possible. One pass, O(vocab * n) worst case, O(vocab)
// typical, no allocation beyond the n results.
std::vector<TokenLogprob> TopLogprobs(absl::Span<const float> logits, int n, double log_normalizer);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_LOGPROBS_H_
