// Per-request sampling and stopping options, and their validation. The fields and their meaning
// follow the OpenAI / vLLM request parameters of the same names; Validate() states every bound.
// Plain data and validation, below the engine, so that the router validates requests with the
// same rules as the workers without linking engine/ (docs/architecture.md);
// engine/sampling/sampling_params.h forwards these names into tokenselect::engine.
#ifndef TOKENSELECT_PARAMS_SAMPLING_PARAMS_H_
#define TOKENSELECT_PARAMS_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tokenselect::params {

// Bounds Validate() enforces.
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 1024;  // also bounds the text a stream holds back
inline constexpr int kMaxTopLogprobs = 20;        // OpenAI's limit
inline constexpr float kMaxAbsPenalty = 2.0f;     // frequency / presence penalties, OpenAI's limit

struct SamplingParams {
  // Logits are divided by `temperature` before truncation and sampling. 0 means greedy: the
  // token with the highest (penalised) logit, ties going to the lowest id; top_k, top_p, min_p
  // and seed are then irrelevant, since truncation always keeps the argmax.
  float temperature = 1.0f;
  // Keep only the k most likely tokens. 0 or -1 disables it; k >= vocab size keeps every token.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability mass is >= top_p. 1 disables.
  float top_p = 1.0f;
  // Keep tokens whose probability is >= min_p times that of the most likely token. 0 disables.
  float min_p = 0.0f;

  // Hugging Face semantics: for every id in the prompt or the generated ids, a positive logit is
  // divided by the penalty and a negative one multiplied by it. 1 disables; > 1 discourages.
  float repetition_penalty = 1.0f;
  // OpenAI / vLLM semantics over generated ids only: logit -= frequency_penalty * count(id)
  //                                                    + presence_penalty * (count(id) > 0).
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;

  // Seed for random sampling. With a seed, the same seed, prompt and logits give the same tokens
  // on any machine; without one the sampler draws a seed from std::random_device.
  std::optional<uint64_t> seed;

  // Generation stops after this many new tokens (finish reason "length"). vLLM's default.
  int32_t max_new_tokens = 16;
  // Ids that end generation (finish reason "stop"); their text is not emitted unless
  // include_stop_str_in_output. They apply even with ignore_eos.
  std::vector<int32_t> stop_token_ids;
  // Keep generating past the model's end-of-sequence ids (the model's, not stop_token_ids).
  bool ignore_eos = false;
  // Generation stops when the output text contains one of these (finish reason "stop"); the
  // output is cut before the match, or after it when include_stop_str_in_output.
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;

  // Return the log-probability of each chosen token (under the model's raw distribution, see
  // SampleResult in engine/sampling/sampler.h), and the `top_logprobs` most likely alternatives
  // (requires logprobs).
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// True when any of the three penalties changes logits.
bool HasPenalties(const SamplingParams& params);

// Returns OK, or InvalidArgument naming the first bad field and its value, e.g.
// "sampling.top_p must be in (0, 1], got 1.5". Checks: temperature finite and >= 0; top_p in
// (0, 1]; min_p in [0, 1]; top_k >= -1; repetition_penalty finite and > 0; frequency and
// presence penalties in [-2, 2]; max_new_tokens >= 1; stop_token_ids in [0, vocab_size); at most
// kMaxStopStrings stop strings, each non-empty, valid UTF-8 and at most kMaxStopStringBytes long;
// top_logprobs in [0, kMaxTopLogprobs] and 0 unless logprobs. vocab_size must be positive.
absl::Status Validate(const SamplingParams& params, int vocab_size);

}  // namespace tokenselect::params

#endif  // TOKENSELECT_PARAMS_SAMPLING_PARAMS_H_
