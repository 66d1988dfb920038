// The tokenselect metric set (DESIGN section 7), defined in one place: every family the router
// and the workers export, with its labels and buckets. docs/metrics.md lists the same set and
// tests/unit/common/metrics/metrics_doc_test.cc fails when the two disagree.
//
// A process registers the set once into the registry it serves:
//   const TokenSelectMetrics& m = TokenSelectMetrics::Default();   // Registry::Default()
//   Histogram& ttft = m.time_to_first_token_seconds->Labels({});   // cache the child
//   ttft.Observe(seconds);
// Label values are the constants below; families take them in the order of the comments.
#ifndef TOKENSELECT_COMMON_METRICS_TOKENSELECT_METRICS_H_
#define TOKENSELECT_COMMON_METRICS_TOKENSELECT_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"

namespace tokenselect::common::metrics {

// Label values.
inline constexpr absl::string_view kPhasePrefill = "prefill";  // label `phase`, `role`
inline constexpr absl::string_view kPhaseDecode = "decode";
inline constexpr absl::string_view kResultHit = "hit";  // label `result`
inline constexpr absl::string_view kResultMiss = "miss";
inline constexpr absl::string_view kTransportNccl = "nccl";  // label `transport`
inline constexpr absl::string_view kTransportHost = "host";
inline constexpr absl::string_view kTransferOk = "ok";  // label `outcome` of kv_transfers_total
inline constexpr absl::string_view kTransferError = "error";
// Label `outcome` of requests_total: how a request ended.
inline constexpr absl::string_view kOutcomeStop = "stop";            // stop string / EOS token
inline constexpr absl::string_view kOutcomeLength = "length";        // max_new_tokens reached
inline constexpr absl::string_view kOutcomeCancelled = "cancelled";  // client cancel/deadline
inline constexpr absl::string_view kOutcomeError = "error";          // any other failure

struct TokenSelectMetrics {
  // Requests, recorded by the router (end to end, as the client sees them).
  HistogramFamily* time_to_first_token_seconds = nullptr;  // {}
  HistogramFamily* inter_token_latency_seconds = nullptr;  // {}
  HistogramFamily* e2e_request_latency_seconds = nullptr;  // {}
  HistogramFamily* queue_time_seconds = nullptr;           // {phase}
  CounterFamily* prompt_tokens_total = nullptr;            // {}
  CounterFamily* generation_tokens_total = nullptr;        // {}
  CounterFamily* requests_total = nullptr;                 // {outcome, code}
  GaugeFamily* running_requests = nullptr;                 // {phase}
  GaugeFamily* waiting_requests = nullptr;                 // {phase}
  GaugeFamily* healthy_workers = nullptr;                  // {role}
  // KV cache and selection, recorded by the workers.
  GaugeFamily* kv_cache_usage_ratio = nullptr;             // {phase}
  CounterFamily* selection_cache_lookups_total = nullptr;  // {result, layer, policy}
  HistogramFamily* selection_seconds = nullptr;            // {phase, policy}
  HistogramFamily* prefill_chunk_seconds = nullptr;        // {}
  // KV transfer, recorded by the sender (prefill) and the receiver (decode).
  CounterFamily* kv_transfer_bytes_total = nullptr;  // {transport}
  HistogramFamily* kv_transfer_seconds = nullptr;    // {transport}
  CounterFamily* kv_transfers_total = nullptr;       // {transport, outcome}

  // Registers every family above into `registry`. AlreadyExists when one is registered there
  // already (register the set once per registry).
  static absl::StatusOr<TokenSelectMetrics> Register(Registry* registry);

  // The set registered into Registry::Default(), on first use (thread-safe).
  static const TokenSelectMetrics& Default();

  // Counts a finished request: `outcome` is one of kOutcome*, `code` its final status (the
  // label is the canonical code name, "OK", "RESOURCE_EXHAUSTED", ..., the same as gRPC's).
  void RecordRequest(absl::string_view outcome, absl::StatusCode code) const;
};

// Per-layer selection-cache counters of one policy, looked up once so that a decode step costs
// one atomic add per layer. Thread-safe (the counters are atomics).
class SelectionCacheCounters {
 public:
  SelectionCacheCounters(const TokenSelectMetrics& metrics, absl::string_view policy,
                         int num_layers);
  // Layers outside [0, num_layers) are ignored.
  void Record(int layer, bool hit) const;
  // Adds `hits` and `misses` lookups of `layer` at once (a request's totals when it ends).
  void Add(int layer, int64_t hits, int64_t misses) const;

 private:
  std::vector<Counter*> hits_;
  std::vector<Counter*> misses_;
};

// The load gauges of one engine of `phase`: tokenselect_running_requests,
// tokenselect_waiting_requests and tokenselect_kv_cache_usage_ratio. Several engines of one phase
// may share a registry (all-in-one, in-process tests): each adds only its changes, so the running
// and waiting gauges show the sum over them and the usage ratio sum(used) / sum(total) pages.
// Thread-safe.
class PhaseLoadGauges {
 public:
  PhaseLoadGauges(const TokenSelectMetrics& metrics, absl::string_view phase);
  ~PhaseLoadGauges();  // withdraws this engine's share
  PhaseLoadGauges(const PhaseLoadGauges&) = delete;
  PhaseLoadGauges& operator=(const PhaseLoadGauges&) = delete;

  // This engine's current load.
  void Set(int64_t running, int64_t waiting, int64_t used_pages, int64_t total_pages);

  struct PageTotals;  // tokenselect_metrics.cc: the pages of every engine on one ratio gauge

 private:
  Gauge* running_;
  Gauge* waiting_;
  Gauge* ratio_;
  PageTotals* totals_;
  absl::Mutex mu_;
  int64_t running_now_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_now_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t used_now_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_now_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokenselect::common::metrics

#endif  // TOKENSELECT_COMMON_METRICS_TOKENSELECT_METRICS_H_
