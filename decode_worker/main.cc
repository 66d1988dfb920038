// decode_worker: serves tokenselect.v1.DecodeWorker (decode_worker.h) until SIGINT/SIGTERM, then
// drains: new requests are refused, running ones get --drain_timeout_ms to finish.
#include <signal.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"
#include "decode_worker/decode_worker.h"
#include "engine/selection/selection_options.h"
#include "rpc/credentials.h"
#include "wire/selection_flags.h"
#include "wire/worker_flags.h"
#include "wire/worker_setup.h"

ABSL_FLAG(int32_t, port, 50052, "port to listen on (0 picks one)");
ABSL_FLAG(int64_t, lease_timeout_ms, 30000,
          "free a reservation when no KV message arrives for this long");
ABSL_FLAG(int64_t, max_running, 256, "requests admitted at once (running + waiting for KV)");

int main(int argc, char** argv) {
  sigset_t signals;
  auto flags = tokenselect::wire::StartWorkerMain(
      argc, argv,
      "decode_worker --model DIR [--port N] [--device cpu|cuda --gpu N] [--kv_pages N] "
      "[--page_size N]",
      &signals);
  if (!flags.ok()) return 2;

  tokenselect::decode_worker::DecodeWorkerOptions options;
  options.model_dir = flags->model_dir;
  options.load_format = flags->load_format;
  options.listen_address = absl::StrCat(flags->host, ":", absl::GetFlag(FLAGS_port));
  options.backend = flags->backend;
  options.links = flags->links;
  options.engine.lease_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  options.engine.max_running = absl::GetFlag(FLAGS_max_running);
  options.engine.metrics = &tokenselect::common::metrics::TokenSelectMetrics::Default();
  auto setup = tokenselect::wire::SetUpWorker(flags->setup);
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
  tokenselect::common::metrics::SetServingIfEnabled(setup->metrics_server.get(), true);
  tokenselect::wire::WaitForTermination(signals, "decode worker");
  tokenselect::common::metrics::SetServingIfEnabled(setup->metrics_server.get(), false);
  (*worker)->Shutdown(flags->drain_timeout);
  return 0;
}
