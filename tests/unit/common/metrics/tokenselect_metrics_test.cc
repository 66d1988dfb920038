// The metric set: it registers under the naming rules, and docs/metrics.md describes exactly it
// (name, type, labels in order). A change on one side only fails here.
#include "common/metrics/tokenselect_metrics.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace tokenselect::common::metrics {
namespace {

struct DocRow {
  std::string type;
  std::vector<std::string> labels;
};

std::string SourceDir() {
  const char* dir = std::getenv("TS_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// Rows "| `name` | type | `a`, `b` | meaning |" of docs/metrics.md whose name starts with
// tokenselect_ ("-" means no labels).
std::map<std::string, DocRow> ReadDocTable(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::map<std::string, DocRow> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `tokenselect_", 0) != 0) continue;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    // cells: "", name, type, labels, meaning..., ""
    if (cells.size() < 5) {
      ADD_FAILURE() << "malformed row: " << line;
      continue;
    }
    auto clean = [](absl::string_view cell) {
      return std::string(
          absl::StripSuffix(absl::StripPrefix(absl::StripAsciiWhitespace(cell), "`"), "`"));
    };
    DocRow row;
    row.type = clean(cells[2]);
    const std::string labels = std::string(absl::StripAsciiWhitespace(cells[3]));
    if (labels != "-") {
      for (absl::string_view label : absl::StrSplit(labels, ','))
        row.labels.push_back(clean(label));
    }
    const std::string name = clean(cells[1]);
    EXPECT_TRUE(rows.emplace(name, row).second) << name << " is listed twice";
  }
  return rows;
}

TEST(TokenSelectMetricsTest, RegistersOncePerRegistry) {
  Registry registry;
  ASSERT_TRUE(TokenSelectMetrics::Register(&registry).ok());
  EXPECT_EQ(TokenSelectMetrics::Register(&registry).status().code(),
            absl::StatusCode::kAlreadyExists);
  const TokenSelectMetrics& a = TokenSelectMetrics::Default();
  const TokenSelectMetrics& b = TokenSelectMetrics::Default();
  EXPECT_EQ(&a, &b);
  EXPECT_NE(a.time_to_first_token_seconds, nullptr);
}

TEST(TokenSelectMetricsTest, HelpersRecordWhereTheDocSays) {
  Registry registry;
  auto m = TokenSelectMetrics::Register(&registry);
  ASSERT_TRUE(m.ok());
  m->RecordRequest(kOutcomeError, absl::StatusCode::kResourceExhausted);
  SelectionCacheCounters cache(*m, "token_select", 2);
  cache.Record(1, true);
  cache.Record(1, true);
  cache.Record(0, false);
  cache.Record(5, true);  // ignored
  const std::string text = registry.Render();
  EXPECT_NE(
      text.find("tokenselect_requests_total{outcome=\"error\",code=\"RESOURCE_EXHAUSTED\"} 1\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("tokenselect_selection_cache_lookups_total{result=\"hit\",layer=\"1\","
                      "policy=\"token_select\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("tokenselect_selection_cache_lookups_total{result=\"miss\",layer=\"0\","
                      "policy=\"token_select\"} 1\n"),
            std::string::npos);
}

TEST(TokenSelectMetricsTest, CacheCountersAddARequestsTotalsAtOnce) {
  Registry registry;
  auto m = TokenSelectMetrics::Register(&registry);
  ASSERT_TRUE(m.ok());
  SelectionCacheCounters cache(*m, "tokenselect", 3);
  cache.Add(2, 7, 3);
  cache.Add(2, 1, 0);
  cache.Add(9, 100, 100);  // outside the layers: ignored
  const std::string text = registry.Render();
  EXPECT_NE(text.find("tokenselect_selection_cache_lookups_total{result=\"hit\",layer=\"2\","
                      "policy=\"tokenselect\"} 8\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tokenselect_selection_cache_lookups_total{result=\"miss\",layer=\"2\","
                      "policy=\"tokenselect\"} 3\n"),
            std::string::npos);
  EXPECT_EQ(text.find("layer=\"9\""), std::string::npos);
}

TEST(TokenSelectMetricsTest, PhaseLoadGaugesSumEnginesAndWithdrawOnDestruction) {
  Registry registry;
  auto m = TokenSelectMetrics::Register(&registry);
  ASSERT_TRUE(m.ok());
  auto gauge = [&](GaugeFamily* family) { return (*family->Get({"decode"}))->Value(); };
  {
    PhaseLoadGauges a(*m, "decode");
    a.Set(/*running=*/2, /*waiting=*/1, /*used_pages=*/30, /*total_pages=*/100);
    {
      PhaseLoadGauges b(*m, "decode");
      b.Set(3, 0, 10, 100);
      EXPECT_EQ(gauge(m->running_requests), 5);
      EXPECT_EQ(gauge(m->waiting_requests), 1);
      EXPECT_DOUBLE_EQ(gauge(m->kv_cache_usage_ratio), 40.0 / 200.0);
      a.Set(1, 1, 50, 100);  // a change replaces a's share only
      EXPECT_EQ(gauge(m->running_requests), 4);
      EXPECT_DOUBLE_EQ(gauge(m->kv_cache_usage_ratio), 60.0 / 200.0);
    }
    EXPECT_EQ(gauge(m->running_requests), 1);  // b withdrew its share
    EXPECT_DOUBLE_EQ(gauge(m->kv_cache_usage_ratio), 50.0 / 100.0);
  }
  EXPECT_EQ(gauge(m->running_requests), 0);
  EXPECT_EQ(gauge(m->waiting_requests), 0);
}

TEST(TokenSelectMetricsTest, DocsListExactlyTheRegisteredSet) {
  Registry registry;
  ASSERT_TRUE(TokenSelectMetrics::Register(&registry).ok());
  const std::map<std::string, DocRow> doc = ReadDocTable(SourceDir() + "/docs/metrics.md");
  ASSERT_FALSE(doc.empty());
  std::map<std::string, bool> seen;
  for (const FamilyInfo& info : registry.Describe()) {
    auto it = doc.find(info.name);
    if (it == doc.end()) {
      ADD_FAILURE() << info.name << " is registered but missing from docs/metrics.md";
      continue;
    }
    seen[info.name] = true;
    EXPECT_EQ(it->second.type, MetricTypeName(info.type)) << info.name;
    EXPECT_EQ(absl::StrJoin(it->second.labels, ","), absl::StrJoin(info.label_names, ","))
        << info.name << ": labels differ";
  }
  for (const auto& [name, row] : doc) {
    EXPECT_TRUE(seen.count(name)) << name << " is in docs/metrics.md but not registered";
  }
}

}  // namespace
}  // namespace tokenselect::common::metrics
