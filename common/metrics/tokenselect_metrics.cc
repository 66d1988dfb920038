#include "common/metrics/tokenselect_metrics.h"

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace tokenselect::common::metrics {

absl::StatusOr<TokenSelectMetrics> TokenSelectMetrics::Register(Registry* registry) {
  TokenSelectMetrics m;
  Registry& r = *registry;
  // Latencies span loopback tests (ms) to 1M-token prefills (minutes): doubling buckets.
  ASSIGN_OR_RETURN(m.time_to_first_token_seconds,
                   r.AddHistogram("tokenselect_time_to_first_token_seconds",
                                  "Time from request arrival at the router to the first token "
                                  "sent to the client.",
                                  {}, ExponentialBuckets(0.01, 2, 17)));
  ASSIGN_OR_RETURN(m.inter_token_latency_seconds,
                   r.AddHistogram("tokenselect_inter_token_latency_seconds",
                                  "Time between consecutive tokens of one request.", {},
                                  ExponentialBuckets(0.001, 2, 14)));
  ASSIGN_OR_RETURN(m.e2e_request_latency_seconds,
                   r.AddHistogram("tokenselect_e2e_request_latency_seconds",
                                  "Time from request arrival at the router to its last token.", {},
                                  ExponentialBuckets(0.1, 2, 15)));
  ASSIGN_OR_RETURN(m.queue_time_seconds,
                   r.AddHistogram("tokenselect_queue_time_seconds",
                                  "Time a request waits before its phase starts running it.",
                                  {"phase"}, ExponentialBuckets(0.001, 2, 20)));
  ASSIGN_OR_RETURN(m.prompt_tokens_total, r.AddCounter("tokenselect_prompt_tokens_total",
                                                       "Prompt tokens of admitted requests."));
  ASSIGN_OR_RETURN(
      m.generation_tokens_total,
      r.AddCounter("tokenselect_generation_tokens_total", "Tokens generated and sent to clients."));
  ASSIGN_OR_RETURN(
      m.requests_total,
      r.AddCounter("tokenselect_requests_total",
                   "Finished requests by outcome and final status code.", {"outcome", "code"}));
  ASSIGN_OR_RETURN(m.running_requests,
                   r.AddGauge("tokenselect_running_requests",
                              "Requests a phase is running now (prefilling or in the decode "
                              "batch).",
                              {"phase"}));
  ASSIGN_OR_RETURN(m.waiting_requests,
                   r.AddGauge("tokenselect_waiting_requests",
                              "Requests queued for a phase and not running yet.", {"phase"}));
  ASSIGN_OR_RETURN(m.healthy_workers,
                   r.AddGauge("tokenselect_healthy_workers",
                              "Workers the router considers healthy, by role.", {"role"}));
  ASSIGN_OR_RETURN(
      m.kv_cache_usage_ratio,
      r.AddGauge("tokenselect_kv_cache_usage_ratio",
                 "Fraction of KV-cache pages in use or reserved (0 to 1).", {"phase"}));
  ASSIGN_OR_RETURN(m.selection_cache_lookups_total,
                   r.AddCounter("tokenselect_selection_cache_lookups_total",
                                "Selection-cache lookups in decode by result, layer and policy.",
                                {"result", "layer", "policy"}));
  ASSIGN_OR_RETURN(m.selection_seconds,
                   r.AddHistogram("tokenselect_selection_seconds",
                                  "Time to select the attended tokens of one layer for one "
                                  "step (decode) or chunk (prefill).",
                                  {"phase", "policy"}, ExponentialBuckets(1e-5, 2, 16)));
  ASSIGN_OR_RETURN(m.prefill_chunk_seconds,
                   r.AddHistogram("tokenselect_prefill_chunk_seconds",
                                  "Time to prefill one chunk through all layers.", {},
                                  ExponentialBuckets(0.001, 2, 14)));
  ASSIGN_OR_RETURN(
      m.kv_transfer_bytes_total,
      r.AddCounter("tokenselect_kv_transfer_bytes_total",
                   "KV-cache and span-index bytes moved from prefill to decode.", {"transport"}));
  ASSIGN_OR_RETURN(m.kv_transfer_seconds,
                   r.AddHistogram("tokenselect_kv_transfer_seconds",
                                  "Time to move one chunk's KV from prefill to decode.",
                                  {"transport"}, ExponentialBuckets(1e-4, 2, 18)));
  ASSIGN_OR_RETURN(m.kv_transfers_total,
                   r.AddCounter("tokenselect_kv_transfers_total",
                                "KV chunk transfers by transport and outcome (ok, error).",
                                {"transport", "outcome"}));
  return m;
}

const TokenSelectMetrics& TokenSelectMetrics::Default() {
  static const TokenSelectMetrics* metrics = [] {
    absl::StatusOr<TokenSelectMetrics> registered = Register(&Registry::Default());
    TS_CHECK(registered.ok(), "registering the tokenselect metrics: {}",
             registered.status().ToString());
    return new TokenSelectMetrics(*registered);
  }();
  return *metrics;
}

void TokenSelectMetrics::RecordRequest(absl::string_view outcome, absl::StatusCode code) const {
  requests_total->Labels({outcome, absl::StatusCodeToString(code)}).Increment();
}

SelectionCacheCounters::SelectionCacheCounters(const TokenSelectMetrics& metrics,
                                               absl::string_view policy, int num_layers) {
  for (int layer = 0; layer < num_layers; ++layer) {
    const std::string name = absl::StrCat(layer);
    hits_.push_back(&metrics.selection_cache_lookups_total->Labels({kResultHit, name, policy}));
    misses_.push_back(&metrics.selection_cache_lookups_total->Labels({kResultMiss, name, policy}));
  }
}

void SelectionCacheCounters::Record(int layer, bool hit) const {
  if (layer < 0 || layer >= static_cast<int>(hits_.size())) return;
  (hit ? hits_ : misses_)[layer]->Increment();
}

void SelectionCacheCounters::Add(int layer, int64_t hits, int64_t misses) const {
  if (layer < 0 || layer >= static_cast<int>(hits_.size())) return;
  if (hits > 0) hits_[layer]->Increment(static_cast<double>(hits));
  if (misses > 0) misses_[layer]->Increment(static_cast<double>(misses));
}

struct PhaseLoadGauges::PageTotals {
  absl::Mutex mu;
  int64_t used ABSL_GUARDED_BY(mu) = 0;
  int64_t total ABSL_GUARDED_BY(mu) = 0;

  // Adds one engine's change and sets `ratio` to the new used / total.
  void Add(Gauge* ratio, int64_t used_delta, int64_t total_delta) {
    absl::MutexLock lock(&mu);
    used += used_delta;
    total += total_delta;
    ratio->Set(total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0);
  }
};

namespace {

// One PageTotals per ratio gauge child, for the life of the process (children live as long).
PhaseLoadGauges::PageTotals* TotalsFor(const Gauge* ratio) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* totals =
      new absl::flat_hash_map<const Gauge*, std::unique_ptr<PhaseLoadGauges::PageTotals>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<PhaseLoadGauges::PageTotals>& slot = (*totals)[ratio];
  if (slot == nullptr) slot = std::make_unique<PhaseLoadGauges::PageTotals>();
  return slot.get();
}

}  // namespace

PhaseLoadGauges::PhaseLoadGauges(const TokenSelectMetrics& metrics, absl::string_view phase)
    : running_(&metrics.running_requests->Labels({phase})),
      waiting_(&metrics.waiting_requests->Labels({phase})),
      ratio_(&metrics.kv_cache_usage_ratio->Labels({phase})),
      totals_(TotalsFor(ratio_)) {}

PhaseLoadGauges::~PhaseLoadGauges() { Set(0, 0, 0, 0); }

void PhaseLoadGauges::Set(int64_t running, int64_t waiting, int64_t used_pages,
                          int64_t total_pages) {
  absl::MutexLock lock(&mu_);
  if (running != running_now_) running_->Increment(static_cast<double>(running - running_now_));
  if (waiting != waiting_now_) waiting_->Increment(static_cast<double>(waiting - waiting_now_));
  if (used_pages != used_now_ || total_pages != total_now_) {
    totals_->Add(ratio_, used_pages - used_now_, total_pages - total_now_);
  }
  running_now_ = running;
  waiting_now_ = waiting;
  used_now_ = used_pages;
  total_now_ = total_pages;
}

}  // namespace tokenselect::common::metrics
