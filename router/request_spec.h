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
#include "params/sampling_params.h"
#include "params/selection_options.h"

namespace tokenselect::router {

// What a request asks of selection. Only the fields the client set are forwarded: each worker
// fills the others from its own defaults (its --selection_* flags, wire/selection_flags.h), so
// unlike sampling, which has fixed defaults (params::SamplingParams{}), presence matters here.
struct SelectionSpec {
  std::optional<params::SelectionPolicyKind> policy;
  std::optional<int64_t> k, n_init, n_local, chunk_size;
  std::optional<double> theta;
};

struct RequestSpec {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  // Every field is set; the ones the client left unset hold the workers' defaults.
  params::SamplingParams sampling;
  SelectionSpec selection;
  bool skip_special_tokens = true;
  bool continuous_usage = false;
};

// OK, or InvalidArgument naming the field ("selection.k must be >= 0, got -3"): the fields the
// client set must pass params::ValidateSelectionOptions. Unset budget terms count as 0 there, so
// the bound on n_init + k + n_local is checked as far as the set fields alone decide it (the
// worker checks the full sum with its defaults).
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
