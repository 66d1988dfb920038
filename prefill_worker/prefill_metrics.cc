#include "prefill_worker/prefill_metrics.h"

namespace tokenselect::prefill_worker {

namespace m = common::metrics;

PrefillMetrics::PrefillMetrics(const m::TokenSelectMetrics& metrics)
    : metrics_(metrics),
      queue_time_(&metrics.queue_time_seconds->Labels({m::kPhasePrefill})),
      chunk_seconds_(&metrics.prefill_chunk_seconds->Labels({})),
      load_(metrics, m::kPhasePrefill) {}

m::Histogram& PrefillMetrics::SelectionSeconds(engine::SelectionPolicyKind policy) {
  const int index = static_cast<int>(policy);
  // Out-of-range kinds cannot pass ValidateSelectionOptions; fold them into the last slot.
  const int slot = index >= 0 && index < kMaxPolicies ? index : kMaxPolicies - 1;
  absl::MutexLock lock(&mu_);
  if (selection_[slot] == nullptr) {
    selection_[slot] =
        &metrics_.selection_seconds->Labels({m::kPhasePrefill, engine::PolicyName(policy)});
  }
  return *selection_[slot];
}

}  // namespace tokenselect::prefill_worker
