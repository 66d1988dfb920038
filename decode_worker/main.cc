// decode_worker: serves tokenselect.v1.DecodeWorker (decode_worker.h) until SIGINT/SIGTERM, then
// drains: new requests are refused, running ones get --drain_timeout_ms to finish.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"
#include "decode_worker/decode_worker.h"
#include "engine/selection/selection_options.h"
#include "rpc/credentials.h"
#include "wire/backend_flags.h"
#include "wire/selection_flags.h"
#include "wire/worker_setup.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json, *.safetensors, tokenizer.json)");
ABSL_FLAG(std::string, load_format, "auto", "auto | safetensors | dummy");
ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on");
ABSL_FLAG(int32_t, port, 50052, "port to listen on (0 picks one)");
ABSL_FLAG(int64_t, lease_timeout_ms, 30000,
          "free a reservation when no KV message arrives for this long");
ABSL_FLAG(int64_t, kv_link_timeout_ms, 10000,
          "device K/V links (nccl transport): longest wait for a chunk or a busy link");
ABSL_FLAG(int64_t, max_running, 256, "requests admitted at once (running + waiting for KV)");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000, "on SIGTERM, time given to running requests");
ABSL_FLAG(int32_t, metrics_port, 0, "Prometheus /metrics port (0: no metrics endpoint)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "address the /metrics endpoint listens on");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that verifies client certificates (--tls_require_client_cert)");
ABSL_FLAG(bool, tls_require_client_cert, true,
          "with TLS on, refuse callers without a certificate signed by --tls_ca (mutual TLS)");

int main(int argc, char** argv) {
  auto args = tokenselect::common::ParseFlags(
      argc, argv, "decode_worker --model DIR [--port N] [--device cpu|cuda --gpu N] [--kv_pages N] [--page_size N]");
  if (!args.ok()) {
    std::fprintf(stderr, "%s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_model).empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  // Signals are taken by sigwait below: block them in every thread the server starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  tokenselect::decode_worker::DecodeWorkerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.load_format = absl::GetFlag(FLAGS_load_format);
  options.listen_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  auto backend = tokenselect::wire::BackendOptionsFromFlags();
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  options.backend = *backend;
  options.links.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_link_timeout_ms));
  options.engine.lease_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  options.engine.max_running = absl::GetFlag(FLAGS_max_running);
  options.engine.metrics = &tokenselect::common::metrics::TokenSelectMetrics::Default();
  tokenselect::wire::WorkerSetupOptions setup_options;
  setup_options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  setup_options.tls_key = absl::GetFlag(FLAGS_tls_key);
  setup_options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  setup_options.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  setup_options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  setup_options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  auto setup = tokenselect::wire::SetUpWorker(setup_options);
  if (!setup.ok()) {
    TS_LOG(ERROR, "decode worker: {}", setup.status().ToString());
    return tokenselect::wire::SetupExitCode(setup.status());
  }
  options.credentials = setup->credentials;
  options.default_selection = setup->default_selection;
  auto worker = tokenselect::decode_worker::StartDecodeWorker(options);
  if (!worker.ok()) {
    TS_LOG(ERROR, "decode worker failed to start: {}", worker.status().ToString());
    return 1;
  }
  int signal = 0;
  sigwait(&signals, &signal);
  TS_LOG(INFO, "decode worker: signal {}, draining", signal);
  (*worker)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  return 0;
}
