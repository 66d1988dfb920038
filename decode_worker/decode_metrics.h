// The decode worker's share of the tokenselect metric set (docs/metrics.md), with every child
// looked up once: running / waiting requests and KV usage (phase "decode"), queue time (from the
// KV being complete to joining the running batch), selection time per layer and decode step, the
// selection-cache lookups by result, layer and policy, and optionally the inter-token latency as
// the worker sees it (off in all-in-one, where the router records it on the same registry).
//
// Selection-cache lookups are recorded when a request leaves the running batch (finished,
// cancelled or failed), from its SelectionAttention's per-layer counters: one atomic add per layer
// and result per request instead of one per layer and step.
#ifndef TOKENSELECT_DECODE_WORKER_DECODE_METRICS_H_
#define TOKENSELECT_DECODE_WORKER_DECODE_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tokenselect_metrics.h"
#include "absl/types/span.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::decode_worker {

class DecodeMetrics {
 public:
  // The children of one selection policy.
  struct Policy {
    common::metrics::Histogram* selection_seconds;  // {decode, policy}
    common::metrics::SelectionCacheCounters cache;  // {result, layer, policy}
  };

  // `metrics` must outlive this object.
  DecodeMetrics(const common::metrics::TokenSelectMetrics& metrics, int64_t num_layers,
                bool record_inter_token);

  // The children of `policy`, created on first use. Thread-safe.
  const Policy& ForPolicy(engine::SelectionPolicyKind policy);

  common::metrics::Histogram& queue_time() const { return *queue_time_; }
  // Null when the worker does not record inter-token latency.
  common::metrics::Histogram* inter_token() const { return inter_token_; }
  common::metrics::PhaseLoadGauges& load() { return load_; }

  // Adds a finished request's per-layer selection-cache counters.
  static void RecordCache(const Policy& policy,
                          absl::Span<const engine::SelectionCacheCounters> layers);

 private:
  static constexpr int kMaxPolicies = 16;

  const common::metrics::TokenSelectMetrics& metrics_;
  const int64_t num_layers_;
  common::metrics::Histogram* queue_time_;
  common::metrics::Histogram* inter_token_;
  common::metrics::PhaseLoadGauges load_;
  absl::Mutex mu_;
  std::array<std::unique_ptr<Policy>, kMaxPolicies> policies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokenselect::decode_worker

#endif  // TOKENSELECT_DECODE_WORKER_DECODE_METRICS_H_
