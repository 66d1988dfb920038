// prefill_worker: serves tokenselect.v1.PrefillWorker (prefill_worker.h) until SIGINT/SIGTERM, then
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
#include "engine/selection/selection_options.h"
#include "prefill_worker/prefill_worker.h"
#include "rpc/credentials.h"
#include "wire/backend_flags.h"
#include "wire/selection_flags.h"
#include "wire/worker_setup.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json, *.safetensors, tokenizer.json)");
ABSL_FLAG(std::string, load_format, "auto", "auto | safetensors | dummy");
ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on");
ABSL_FLAG(int32_t, port, 50051, "port to listen on (0 picks one)");
ABSL_FLAG(int32_t, num_threads, 1, "prefills running at once");
ABSL_FLAG(int64_t, max_queued, 64, "queued + running prefills; more is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, transport, "host",
          "host | nccl: how K/V reach the decode workers (nccl: GPU to GPU, needs --device cuda on "
          "both workers)");
ABSL_FLAG(int64_t, kv_link_timeout_ms, 10000,
          "nccl transport: longest wait for a decode worker to join a link or for a chunk");
ABSL_FLAG(int64_t, kv_block_bytes, 1 << 20, "payload bytes per PushKv message");
ABSL_FLAG(bool, kv_checksum, false, "send an FNV-1a checksum with every KV block");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000, "on SIGTERM, time given to running requests");
ABSL_FLAG(int32_t, metrics_port, 0, "Prometheus /metrics port (0: no metrics endpoint)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "address the /metrics endpoint listens on");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that verifies client certificates (--tls_require_client_cert) and the decode "
          "workers' certificates (--kv_tls)");
ABSL_FLAG(bool, tls_require_client_cert, true,
          "with TLS on, refuse callers without a certificate signed by --tls_ca (mutual TLS)");
ABSL_FLAG(bool, kv_tls, true,
          "with --tls_* set, push K/V to the decode workers over mutual TLS with the same "
          "certificate, key and CA (false: plaintext KV channel)");
ABSL_FLAG(std::string, kv_tls_server_name, "",
          "name checked against decode worker certificates instead of their addresses");

int main(int argc, char** argv) {
  auto args = tokenselect::common::ParseFlags(
      argc, argv, "prefill_worker --model DIR [--port N] [--device cpu|cuda --gpu N] [--kv_pages N] [--page_size N]");
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

  tokenselect::prefill_worker::PrefillWorkerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.load_format = absl::GetFlag(FLAGS_load_format);
  options.listen_address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  auto backend = tokenselect::wire::BackendOptionsFromFlags();
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  options.backend = *backend;
  options.transport_kind = absl::GetFlag(FLAGS_transport);
  options.links.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_link_timeout_ms));
  options.engine.num_threads = absl::GetFlag(FLAGS_num_threads);
  options.engine.max_queued = absl::GetFlag(FLAGS_max_queued);
  options.engine.kv.max_block_bytes = absl::GetFlag(FLAGS_kv_block_bytes);
  options.engine.kv.checksum = options.engine.kv.checksum || absl::GetFlag(FLAGS_kv_checksum);
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
    TS_LOG(ERROR, "prefill worker: {}", setup.status().ToString());
    return tokenselect::wire::SetupExitCode(setup.status());
  }
  options.credentials = setup->credentials;
  options.default_selection = setup->default_selection;
  if (setup->tls.enabled && absl::GetFlag(FLAGS_kv_tls)) {
    tokenselect::rpc::TlsOptions kv_tls = setup->tls;
    kv_tls.server_name_override = absl::GetFlag(FLAGS_kv_tls_server_name);
    auto kv_credentials = tokenselect::rpc::MakeChannelCredentials(kv_tls);
    if (!kv_credentials.ok()) {
      TS_LOG(ERROR, "prefill worker: {}", kv_credentials.status().ToString());
      return 2;
    }
    options.kv_channel_credentials = *kv_credentials;
  }
  auto worker = tokenselect::prefill_worker::StartPrefillWorker(options);
  if (!worker.ok()) {
    TS_LOG(ERROR, "prefill worker failed to start: {}", worker.status().ToString());
    return 1;
  }
  int signal = 0;
  sigwait(&signals, &signal);
  TS_LOG(INFO, "prefill worker: signal {}, draining", signal);
  (*worker)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  return 0;
}
