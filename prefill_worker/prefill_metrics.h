// The prefill worker's share of the tokenselect metric set (docs/metrics.md), with every child
// looked up once: running / waiting requests and KV usage (phase "prefill"), queue time (from
// Submit to a worker thread taking the job), the time of each chunk through all layers, and the
// selection time per layer of each chunk (the chunk's mean over its layers, one observation per
// chunk). The KV transfer metrics are recorded by MeteredKvTransport (metered_kv_transport.h).
#ifndef TOKENSELECT_PREFILL_WORKER_PREFILL_METRICS_H_
#define TOKENSELECT_PREFILL_WORKER_PREFILL_METRICS_H_

#include <array>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/tokenselect_metrics.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::prefill_worker {

class PrefillMetrics {
 public:
  // `metrics` must outlive this object.
  explicit PrefillMetrics(const common::metrics::TokenSelectMetrics& metrics);

  common::metrics::Histogram& queue_time() const { return *queue_time_; }
  common::metrics::Histogram& chunk_seconds() const { return *chunk_seconds_; }
  common::metrics::PhaseLoadGauges& load() { return load_; }
  // tokenselect_selection_seconds{phase="prefill", policy}, created on first use. Thread-safe.
  common::metrics::Histogram& SelectionSeconds(engine::SelectionPolicyKind policy);

 private:
  static constexpr int kMaxPolicies = 16;

  const common::metrics::TokenSelectMetrics& metrics_;
  common::metrics::Histogram* queue_time_;
  common::metrics::Histogram* chunk_seconds_;
  common::metrics::PhaseLoadGauges load_;
  absl::Mutex mu_;
  std::array<common::metrics::Histogram*, kMaxPolicies> selection_ ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_PREFILL_METRICS_H_
