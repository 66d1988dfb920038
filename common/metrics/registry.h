// A metrics registry: counters, gauges and histograms grouped in families that share a name, a
// help text and label names; each combination of label values is a child. The registry renders
// itself in the Prometheus text exposition format 0.0.4 (docs/metrics.md, "Format").
//
// Hot path: look a child up once (Family::Labels / Family::Get takes the family's mutex) and keep
// the pointer; Counter::Increment, Gauge::Set and Histogram::Observe are lock-free atomics.
// Children live as long as the registry; pointers to them never move.
//
//   Registry registry;
//   ASSIGN_OR_RETURN(CounterFamily* lookups,
//                    registry.AddCounter("tokenselect_selection_cache_lookups_total",
//                                        "Selection-cache lookups.", {"result", "layer"}));
//   Counter& hits = lookups->Labels({"hit", "0"});  // cache this
//   hits.Increment();
//
// Naming rules, checked at registration (InvalidArgument otherwise; docs/metrics.md, "Naming"):
//   - names match tokenselect_[a-z0-9_]+ with no "__" and no trailing "_";
//   - counters end in "_total"; no other type contains "_total";
//   - histograms end in a base unit: _seconds, _bytes, _tokens or _ratio; names never use scaled
//     units (_ms, _milliseconds, _us, _kb, _mb, _percent, ...);
//   - no name ends in a suffix the format reserves (_bucket, _sum, _count, _created, _info);
//   - label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__", are not "le" or
//     "quantile", and are unique within the family.
#ifndef TOKENSELECT_COMMON_METRICS_REGISTRY_H_
#define TOKENSELECT_COMMON_METRICS_REGISTRY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tokenselect::common::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as the TYPE line writes it.
absl::string_view MetricTypeName(MetricType type);

// A monotonically increasing value.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `amount`; negative and NaN amounts are ignored (a counter never goes down).
  void Increment(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1.0);
  void Decrement(double amount = 1.0) { Increment(-amount); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets with fixed upper bounds (inclusive, as `le` says), plus an
// implicit +Inf bucket, their sum and their count.
class Histogram {
 public:
  // `upper_bounds`: strictly increasing and finite (the family checks this).
  explicit Histogram(std::shared_ptr<const std::vector<double>> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // NaN observations are ignored.
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;         // without +Inf
    std::vector<uint64_t> cumulative_counts;  // upper_bounds.size() + 1 entries, last is +Inf
    double sum = 0.0;
    uint64_t count = 0;  // == cumulative_counts.back()
  };
  // Counts are read one by one while others observe: the snapshot is consistent with itself
  // (count is the +Inf bucket) but may lag a concurrent observation's sum.
  Snapshot Read() const;

 private:
  std::shared_ptr<const std::vector<double>> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; +Inf last
  std::atomic<double> sum_{0.0};
};

// Exponential bucket bounds: start, start*factor, ... (count values). Empty when start <= 0,
// factor <= 1 or count <= 0.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// What a family is: enough to compare the registry with docs/metrics.md.
struct FamilyInfo {
  std::string name;
  MetricType type = MetricType::kCounter;
  std::string help;
  std::vector<std::string> label_names;
};

// Metrics of one name with one child per combination of label values.
template <typename T>
class Family {
 public:
  // Returns the child for `label_values` (one per label name, in order), creating it on first
  // use. InvalidArgument when the number of values differs from the number of label names;
  // ResourceExhausted when the family already holds max_children() children.
  absl::StatusOr<T*> Get(absl::Span<const std::string> label_values);

  // Get() for call sites whose labels are fixed by the code: a wrong arity is a programming
  // error (TS_CHECK); past max_children() every new combination shares one overflow child
  // whose label values are all "overflow".
  T& Labels(std::initializer_list<absl::string_view> label_values);

  const FamilyInfo& info() const { return info_; }
  static constexpr size_t max_children() { return 10000; }

  // Calls `fn(label_values, child)` for each child in label-value order, under the lock.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [values, child] : children_) fn(values, *child);
  }

 private:
  friend class Registry;
  Family(FamilyInfo info, std::shared_ptr<const std::vector<double>> upper_bounds);
  std::unique_ptr<T> MakeChild() const;

  const FamilyInfo info_;
  const std::shared_ptr<const std::vector<double>> upper_bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns families; thread-safe. Families without labels get their single child at registration,
// so they are exposed (as 0) before the first update.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process-wide registry that binaries serve at /metrics. Never destroyed.
  static Registry& Default();

  // Registers a family. InvalidArgument when the name, a label name or the buckets break the
  // rules above or `help` is empty; AlreadyExists when the name is taken.
  absl::StatusOr<CounterFamily*> AddCounter(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names = {});
  // `upper_bounds`: non-empty, finite, strictly increasing; a trailing +Inf is dropped (it is
  // always implied).
  absl::StatusOr<HistogramFamily*> AddHistogram(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> upper_bounds);

  // Every family, sorted by name.
  std::vector<FamilyInfo> Describe() const;

  // The text exposition format 0.0.4: families sorted by name, each with HELP and TYPE lines,
  // children in label-value order. Content type: kExpositionContentType.
  std::string Render() const;

 private:
  absl::Status CheckNew(absl::string_view name, MetricType type,
                        const std::vector<std::string>& label_names) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<CounterFamily>, std::less<>> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<GaugeFamily>, std::less<>> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<HistogramFamily>, std::less<>> histograms_
      ABSL_GUARDED_BY(mu_);
};

inline constexpr absl::string_view kExpositionContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Checks a metric name / label name against the rules above (InvalidArgument with the reason).
absl::Status ValidateMetricName(absl::string_view name, MetricType type);
absl::Status ValidateLabelNames(const std::vector<std::string>& label_names);

}  // namespace tokenselect::common::metrics

#endif  // TOKENSELECT_COMMON_METRICS_REGISTRY_H_
