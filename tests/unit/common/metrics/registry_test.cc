#include "common/metrics/registry.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tokenselect::common::metrics {
namespace {

using ::absl::StatusCode;

TEST(NamingTest, AcceptsWellFormedNames) {
  EXPECT_TRUE(ValidateMetricName("tokenselect_requests_total", MetricType::kCounter).ok());
  EXPECT_TRUE(ValidateMetricName("tokenselect_kv_cache_usage_ratio", MetricType::kGauge).ok());
  EXPECT_TRUE(ValidateMetricName("tokenselect_queue_time_seconds", MetricType::kHistogram).ok());
  EXPECT_TRUE(ValidateMetricName("tokenselect_prompt_tokens", MetricType::kHistogram).ok());
}

TEST(NamingTest, RefusesBadNames) {
  struct Case {
    const char* name;
    MetricType type;
  };
  const Case cases[] = {
      {"requests_total", MetricType::kCounter},                 // no prefix
      {"tokenselect_", MetricType::kGauge},                     // prefix only
      {"tokenselect_Requests_total", MetricType::kCounter},     // upper case
      {"tokenselect_a__b", MetricType::kGauge},                 // double underscore
      {"tokenselect_requests", MetricType::kCounter},           // counter without _total
      {"tokenselect_requests_total", MetricType::kGauge},       // _total on a gauge
      {"tokenselect_x_total_seconds", MetricType::kHistogram},  // _total inside
      {"tokenselect_latency", MetricType::kHistogram},          // histogram without unit
      {"tokenselect_latency_ms", MetricType::kHistogram},       // scaled unit
      {"tokenselect_size_mib", MetricType::kGauge},             // scaled unit
      {"tokenselect_usage_percent", MetricType::kGauge},        // not a ratio
      {"tokenselect_x_bucket", MetricType::kGauge},             // reserved suffix
      {"tokenselect_x_count", MetricType::kGauge},              // reserved suffix
      {"tokenselect_x-y", MetricType::kGauge},                  // bad character
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ValidateMetricName(c.name, c.type).code(), StatusCode::kInvalidArgument) << c.name;
  }
}

TEST(NamingTest, LabelNames) {
  EXPECT_TRUE(ValidateLabelNames({"phase", "layer", "_x", "Policy2"}).ok());
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {""}, {"1a"}, {"a-b"}, {"__name"}, {"le"}, {"quantile"}, {"a", "a"}}) {
    EXPECT_EQ(ValidateLabelNames(bad).code(), StatusCode::kInvalidArgument) << bad[0];
  }
}

TEST(RegistryTest, RegistrationErrors) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("tokenselect_a_total", "A.").ok());
  EXPECT_EQ(registry.AddCounter("tokenselect_a_total", "A.").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("tokenselect_a_total", "A.").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("tokenselect_b", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("tokenselect_b", "B.", {"le"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("tokenselect_c_seconds", "C.", {}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("tokenselect_c_seconds", "C.", {}, {1, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("tokenselect_c_seconds", "C.", {}, {2, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddHistogram("tokenselect_c_seconds", "C.", {}, {1, 2, INFINITY}).ok());
  ASSERT_EQ(registry.Describe().size(), 2u);
  EXPECT_EQ(registry.Describe()[1].name, "tokenselect_c_seconds");
}

TEST(FamilyTest, ChildrenAreStableAndArityIsChecked) {
  Registry registry;
  auto family = registry.AddCounter("tokenselect_x_total", "X.", {"a", "b"});
  ASSERT_TRUE(family.ok());
  auto first = (*family)->Get({"1", "2"});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(&(*family)->Labels({"1", "2"}), *first);
  EXPECT_NE(&(*family)->Labels({"1", "3"}), *first);
  EXPECT_EQ((*family)->Get({"1"}).status().code(), StatusCode::kInvalidArgument);
}

TEST(FamilyTest, TooManyChildrenFoldIntoOverflow) {
  Registry registry;
  auto family = registry.AddGauge("tokenselect_y", "Y.", {"id"});
  ASSERT_TRUE(family.ok());
  for (size_t i = 0; i < GaugeFamily::max_children(); ++i) {
    ASSERT_TRUE((*family)->Get({absl::StrCat(i)}).ok());
  }
  EXPECT_EQ((*family)->Get({"new"}).status().code(), StatusCode::kResourceExhausted);
  Gauge& overflow = (*family)->Labels({"new"});
  EXPECT_EQ(&overflow, &(*family)->Labels({"another"}));
  EXPECT_EQ(*(*family)->Get({"overflow"}), &overflow);
}

TEST(ValuesTest, CounterGaugeHistogram) {
  Counter counter;
  counter.Increment();
  counter.Increment(2.5);
  counter.Increment(-1);   // ignored
  counter.Increment(NAN);  // ignored
  EXPECT_DOUBLE_EQ(counter.Value(), 3.5);

  Gauge gauge;
  gauge.Set(4);
  gauge.Decrement(1.5);
  gauge.Increment();
  EXPECT_DOUBLE_EQ(gauge.Value(), 3.5);

  Histogram histogram(std::make_shared<const std::vector<double>>(std::vector<double>{1, 2}));
  for (double v : {0.5, 1.0, 1.5, 3.0}) histogram.Observe(v);
  histogram.Observe(NAN);  // ignored
  const Histogram::Snapshot s = histogram.Read();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 3, 4}));  // le is inclusive
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.sum, 6.0);
}

TEST(ValuesTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.5, 2, 4), (std::vector<double>{0.5, 1, 2, 4}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
}

// Many threads update shared and per-thread children while another renders: totals are exact
// and rendering never blocks updates for long (run under TSan to check the locking).
TEST(ConcurrencyTest, ParallelUpdatesAreCountedExactly) {
  Registry registry;
  auto counters = registry.AddCounter("tokenselect_c_total", "C.", {"thread"});
  auto shared = registry.AddCounter("tokenselect_shared_total", "S.");
  auto gauge = registry.AddGauge("tokenselect_g", "G.");
  auto histogram = registry.AddHistogram("tokenselect_h_seconds", "H.", {"thread"}, {0.5, 1.5});
  ASSERT_TRUE(counters.ok() && shared.ok() && gauge.ok() && histogram.ok());
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  std::atomic<bool> done{false};
  std::thread renderer([&] {
    while (!done.load()) (void)registry.Render();
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string id = absl::StrCat(t % 4);  // two threads per child
      for (int i = 0; i < kIterations; ++i) {
        (*counters)->Labels({id}).Increment();
        (*shared)->Labels({}).Increment(0.5);
        (*gauge)->Labels({}).Increment();
        (*gauge)->Labels({}).Decrement();
        (*histogram)->Labels({id}).Observe(i % 2);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  renderer.join();
  for (int id = 0; id < 4; ++id) {
    EXPECT_EQ((*counters)->Labels({absl::StrCat(id)}).Value(), 2.0 * kIterations);
    const Histogram::Snapshot s = (*histogram)->Labels({absl::StrCat(id)}).Read();
    EXPECT_EQ(s.count, 2u * kIterations);
    EXPECT_EQ(s.cumulative_counts[0], 1u * kIterations);  // the zeros
    EXPECT_DOUBLE_EQ(s.sum, 1.0 * kIterations);
  }
  EXPECT_DOUBLE_EQ((*shared)->Labels({}).Value(), 0.5 * kThreads * kIterations);
  EXPECT_DOUBLE_EQ((*gauge)->Labels({}).Value(), 0.0);
}

}  // namespace
}  // namespace tokenselect::common::metrics
