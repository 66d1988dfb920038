#include "common/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tokenselect::common::metrics {
namespace {

// std::atomic<double>::fetch_add is C++20; a compare-exchange loop does the same.
void AtomicAdd(std::atomic<double>& target, double amount) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

bool IsLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return IsLower(c) || (c >= 'A' && c <= 'Z'); }

constexpr absl::string_view kPrefix = "tokenselect_";
constexpr absl::string_view kHistogramUnits[] = {"_seconds", "_bytes", "_tokens", "_ratio"};
constexpr absl::string_view kReservedSuffixes[] = {"_bucket", "_sum", "_count", "_created",
                                                   "_info"};
// Scaled or non-base units: Prometheus wants seconds, bytes and ratios (0..1).
constexpr absl::string_view kScaledUnits[] = {
    "_ms",           "_msec",      "_millis",      "_milliseconds", "_us",    "_usec",
    "_microseconds", "_ns",        "_nanoseconds", "_minutes",      "_hours", "_kb",
    "_mb",           "_gb",        "_kib",         "_mib",          "_gib",   "_kilobytes",
    "_megabytes",    "_gigabytes", "_percent",     "_pct"};

// True when `name` has `word` as a whole "_"-separated component ("_ms" in "x_ms_total").
bool HasComponent(absl::string_view name, absl::string_view word) {
  const std::string padded = absl::StrCat(name, "_");
  return absl::StrContains(padded, absl::StrCat(word, "_"));
}

}  // namespace

absl::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void Counter::Increment(double amount) {
  if (!(amount >= 0.0)) return;  // negative or NaN
  AtomicAdd(value_, amount);
}

void Gauge::Increment(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(std::shared_ptr<const std::vector<double>> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_->size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_->size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: `le` buckets are inclusive.
  const auto it = std::lower_bound(upper_bounds_->begin(), upper_bounds_->end(), value);
  counts_[it - upper_bounds_->begin()].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.upper_bounds = *upper_bounds_;
  snapshot.cumulative_counts.resize(upper_bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_->size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = running;
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  if (!(start > 0.0) || !(factor > 1.0) || count <= 0) return bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

absl::Status ValidateMetricName(absl::string_view name, MetricType type) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\": ", why));
  };
  if (!absl::StartsWith(name, kPrefix) || name.size() == kPrefix.size()) {
    return bad(absl::StrCat("must start with \"", kPrefix, "\" and go on"));
  }
  for (char c : name) {
    if (!IsLower(c) && !IsDigit(c) && c != '_') return bad("only [a-z0-9_] are allowed");
  }
  if (absl::StrContains(name, "__") || absl::EndsWith(name, "_")) {
    return bad("no \"__\" and no trailing \"_\"");
  }
  const bool has_total = HasComponent(name, "_total");
  if (type == MetricType::kCounter && !absl::EndsWith(name, "_total")) {
    return bad("counter names end in \"_total\"");
  }
  if (type != MetricType::kCounter && has_total) {
    return bad("only counters may use \"_total\"");
  }
  for (absl::string_view suffix : kReservedSuffixes) {
    if (absl::EndsWith(name, suffix)) return bad(absl::StrCat("\"", suffix, "\" is reserved"));
  }
  for (absl::string_view unit : kScaledUnits) {
    if (HasComponent(name, unit)) {
      return bad(absl::StrCat("\"", unit, "\" is not a base unit (use _seconds, _bytes, _ratio)"));
    }
  }
  if (type == MetricType::kHistogram &&
      std::none_of(std::begin(kHistogramUnits), std::end(kHistogramUnits),
                   [&](absl::string_view unit) { return absl::EndsWith(name, unit); })) {
    return bad("histogram names end in their unit: _seconds, _bytes, _tokens or _ratio");
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelNames(const std::vector<std::string>& label_names) {
  std::set<absl::string_view> seen;
  for (const std::string& label : label_names) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("label name \"", label, "\": ", why));
    };
    if (label.empty() || IsDigit(label[0])) return bad("must start with [a-zA-Z_]");
    for (char c : label) {
      if (!IsAlpha(c) && !IsDigit(c) && c != '_') return bad("only [a-zA-Z0-9_] are allowed");
    }
    if (absl::StartsWith(label, "__")) return bad("\"__\" prefixes are reserved");
    if (label == "le" || label == "quantile") return bad("reserved by the format");
    if (!seen.insert(label).second) return bad("appears twice");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Family

template <typename T>
Family<T>::Family(FamilyInfo info, std::shared_ptr<const std::vector<double>> upper_bounds)
    : info_(std::move(info)), upper_bounds_(std::move(upper_bounds)) {}

template <typename T>
std::unique_ptr<T> Family<T>::MakeChild() const {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(upper_bounds_);
  } else {
    return std::make_unique<T>();
  }
}

template <typename T>
absl::StatusOr<T*> Family<T>::Get(absl::Span<const std::string> label_values) {
  if (label_values.size() != info_.label_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(info_.name, ": got ", label_values.size(),
                                                   " label values for ", info_.label_names.size(),
                                                   " label names"));
  }
  std::vector<std::string> key(label_values.begin(), label_values.end());
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = children_.find(key);
    if (it != children_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  auto it = children_.find(key);
  if (it != children_.end()) return it->second.get();
  if (children_.size() >= max_children()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(info_.name, ": more than ", max_children(), " label combinations"));
  }
  T* child = children_.emplace(std::move(key), MakeChild()).first->second.get();
  return child;
}

template <typename T>
T& Family<T>::Labels(std::initializer_list<absl::string_view> label_values) {
  TS_CHECK(label_values.size() == info_.label_names.size(), "{}: {} label values for {} names",
           info_.name, label_values.size(), info_.label_names.size());
  std::vector<std::string> key(label_values.begin(), label_values.end());
  absl::StatusOr<T*> child = Get(key);
  if (child.ok()) return **child;
  // Too many combinations: share one overflow child rather than fail on the hot path.
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& overflow =
      children_[std::vector<std::string>(info_.label_names.size(), "overflow")];
  if (overflow == nullptr) overflow = MakeChild();
  return *overflow;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------------------------
// Registry

Registry& Registry::Default() {
  static Registry* registry = new Registry();
  return *registry;
}

absl::Status Registry::CheckNew(absl::string_view name, MetricType type,
                                const std::vector<std::string>& label_names) const {
  if (counters_.count(name) || gauges_.count(name) || histograms_.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("metric \"", name, "\" is already registered"));
  }
  if (absl::Status s = ValidateMetricName(name, type); !s.ok()) return s;
  return ValidateLabelNames(label_names);
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(absl::string_view name, absl::string_view help,
                                                    std::vector<std::string> label_names) {
  if (help.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty help"));
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kCounter, label_names); !s.ok()) return s;
  FamilyInfo info{std::string(name), MetricType::kCounter, std::string(help),
                  std::move(label_names)};
  auto family = std::unique_ptr<CounterFamily>(new CounterFamily(std::move(info), nullptr));
  if (family->info().label_names.empty()) (void)family->Get({});
  return counters_.emplace(std::string(name), std::move(family)).first->second.get();
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names) {
  if (help.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty help"));
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kGauge, label_names); !s.ok()) return s;
  FamilyInfo info{std::string(name), MetricType::kGauge, std::string(help), std::move(label_names)};
  auto family = std::unique_ptr<GaugeFamily>(new GaugeFamily(std::move(info), nullptr));
  if (family->info().label_names.empty()) (void)family->Get({});
  return gauges_.emplace(std::string(name), std::move(family)).first->second.get();
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(absl::string_view name,
                                                        absl::string_view help,
                                                        std::vector<std::string> label_names,
                                                        std::vector<double> upper_bounds) {
  if (help.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty help"));
  if (!upper_bounds.empty() && std::isinf(upper_bounds.back()) && upper_bounds.back() > 0) {
    upper_bounds.pop_back();
  }
  if (upper_bounds.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a histogram needs bucket bounds"));
  }
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i]) || (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1]))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": bucket bounds must be finite and strictly increasing"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kHistogram, label_names); !s.ok()) return s;
  FamilyInfo info{std::string(name), MetricType::kHistogram, std::string(help),
                  std::move(label_names)};
  auto bounds = std::make_shared<const std::vector<double>>(std::move(upper_bounds));
  auto family = std::unique_ptr<HistogramFamily>(new HistogramFamily(std::move(info), bounds));
  if (family->info().label_names.empty()) (void)family->Get({});
  return histograms_.emplace(std::string(name), std::move(family)).first->second.get();
}

std::vector<FamilyInfo> Registry::Describe() const {
  std::vector<FamilyInfo> infos;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, family] : counters_) infos.push_back(family->info());
  for (const auto& [name, family] : gauges_) infos.push_back(family->info());
  for (const auto& [name, family] : histograms_) infos.push_back(family->info());
  std::sort(infos.begin(), infos.end(),
            [](const FamilyInfo& a, const FamilyInfo& b) { return a.name < b.name; });
  return infos;
}

}  // namespace tokenselect::common::metrics
