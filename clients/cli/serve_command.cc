// tokenselect serve --all-in-one [--model DIR] [--port N]
// The embedded deployment (docs/DESIGN.md section 2): the router, one prefill worker and one
// decode worker in one process, talking gRPC over loopback with the host KV transport, on the
// CPU. The model is loaded once and shared by both workers. Without --model it serves the
// generated demo checkpoint, written to --cache_dir on first use. SIGINT / SIGTERM drain.
// With --metrics_port the three parts record into one registry served on that port; the router
// alone records the request latencies (docs/metrics.md).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cli/command.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/tokenselect_metrics.h"
#include "common/status.h"
#include "decode_worker/decode_worker.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/model_loader.h"
#include "engine/generation/worker_backend.h"
#include "engine/model/kv_cache_dtype.h"
#include "prefill_worker/prefill_worker.h"
#include "router/router_server.h"
#include "rpc/credentials.h"
#include "wire/selection_flags.h"

ABSL_FLAG(bool, all_in_one, false,
          "serve: run the router and one prefill and one decode worker in this process.");
ABSL_FLAG(std::string, host, "0.0.0.0", "serve: address the router listens on.");
ABSL_FLAG(int32_t, port, 50051, "serve: router port (0 picks a free one).");
ABSL_FLAG(int64_t, kv_pages, 4096,
          "serve: KV-cache pages of each worker (--device cuda: 0 plans them from the GPU's "
          "memory, half of it per worker).");
ABSL_FLAG(int64_t, max_prompt_tokens, 0,
          "serve: longest accepted prompt in tokens (0: config.json max_position_embeddings).");
ABSL_FLAG(std::string, api_keys_file, "", "serve: API keys file (one per line); empty: none.");
ABSL_FLAG(std::string, cache_dir, "",
          "serve: where the demo checkpoint is written when --model is not given "
          "(default $XDG_CACHE_HOME/tokenselect or ~/.cache/tokenselect).");
ABSL_FLAG(double, drain_timeout_s, 10, "serve: grace period for in-flight requests on SIGTERM.");
ABSL_FLAG(int32_t, metrics_port, 0,
          "serve: Prometheus /metrics port of the whole process (0: no metrics endpoint).");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "serve: address the /metrics endpoint listens on.");

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, load_format);
ABSL_DECLARE_FLAG(int64_t, page_size);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int32_t, tp);
ABSL_DECLARE_FLAG(int32_t, gpu);
ABSL_DECLARE_FLAG(int32_t, tp_invariant);
ABSL_DECLARE_FLAG(std::string, kv_dtype);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);

namespace tokenselect::cli {
namespace {

std::string CacheDir() {
  if (!absl::GetFlag(FLAGS_cache_dir).empty()) return absl::GetFlag(FLAGS_cache_dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/tokenselect");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "/tmp", "/.cache/tokenselect");
}

// --model, or the demo checkpoint in the cache directory (written when absent).
absl::StatusOr<std::string> ModelDir() {
  if (!absl::GetFlag(FLAGS_model).empty()) return absl::GetFlag(FLAGS_model);
  const std::string dir = CacheDir() + "/demo-model";
  if (FILE* f = std::fopen((dir + "/config.json").c_str(), "r")) {
    std::fclose(f);
    return dir;
  }
  std::fprintf(stderr, "serve: writing the demo checkpoint to %s\n", dir.c_str());
  RETURN_IF_ERROR(engine::WriteDemoCheckpoint(dir, engine::DemoCheckpointOptions()));
  return dir;
}

}  // namespace

absl::Status RunServe(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected arguments: ", absl::StrJoin(args, " ")));
  }
  if (!absl::GetFlag(FLAGS_all_in_one)) {
    return absl::InvalidArgumentError(
        "only --all-in-one is supported here; the disaggregated deployment runs the router, "
        "prefill_worker and decode_worker binaries");
  }
  ASSIGN_OR_RETURN(const std::string model_dir, ModelDir());
  ASSIGN_OR_RETURN(engine::LoadFormat format,
                   engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format)));
  // The CPU shares one model between the two workers; on a GPU each worker loads its own copy
  // (one CudaModel per worker, half of the GPU's memory each unless --kv_pages says otherwise).
  engine::WorkerBackendOptions backend;
  backend.device = absl::GetFlag(FLAGS_device);
  backend.gpu = absl::GetFlag(FLAGS_gpu);
  backend.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  backend.page_size = absl::GetFlag(FLAGS_page_size);
  backend.tp_invariant = absl::GetFlag(FLAGS_tp_invariant);
  ASSIGN_OR_RETURN(backend.kv_dtype, engine::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype)));
  RETURN_IF_ERROR(engine::ValidateWorkerBackendOptions(backend));
  // The workers' default selection, from the flags the worker binaries take (requests may
  // override it).
  absl::StatusOr<engine::SelectionOptions> selection = wire::SelectionDefaultsFromFlags();
  if (!selection.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--selection_* or --prefill_chunk_size: ", selection.status().message()));
  }
  if (absl::GetFlag(FLAGS_tp) != 1) {
    return absl::InvalidArgumentError(
        "--tp: serve --all-in-one runs each worker on one GPU; tensor parallelism runs in the "
        "prefill_worker and decode_worker binaries (their --tp)");
  }
  engine::LoadedModel loaded;
  if (backend.device == "cpu") {
    ASSIGN_OR_RETURN(loaded, engine::LoadModelDirectory(model_dir, format));
  }

  // Block the stop signals before any server thread starts; this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  decode_worker::DecodeWorkerOptions decode_options;
  decode_options.model = loaded.model.get();
  decode_options.tokenizer = loaded.tokenizer.get();
  decode_options.model_dir = model_dir;
  decode_options.load_format = absl::GetFlag(FLAGS_load_format);
  decode_options.backend = backend;
  decode_options.backend.gpu_memory_fraction = 0.45;
  decode_options.default_selection = *selection;
  decode_options.listen_address = "127.0.0.1:0";
  const common::metrics::TokenSelectMetrics& metrics =
      common::metrics::TokenSelectMetrics::Default();
  decode_options.engine.metrics = &metrics;
  decode_options.engine.record_inter_token = false;  // the router records it
  ASSIGN_OR_RETURN(std::unique_ptr<decode_worker::DecodeWorker> decode,
                   decode_worker::StartDecodeWorker(decode_options));

  prefill_worker::PrefillWorkerOptions prefill_options;
  prefill_options.model = loaded.model.get();
  prefill_options.tokenizer = loaded.tokenizer.get();
  prefill_options.model_dir = model_dir;
  prefill_options.load_format = absl::GetFlag(FLAGS_load_format);
  prefill_options.backend = backend;
  prefill_options.backend.gpu_memory_fraction = 0.9;  // of the whole GPU: the rest of it
  prefill_options.default_selection = *selection;
  prefill_options.listen_address = "127.0.0.1:0";
  prefill_options.engine.metrics = &metrics;
  ASSIGN_OR_RETURN(std::unique_ptr<prefill_worker::PrefillWorker> prefill,
                   prefill_worker::StartPrefillWorker(prefill_options));

  router::RouterOptions router_options;
  router_options.model_dir = model_dir;
  router_options.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  router_options.listen_address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  ASSIGN_OR_RETURN(
      router_options.server.tls,
      rpc::TlsOptionsFromFlags(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                               absl::GetFlag(FLAGS_tls_ca)));
  // With a CA, the public port asks every caller for a certificate it signed (mutual TLS): the
  // CA has no other use here (the router binary's --tls_require_client_cert does the same).
  router_options.server.tls.require_client_cert = !absl::GetFlag(FLAGS_tls_ca).empty();
  router_options.prefill_targets = {prefill->address()};
  router_options.decode_targets = {decode->address()};
  router_options.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  router_options.probe_interval = absl::Milliseconds(250);
  router_options.metrics = &metrics;
  router_options.default_selection = *selection;
  ASSIGN_OR_RETURN(std::unique_ptr<common::metrics::MetricsServer> metrics_server,
                   common::metrics::StartMetricsServerIfEnabled(absl::GetFlag(FLAGS_metrics_port),
                                                                absl::GetFlag(FLAGS_metrics_host)));
  ASSIGN_OR_RETURN(std::unique_ptr<router::RouterServer> router,
                   router::RouterServer::Start(router_options));

  char self[4096] = "tokenselect";
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) self[n] = '\0';
  std::printf(
      "tokenselect all-in-one: serving %s on port %d (prefill %s, decode %s, metrics port %d)\n"
      "try:  %s generate --server localhost:%d --prompt \"Hello\" --max_new_tokens 32\n",
      model_dir.c_str(), router->port(), prefill->address().c_str(), decode->address().c_str(),
      metrics_server ? metrics_server->port() : 0, self, router->port());
  std::fflush(stdout);
  common::metrics::SetServingIfEnabled(metrics_server.get(), true);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  TS_LOG(INFO, "serve: signal {}, draining", signal_number);
  common::metrics::SetServingIfEnabled(metrics_server.get(), false);
  const absl::Duration drain = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  router->Shutdown(drain);
  router->Wait();
  prefill->Shutdown(absl::Seconds(1));
  decode->Shutdown(absl::Seconds(1));
  return absl::OkStatus();
}

}  // namespace tokenselect::cli
