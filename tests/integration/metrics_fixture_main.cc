// metrics_fixture: a test-only /metrics endpoint with simulated traffic on the whole metric set. It
// registers the tokenselect metric set, feeds it simulated traffic (requests of both phases,
// selection-cache lookups on a few layers, KV transfers on both transports, some failures) and
// serves /metrics and /healthz until SIGINT/SIGTERM or --duration_s.
//
// tests/integration/prometheus_test.py scrapes it with a real Prometheus (prometheus_fixture_test),
// next to the real all-in-one server (prometheus_integration_test): the fixture also produces label
// values the CPU server does not (nccl transport, failed transfers).
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"

ABSL_FLAG(int, metrics_port, 0, "Port of /metrics; 0 picks a free one (printed on stdout).");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, duration_s, 0, "Exit after this many seconds; 0 runs until SIGINT/SIGTERM.");
ABSL_FLAG(int, step_ms, 20, "Simulated traffic: one request every step.");

namespace tokenselect {
namespace {

using common::metrics::TokenSelectMetrics;
namespace m = common::metrics;

constexpr int kLayers = 4;

// One simulated request through router, prefill, transfer and decode.
void SimulateRequest(const TokenSelectMetrics& metrics, const m::SelectionCacheCounters& cache,
                     std::mt19937& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> prompt(1000, 64000);
  std::uniform_int_distribution<int> generated(16, 256);
  const int prompt_tokens = prompt(rng);
  const int new_tokens = generated(rng);
  const int chunks = (prompt_tokens + 511) / 512;

  metrics.queue_time_seconds->Labels({m::kPhasePrefill}).Observe(0.002 + 0.05 * unit(rng));
  metrics.queue_time_seconds->Labels({m::kPhaseDecode}).Observe(0.001 + 0.01 * unit(rng));
  metrics.prompt_tokens_total->Labels({}).Increment(prompt_tokens);
  for (int c = 0; c < std::min(chunks, 8); ++c) {
    metrics.prefill_chunk_seconds->Labels({}).Observe(0.02 + 0.03 * unit(rng));
    metrics.selection_seconds->Labels({m::kPhasePrefill, "token_select"})
        .Observe(1e-4 * (1 + unit(rng)));
    const bool nccl = unit(rng) < 0.5;
    const absl::string_view transport = nccl ? m::kTransportNccl : m::kTransportHost;
    const bool failed = unit(rng) < 0.02;
    metrics.kv_transfers_total->Labels({transport, failed ? m::kTransferError : m::kTransferOk})
        .Increment();
    if (!failed) {
      metrics.kv_transfer_bytes_total->Labels({transport}).Increment(512.0 * 128 * 1024);
      metrics.kv_transfer_seconds->Labels({transport})
          .Observe((nccl ? 0.002 : 0.02) * (1 + unit(rng)));
    }
  }
  const double ttft = 0.1 + prompt_tokens * 2e-5 * (1 + unit(rng));
  metrics.time_to_first_token_seconds->Labels({}).Observe(ttft);
  double total = ttft;
  for (int t = 1; t < new_tokens; ++t) {
    const double itl = 0.01 + 0.02 * unit(rng);
    total += itl;
    if (t % 8 == 0) metrics.inter_token_latency_seconds->Labels({}).Observe(itl);
    if (t % 16 == 0) {
      for (int layer = 0; layer < kLayers; ++layer) {
        cache.Record(layer, unit(rng) < 0.6 + 0.1 * layer);
        metrics.selection_seconds->Labels({m::kPhaseDecode, "token_select"})
            .Observe(5e-5 * (1 + unit(rng)));
      }
    }
  }
  metrics.generation_tokens_total->Labels({}).Increment(new_tokens);
  metrics.e2e_request_latency_seconds->Labels({}).Observe(total);
  const double outcome = unit(rng);
  if (outcome < 0.85) {
    metrics.RecordRequest(m::kOutcomeStop, absl::StatusCode::kOk);
  } else if (outcome < 0.95) {
    metrics.RecordRequest(m::kOutcomeLength, absl::StatusCode::kOk);
  } else if (outcome < 0.98) {
    metrics.RecordRequest(m::kOutcomeError, absl::StatusCode::kResourceExhausted);
  } else {
    metrics.RecordRequest(m::kOutcomeCancelled, absl::StatusCode::kCancelled);
  }
  std::uniform_int_distribution<int> load(0, 6);
  metrics.running_requests->Labels({m::kPhasePrefill}).Set(load(rng) % 3);
  metrics.running_requests->Labels({m::kPhaseDecode}).Set(load(rng) + 2);
  metrics.waiting_requests->Labels({m::kPhasePrefill}).Set(load(rng));
  metrics.waiting_requests->Labels({m::kPhaseDecode}).Set(load(rng) % 2);
  metrics.kv_cache_usage_ratio->Labels({m::kPhaseDecode}).Set(0.3 + 0.4 * unit(rng));
  metrics.kv_cache_usage_ratio->Labels({m::kPhasePrefill}).Set(0.1 * unit(rng));
}

int Run(int argc, char** argv) {
  auto positional = common::ParseFlags(argc, argv, "metrics_fixture [--metrics_port=N]");
  if (!positional.ok()) {
    std::fprintf(stderr, "%s\n", positional.status().ToString().c_str());
    return 2;
  }
  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const TokenSelectMetrics& metrics = TokenSelectMetrics::Default();
  metrics.healthy_workers->Labels({m::kPhasePrefill}).Set(1);
  metrics.healthy_workers->Labels({m::kPhaseDecode}).Set(2);
  m::MetricsServerOptions options;
  options.host = absl::GetFlag(FLAGS_metrics_host);
  options.port = absl::GetFlag(FLAGS_metrics_port);
  m::MetricsServer server(&m::Registry::Default(), options);
  if (absl::Status started = server.Start(); !started.ok()) {
    std::fprintf(stderr, "%s\n", started.ToString().c_str());
    return 1;
  }
  server.SetServing(true);  // nothing else to wait for here
  std::printf("metrics_port=%d\n", server.port());
  std::fflush(stdout);

  absl::Notification stop;
  std::thread traffic([&] {
    m::SelectionCacheCounters cache(metrics, "token_select", kLayers);
    std::mt19937 rng(42);
    const absl::Duration step = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));
    while (!stop.WaitForNotificationWithTimeout(step)) SimulateRequest(metrics, cache, rng);
  });

  const int duration_s = absl::GetFlag(FLAGS_duration_s);
  timespec timeout{duration_s, 0};
  const int signal = duration_s > 0 ? sigtimedwait(&stop_signals, nullptr, &timeout)
                                    : sigwaitinfo(&stop_signals, nullptr);
  TS_LOG(INFO, "metrics_fixture: stopping ({})",
         signal > 0 ? absl::StrCat("signal ", signal) : std::string("duration elapsed"));
  stop.Notify();
  traffic.join();
  server.Stop();
  return 0;
}

}  // namespace
}  // namespace tokenselect

int main(int argc, char** argv) { return tokenselect::Run(argc, argv); }
