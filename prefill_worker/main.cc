// prefill_worker: serves tokenselect.v1.PrefillWorker (prefill_worker.h) until SIGINT/SIGTERM, then
// drains: new requests are refused, running ones get --drain_timeout_ms to finish.
#include <signal.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"
#include "engine/selection/selection_options.h"
#include "prefill_worker/prefill_worker.h"
#include "rpc/credentials.h"
#include "wire/selection_flags.h"
#include "wire/worker_flags.h"
#include "wire/worker_setup.h"

ABSL_FLAG(int32_t, port, 50051, "port to listen on (0 picks one)");
ABSL_FLAG(int32_t, num_threads, 1, "prefills running at once");
ABSL_FLAG(int64_t, max_queued, 64, "queued + running prefills; more is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, transport, "host",
          "host | nccl: how K/V reach the decode workers (nccl: GPU to GPU, needs --device cuda on "
          "both workers)");
ABSL_FLAG(int64_t, kv_block_bytes, 1 << 20,
          "payload bytes per PushKv message (--transport host; over nccl the payload goes by the "
          "device link in whole chunks)");
ABSL_FLAG(bool, kv_checksum, false,
          "send an FNV-1a checksum with every KV block (--transport host; debug builds always "
          "do; the nccl link carries none)");
ABSL_FLAG(bool, kv_tls, true,
          "with --tls_* set, push K/V to the decode workers over mutual TLS with the same "
          "certificate, key and CA (false: plaintext KV channel)");
ABSL_FLAG(std::string, kv_tls_server_name, "",
          "name checked against decode worker certificates instead of their addresses");

int main(int argc, char** argv) {
  sigset_t signals;
  auto flags = tokenselect::wire::StartWorkerMain(
      argc, argv,
      "prefill_worker --model DIR [--port N] [--device cpu|cuda --gpu N] [--kv_pages N] "
      "[--page_size N]",
      &signals);
  if (!flags.ok()) return 2;

  tokenselect::prefill_worker::PrefillWorkerOptions options;
  options.model_dir = flags->model_dir;
  options.load_format = flags->load_format;
  options.listen_address = absl::StrCat(flags->host, ":", absl::GetFlag(FLAGS_port));
  options.backend = flags->backend;
  options.links = flags->links;
  options.transport_kind = absl::GetFlag(FLAGS_transport);
  options.engine.num_threads = absl::GetFlag(FLAGS_num_threads);
  options.engine.max_queued = absl::GetFlag(FLAGS_max_queued);
  options.engine.kv.max_block_bytes = absl::GetFlag(FLAGS_kv_block_bytes);
  options.engine.kv.checksum = options.engine.kv.checksum || absl::GetFlag(FLAGS_kv_checksum);
  options.engine.metrics = &tokenselect::common::metrics::TokenSelectMetrics::Default();
  auto setup = tokenselect::wire::SetUpWorker(flags->setup);
  if (!setup.ok()) {
    TS_LOG(ERROR, "prefill worker: {}", setup.status().ToString());
    return tokenselect::wire::SetupExitCode(setup.status());
  }
  options.credentials = setup->credentials;
  options.default_selection = setup->default_selection;
  if (!absl::GetFlag(FLAGS_kv_tls_server_name).empty() &&
      !(setup->tls.enabled && absl::GetFlag(FLAGS_kv_tls))) {
    TS_LOG(ERROR,
           "prefill worker: --kv_tls_server_name needs TLS (--tls_cert, --tls_key, "
           "--tls_ca) with --kv_tls");
    return 2;
  }
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
  tokenselect::common::metrics::SetServingIfEnabled(setup->metrics_server.get(), true);
  tokenselect::wire::WaitForTermination(signals, "prefill worker");
  tokenselect::common::metrics::SetServingIfEnabled(setup->metrics_server.get(), false);
  (*worker)->Shutdown(flags->drain_timeout);
  return 0;
}
