#include "common/metrics/metrics_server.h"

#include <atomic>
#include <string>

#include "gtest/gtest.h"
#include "httplib.h"

namespace tokenselect::common::metrics {
namespace {

MetricsServerOptions Loopback(int port = 0) {
  MetricsServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  return options;
}

TEST(MetricsServerTest, ServesMetricsAndHealthOnLoopback) {
  Registry registry;
  auto requests = registry.AddCounter("tokenselect_requests_total", "Requests.", {"code"});
  ASSERT_TRUE(requests.ok());
  (*requests)->Labels({"OK"}).Increment(3);

  std::atomic<bool> healthy{true};
  MetricsServerOptions options = Loopback();
  options.healthy = [&] { return healthy.load(); };
  MetricsServer server(&registry, options);
  EXPECT_EQ(server.port(), 0);
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.port(), 0);

  httplib::Client client("127.0.0.1", server.port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), std::string(kExpositionContentType));
  EXPECT_EQ(metrics->body, registry.Render());
  EXPECT_NE(metrics->body.find("tokenselect_requests_total{code=\"OK\"} 3\n"), std::string::npos);

  // Updates show on the next scrape.
  (*requests)->Labels({"OK"}).Increment();
  metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("tokenselect_requests_total{code=\"OK\"} 4\n"), std::string::npos);

  // Not ready until the process says it serves, whatever the health callback says.
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body, "not serving\n");
  server.SetServing(true);
  health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  healthy = false;
  health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body, "unhealthy\n");
  healthy = true;
  server.SetServing(false);  // draining
  health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body, "not serving\n");

  auto missing = client.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);

  const int port = server.port();
  server.Stop();
  server.Stop();  // idempotent
  EXPECT_EQ(server.port(), 0);
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST(MetricsServerTest, StartIfEnabledIsOffAtPortZeroAndServesTheDefaultRegistryOtherwise) {
  auto off = StartMetricsServerIfEnabled(0, "127.0.0.1");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);

  int port = 0;
  {  // find a free loopback port
    Registry scratch;
    MetricsServer probe(&scratch, Loopback());
    ASSERT_TRUE(probe.Start().ok());
    port = probe.port();
  }
  auto on = StartMetricsServerIfEnabled(port, "127.0.0.1");
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_NE(*on, nullptr);
  httplib::Client client("127.0.0.1", port);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->body, Registry::Default().Render());
}

TEST(MetricsServerTest, StartErrors) {
  Registry registry;
  MetricsServer first(&registry, Loopback());
  ASSERT_TRUE(first.Start().ok());
  EXPECT_EQ(first.Start().code(), absl::StatusCode::kFailedPrecondition);

  MetricsServer clash(&registry, Loopback(first.port()));
  EXPECT_EQ(clash.Start().code(), absl::StatusCode::kUnavailable);

  MetricsServer bad_port(&registry, Loopback(70000));
  EXPECT_EQ(bad_port.Start().code(), absl::StatusCode::kInvalidArgument);

  first.Stop();
  EXPECT_EQ(first.Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MetricsServerTest, StopWithoutStartAndDestructorStop) {
  Registry registry;
  { MetricsServer never_started(&registry, Loopback()); }
  MetricsServer stopped(&registry, Loopback());
  stopped.Stop();
  EXPECT_EQ(stopped.Start().code(), absl::StatusCode::kFailedPrecondition);
  {  // Destroyed while running: the destructor stops and joins.
    MetricsServer running(&registry, Loopback());
    ASSERT_TRUE(running.Start().ok());
  }
}

}  // namespace
}  // namespace tokenselect::common::metrics
