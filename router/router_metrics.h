// The router's share of the tokenselect metric set (docs/metrics.md): request latencies as the
// client sees them (TTFT, inter-token, end to end), prompt and generated tokens, finished requests
// by outcome and code, and the healthy workers by role. The children are looked up once here;
// recording is a few atomic operations per token message.
#ifndef TOKENSELECT_ROUTER_ROUTER_METRICS_H_
#define TOKENSELECT_ROUTER_ROUTER_METRICS_H_

#include "absl/status/status.h"
#include "common/metrics/tokenselect_metrics.h"
#include "router/request_spec.h"

namespace tokenselect::router {

class RouterMetrics {
 public:
  // `metrics` (e.g. TokenSelectMetrics::Default()) must outlive this object.
  explicit RouterMetrics(const common::metrics::TokenSelectMetrics& metrics);

  common::metrics::Histogram& ttft() const { return *ttft_; }
  common::metrics::Histogram& inter_token() const { return *inter_token_; }
  common::metrics::Histogram& e2e() const { return *e2e_; }
  common::metrics::Counter& prompt_tokens() const { return *prompt_tokens_; }
  common::metrics::Counter& generation_tokens() const { return *generation_tokens_; }

  // Counts a finished request: outcome "stop" / "length" for OK (by `finish`), "cancelled" for
  // CANCELLED and DEADLINE_EXCEEDED, "error" otherwise; the code label is the status code name.
  void RecordRequest(const absl::Status& status, FinishReasonCode finish) const;

  // The number of healthy workers of each role.
  void SetHealthyWorkers(int64_t prefill, int64_t decode) const;

 private:
  const common::metrics::TokenSelectMetrics& metrics_;
  common::metrics::Histogram* ttft_;
  common::metrics::Histogram* inter_token_;
  common::metrics::Histogram* e2e_;
  common::metrics::Counter* prompt_tokens_;
  common::metrics::Counter* generation_tokens_;
  common::metrics::Counter* ok_stop_;
  common::metrics::Counter* ok_length_;
  common::metrics::Gauge* healthy_prefill_;
  common::metrics::Gauge* healthy_decode_;
};

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_ROUTER_METRICS_H_
