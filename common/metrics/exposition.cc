// Registry::Render() and the spelling rules of the text format 0.0.4.
#include "common/metrics/exposition.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/metrics/registry.h"

namespace tokenselect::common::metrics {

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) <= 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buffer[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values, absl::string_view extra_name,
                         absl::string_view extra_value) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ",";
    absl::StrAppend(&out, extra_name, "=\"", EscapeLabelValue(extra_value), "\"");
  }
  out += "}";
  return out;
}

namespace {

void AppendHeader(const FamilyInfo& info, std::string* out) {
  absl::StrAppend(out, "# HELP ", info.name, " ", EscapeHelp(info.help), "\n", "# TYPE ", info.name,
                  " ", MetricTypeName(info.type), "\n");
}

template <typename T>
void AppendScalar(const Family<T>& family, std::string* out) {
  const FamilyInfo& info = family.info();
  AppendHeader(info, out);
  family.ForEach([&](const std::vector<std::string>& values, const T& child) {
    absl::StrAppend(out, info.name, FormatLabels(info.label_names, values), " ",
                    FormatValue(child.Value()), "\n");
  });
}

void AppendHistogram(const HistogramFamily& family, std::string* out) {
  const FamilyInfo& info = family.info();
  AppendHeader(info, out);
  family.ForEach([&](const std::vector<std::string>& values, const Histogram& child) {
    const Histogram::Snapshot snapshot = child.Read();
    for (size_t i = 0; i < snapshot.cumulative_counts.size(); ++i) {
      const std::string le = i < snapshot.upper_bounds.size()
                                 ? FormatValue(snapshot.upper_bounds[i])
                                 : std::string("+Inf");
      absl::StrAppend(out, info.name, "_bucket", FormatLabels(info.label_names, values, "le", le),
                      " ", snapshot.cumulative_counts[i], "\n");
    }
    const std::string labels = FormatLabels(info.label_names, values);
    absl::StrAppend(out, info.name, "_sum", labels, " ", FormatValue(snapshot.sum), "\n");
    absl::StrAppend(out, info.name, "_count", labels, " ", snapshot.count, "\n");
  });
}

}  // namespace

std::string Registry::Render() const {
  // Collect the families under the registry lock, then render them in name order; each family
  // takes its own lock while its children are read.
  struct Entry {
    const std::string* name;
    const CounterFamily* counter = nullptr;
    const GaugeFamily* gauge = nullptr;
    const HistogramFamily* histogram = nullptr;
  };
  std::vector<Entry> entries;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, f] : counters_) entries.push_back({&name, f.get(), nullptr, nullptr});
    for (const auto& [name, f] : gauges_) entries.push_back({&name, nullptr, f.get(), nullptr});
    for (const auto& [name, f] : histograms_) {
      entries.push_back({&name, nullptr, nullptr, f.get()});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return *a.name < *b.name; });
  std::string out;
  for (const Entry& entry : entries) {
    if (entry.counter != nullptr) AppendScalar(*entry.counter, &out);
    if (entry.gauge != nullptr) AppendScalar(*entry.gauge, &out);
    if (entry.histogram != nullptr) AppendHistogram(*entry.histogram, &out);
  }
  return out;
}

}  // namespace tokenselect::common::metrics
