#include "decode_worker/decode_metrics.h"

namespace tokenselect::decode_worker {

namespace m = common::metrics;

DecodeMetrics::DecodeMetrics(const m::TokenSelectMetrics& metrics, int64_t num_layers,
                             bool record_inter_token)
    : metrics_(metrics),
      num_layers_(num_layers),
      queue_time_(&metrics.queue_time_seconds->Labels({m::kPhaseDecode})),
      inter_token_(record_inter_token ? &metrics.inter_token_latency_seconds->Labels({}) : nullptr),
      load_(metrics, m::kPhaseDecode) {}

const DecodeMetrics::Policy& DecodeMetrics::ForPolicy(engine::SelectionPolicyKind policy) {
  const int index = static_cast<int>(policy);
  // Out-of-range kinds cannot pass ValidateSelectionOptions; fold them into the last slot.
  const int slot = index >= 0 && index < kMaxPolicies ? index : kMaxPolicies - 1;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Policy>& p = policies_[slot];
  if (p == nullptr) {
    const absl::string_view name = engine::PolicyName(policy);
    p = std::make_unique<Policy>(
        Policy{&metrics_.selection_seconds->Labels({m::kPhaseDecode, name}),
               m::SelectionCacheCounters(metrics_, name, static_cast<int>(num_layers_))});
  }
  return *p;
}

void DecodeMetrics::RecordCache(const Policy& policy,
                                absl::Span<const engine::SelectionCacheCounters> layers) {
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    policy.cache.Add(static_cast<int>(layer), layers[layer].hits, layers[layer].misses);
  }
}

}  // namespace tokenselect::decode_worker
