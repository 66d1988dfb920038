// The router's view of a generation request after validation and tokenization, free of
// generated proto types: generation_service.cc translates the public GenerateRequest into a
// RequestSpec, dispatch_service.cc translates it into the workers' WorkerRequest, and streamed
// output comes back as StreamEvents.
#ifndef TOKENSELECT_ROUTER_REQUEST_SPEC_H_
#define TOKENSELECT_ROUTER_REQUEST_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tokenselect::router {

// Mirrors tokenselect.v1.SamplingParams (unset optionals take the workers' defaults).
struct SamplingSpec {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, frequency_penalty,
      presence_penalty;
  std::optional<int32_t> top_k, max_new_tokens;
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// Mirrors tokenselect.v1.SelectionParams; `policy` is the raw enum number (0 = server default).
struct SelectionSpec {
  int policy = 0;
  std::optional<int64_t> k, n_init, n_local, chunk_size;
  std::optional<double> theta;
};

// The number of values of tokenselect.v1.SelectionPolicy (UNSPECIFIED .. CASCADE).
inline constexpr int kNumSelectionPolicies = 10;
// Bounds shared with engine/sampling/sampling_params.h (the router cannot link the engine).
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 1024;
inline constexpr int kMaxTopLogprobs = 20;
// The workers' default when the client sets no max_new_tokens (engine::SamplingParams).
inline constexpr int32_t kDefaultMaxNewTokens = 16;

struct RequestSpec {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  SamplingSpec sampling;
  SelectionSpec selection;
  bool skip_special_tokens = true;
  bool continuous_usage = false;
};

// OK, or InvalidArgument naming the field ("sampling.top_p must be in (0, 1], got 1.5"), with the
// engine's ranges: temperature finite >= 0; top_p in (0, 1]; min_p in [0, 1]; top_k >= -1;
// repetition_penalty finite > 0; frequency/presence penalties in [-2, 2]; max_new_tokens >= 1;
// stop_token_ids in [0, vocab_size); at most 16 non-empty stop strings of <= 1024 bytes;
// top_logprobs in [0, 20] and 0 unless logprobs.
absl::Status ValidateSampling(const SamplingSpec& sampling, int64_t vocab_size);

// OK, or InvalidArgument naming the field: policy a known enum value; k, n_init, n_local >= 0;
// theta finite >= -1; chunk_size >= 1.
absl::Status ValidateSelection(const SelectionSpec& selection);

// OK, or InvalidArgument: "input" when the prompt is empty, "prompt" when it is longer than
// `max_prompt_tokens` or holds an id outside [0, vocab_size).
absl::Status ValidatePrompt(const std::vector<int32_t>& prompt_ids, int64_t max_prompt_tokens,
                            int64_t vocab_size);

// Why generation ended (tokenselect.v1.FinishReason numbers).
enum class FinishReasonCode { kUnspecified = 0, kStop = 1, kStopString = 2, kLength = 3 };

struct TokenLogprobSpec {
  int32_t token_id = 0;
  float logprob = 0;
};
struct LogprobSpec {
  TokenLogprobSpec chosen;
  std::vector<TokenLogprobSpec> top;
};

struct UsageSpec {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct TimingsSpec {
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
  double prefill_seconds = 0;
};

// One piece of output, in order; the last one has `final` set.
struct StreamEvent {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<LogprobSpec> logprobs;
  bool final = false;
  FinishReasonCode finish_reason = FinishReasonCode::kUnspecified;
  UsageSpec usage;  // running on every event, final on the last
  TimingsSpec timings;
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
};

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_REQUEST_SPEC_H_
