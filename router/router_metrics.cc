#include "router/router_metrics.h"

namespace tokenselect::router {

namespace m = common::metrics;

RouterMetrics::RouterMetrics(const m::TokenSelectMetrics& metrics)
    : metrics_(metrics),
      ttft_(&metrics.time_to_first_token_seconds->Labels({})),
      inter_token_(&metrics.inter_token_latency_seconds->Labels({})),
      e2e_(&metrics.e2e_request_latency_seconds->Labels({})),
      prompt_tokens_(&metrics.prompt_tokens_total->Labels({})),
      generation_tokens_(&metrics.generation_tokens_total->Labels({})),
      ok_stop_(&metrics.requests_total->Labels({m::kOutcomeStop, "OK"})),
      ok_length_(&metrics.requests_total->Labels({m::kOutcomeLength, "OK"})),
      healthy_prefill_(&metrics.healthy_workers->Labels({m::kPhasePrefill})),
      healthy_decode_(&metrics.healthy_workers->Labels({m::kPhaseDecode})) {}

void RouterMetrics::RecordRequest(const absl::Status& status, FinishReasonCode finish) const {
  if (status.ok()) {
    (finish == FinishReasonCode::kLength ? ok_length_ : ok_stop_)->Increment();
    return;
  }
  const absl::StatusCode code = status.code();
  const bool cancelled =
      code == absl::StatusCode::kCancelled || code == absl::StatusCode::kDeadlineExceeded;
  // Errors are rare: the family lookup (one lock) is fine here.
  metrics_.RecordRequest(cancelled ? m::kOutcomeCancelled : m::kOutcomeError, code);
}

void RouterMetrics::SetHealthyWorkers(int64_t prefill, int64_t decode) const {
  healthy_prefill_->Set(static_cast<double>(prefill));
  healthy_decode_->Set(static_cast<double>(decode));
}

}  // namespace tokenselect::router
