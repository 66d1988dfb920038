// router: the public tokenselect.v1.Generation endpoint in front of prefill and decode workers.
//   router --model DIR --prefill_workers HOST:PORT,... --decode_workers dns:///svc:PORT [--port N]
// SIGTERM / SIGINT drain: the health status turns NOT_SERVING, new calls are refused, in-flight
// requests get --drain_timeout_s to finish.
#include <csignal>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"
#include "router/router_server.h"
#include "router/worker_registry.h"
#include "rpc/credentials.h"

ABSL_FLAG(std::string, model, "",
          "Checkpoint directory (only the tokenizer and config.json are read).");
ABSL_FLAG(std::string, model_name, "", "Model name reported by GetModelInfo (default: directory).");
ABSL_FLAG(std::string, host, "0.0.0.0", "Listen address.");
ABSL_FLAG(int32_t, port, 50051, "Listen port (0 picks a free one; printed on stdout).");
ABSL_FLAG(std::string, prefill_workers, "", "Prefill workers: host:port,... or dns:///name:port.");
ABSL_FLAG(std::string, decode_workers, "", "Decode workers: host:port,... or dns:///name:port.");
ABSL_FLAG(int64_t, max_prompt_tokens, 0, "Longest prompt accepted (0: max_position_embeddings).");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20, "gRPC message size limit (send and receive).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate: TLS on the public port and, with "
          "--worker_tls, the client certificate towards the workers.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that verifies the workers' certificates (--worker_tls)"
          " and, with --tls_require_client_cert, the clients'.");
ABSL_FLAG(bool, tls_require_client_cert, false, "Public port: require client certificates.");
ABSL_FLAG(bool, worker_tls, false, "Use mutual TLS (--tls_cert/--tls_key/--tls_ca) to workers.");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "Name checked against worker certificates instead of their addresses.");
ABSL_FLAG(std::string, api_keys_file, "", "File of API keys (one per line); empty: no keys.");
ABSL_FLAG(double, probe_interval_s, 0.5, "Worker health and load polling interval.");
ABSL_FLAG(double, resolve_interval_s, 10, "Re-resolution interval of dns:/// worker targets.");
ABSL_FLAG(double, drain_timeout_s, 30, "Grace period for in-flight requests on SIGTERM.");
ABSL_FLAG(int32_t, metrics_port, 0, "Prometheus /metrics port (0: no metrics endpoint).");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "Address the /metrics endpoint listens on.");

namespace tokenselect::router {
namespace {

absl::StatusOr<RouterOptions> OptionsFromFlags() {
  RouterOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  o.model_name = absl::GetFlag(FLAGS_model_name);
  o.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  o.listen_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  auto tls = rpc::TlsOptionsFromFlags(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                      absl::GetFlag(FLAGS_tls_ca));
  if (!tls.ok()) return tls.status();
  o.server.tls = *tls;
  o.server.tls.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  // Flags that only mean something with others: refused alone rather than ignored.
  if (o.server.tls.require_client_cert && absl::GetFlag(FLAGS_tls_ca).empty()) {
    return absl::InvalidArgumentError(
        "--tls_require_client_cert needs --tls_ca (the CA that signs the callers' certificates) "
        "with --tls_cert and --tls_key");
  }
  if (!absl::GetFlag(FLAGS_worker_tls_server_name).empty() && !absl::GetFlag(FLAGS_worker_tls)) {
    return absl::InvalidArgumentError("--worker_tls_server_name needs --worker_tls");
  }
  o.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (absl::GetFlag(FLAGS_worker_tls)) {
    o.workers.tls = *tls;
    o.workers.tls.enabled = true;
    o.workers.tls.server_name_override = absl::GetFlag(FLAGS_worker_tls_server_name);
  }
  o.workers.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  auto prefill = ParseTargets(absl::GetFlag(FLAGS_prefill_workers));
  if (!prefill.ok()) return prefill.status();
  auto decode = ParseTargets(absl::GetFlag(FLAGS_decode_workers));
  if (!decode.ok()) return decode.status();
  o.prefill_targets = *prefill;
  o.decode_targets = *decode;
  o.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  o.probe_interval = absl::Seconds(absl::GetFlag(FLAGS_probe_interval_s));
  o.resolve_interval = absl::Seconds(absl::GetFlag(FLAGS_resolve_interval_s));
  o.metrics = &common::metrics::TokenSelectMetrics::Default();
  return o;
}

int Main(int argc, char** argv) {
  auto positional = common::ParseFlags(argc, argv,
                                       "router --model DIR --prefill_workers ... "
                                       "--decode_workers ... [--port N]");
  if (!positional.ok()) {
    std::fprintf(stderr, "router: %s\n", std::string(positional.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<RouterOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "router: %s\n", options.status().ToString().c_str());
    return 2;
  }
  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto metrics_server = common::metrics::StartMetricsServerIfEnabled(
      absl::GetFlag(FLAGS_metrics_port), absl::GetFlag(FLAGS_metrics_host));
  if (!metrics_server.ok()) {
    std::fprintf(stderr, "router: metrics: %s\n", metrics_server.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(*std::move(options));
  if (!router.ok()) {
    std::fprintf(stderr, "router: %s\n", router.status().ToString().c_str());
    return 1;
  }
  common::metrics::SetServingIfEnabled(metrics_server->get(), true);
  std::printf("router listening on port %d\n", (*router)->port());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  TS_LOG(INFO, "router: signal {}, draining", signal_number);
  common::metrics::SetServingIfEnabled(metrics_server->get(), false);
  (*router)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
  (*router)->Wait();
  return 0;
}

}  // namespace
}  // namespace tokenselect::router

int main(int argc, char** argv) { return tokenselect::router::Main(argc, argv); }
