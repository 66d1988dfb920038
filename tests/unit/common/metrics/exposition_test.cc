#include "common/metrics/exposition.h"

#include <cmath>
#include <string>

#include "common/metrics/registry.h"
#include "gtest/gtest.h"

namespace tokenselect::common::metrics {
namespace {

TEST(FormatTest, Values) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-42), "-42");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(NAN), "NaN");
  EXPECT_EQ(FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatValue(-INFINITY), "-Inf");
}

TEST(FormatTest, Escaping) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");  // quotes stay in HELP
  EXPECT_EQ(FormatLabels({}, {}), "");
  EXPECT_EQ(FormatLabels({}, {}, "le", "+Inf"), "{le=\"+Inf\"}");
  EXPECT_EQ(FormatLabels({"a", "b"}, {"1", "x\"y"}, "le", "0.5"),
            "{a=\"1\",b=\"x\\\"y\",le=\"0.5\"}");
}

// The exact text of a small registry: ordering, HELP/TYPE, escaping, histogram series.
TEST(RenderTest, ExactTextOfSmallRegistry) {
  Registry registry;
  auto requests = registry.AddCounter("tokenselect_requests_total",
                                      "Finished requests.\nBy \"code\" \\ outcome.", {"code"});
  auto usage = registry.AddGauge("tokenselect_kv_cache_usage_ratio", "KV usage.");
  auto latency =
      registry.AddHistogram("tokenselect_e2e_seconds", "Latency.", {"phase"}, {0.25, 1, 2.5});
  auto unused = registry.AddCounter("tokenselect_unused_total", "Never used.", {"x"});
  ASSERT_TRUE(requests.ok() && usage.ok() && latency.ok() && unused.ok());

  (*requests)->Labels({"UNAVAILABLE"}).Increment();
  (*requests)->Labels({"OK"}).Increment(41);
  (*requests)->Labels({"we\"ird\\\n"}).Increment();
  (*usage)->Labels({}).Set(0.75);
  Histogram& decode = (*latency)->Labels({"decode"});
  for (double v : {0.1, 0.25, 0.3, 7.0}) decode.Observe(v);

  const std::string expected =
      "# HELP tokenselect_e2e_seconds Latency.\n"
      "# TYPE tokenselect_e2e_seconds histogram\n"
      "tokenselect_e2e_seconds_bucket{phase=\"decode\",le=\"0.25\"} 2\n"
      "tokenselect_e2e_seconds_bucket{phase=\"decode\",le=\"1\"} 3\n"
      "tokenselect_e2e_seconds_bucket{phase=\"decode\",le=\"2.5\"} 3\n"
      "tokenselect_e2e_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 4\n"
      "tokenselect_e2e_seconds_sum{phase=\"decode\"} 7.65\n"
      "tokenselect_e2e_seconds_count{phase=\"decode\"} 4\n"
      "# HELP tokenselect_kv_cache_usage_ratio KV usage.\n"
      "# TYPE tokenselect_kv_cache_usage_ratio gauge\n"
      "tokenselect_kv_cache_usage_ratio 0.75\n"
      "# HELP tokenselect_requests_total Finished requests.\\nBy \"code\" \\\\ outcome.\n"
      "# TYPE tokenselect_requests_total counter\n"
      "tokenselect_requests_total{code=\"OK\"} 41\n"
      "tokenselect_requests_total{code=\"UNAVAILABLE\"} 1\n"
      "tokenselect_requests_total{code=\"we\\\"ird\\\\\\n\"} 1\n"
      "# HELP tokenselect_unused_total Never used.\n"
      "# TYPE tokenselect_unused_total counter\n";
  EXPECT_EQ(registry.Render(), expected);
}

TEST(RenderTest, UnlabelledFamiliesShowZeroFromTheStart) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("tokenselect_a_total", "A.").ok());
  ASSERT_TRUE(registry.AddHistogram("tokenselect_b_bytes", "B.", {}, {1024}).ok());
  EXPECT_EQ(registry.Render(),
            "# HELP tokenselect_a_total A.\n"
            "# TYPE tokenselect_a_total counter\n"
            "tokenselect_a_total 0\n"
            "# HELP tokenselect_b_bytes B.\n"
            "# TYPE tokenselect_b_bytes histogram\n"
            "tokenselect_b_bytes_bucket{le=\"1024\"} 0\n"
            "tokenselect_b_bytes_bucket{le=\"+Inf\"} 0\n"
            "tokenselect_b_bytes_sum 0\n"
            "tokenselect_b_bytes_count 0\n");
}

}  // namespace
}  // namespace tokenselect::common::metrics
