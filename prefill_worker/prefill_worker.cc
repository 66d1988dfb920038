#include "prefill_worker/prefill_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "prefill_worker/kv_push_service.h"
#include "prefill_worker/metered_kv_transport.h"
#include "prefill_worker/prefill_service.h"

namespace tokenselect::prefill_worker {

absl::StatusOr<std::unique_ptr<PrefillWorker>> StartPrefillWorker(
    const PrefillWorkerOptions& options) {
  std::unique_ptr<PrefillWorker> w(new PrefillWorker());
  w->worker_id_ = common::NewId("prefill");
  if (options.transport_kind != "host" && options.transport_kind != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("--transport must be host or nccl, got '",
                                                   options.transport_kind, "'"));
  }
  if (options.model != nullptr) {
    ASSIGN_OR_RETURN(w->backend_, engine::CpuWorkerBackend(options.model, options.tokenizer,
                                                           options.backend));
  } else {
    ASSIGN_OR_RETURN(engine::LoadFormat format, engine::ParseLoadFormat(options.load_format));
    ASSIGN_OR_RETURN(w->backend_,
                     engine::LoadWorkerBackend(options.model_dir, format, options.backend));
  }
  engine::KvTransport* transport = options.transport;
  absl::string_view transport_label = common::metrics::kTransportHost;
  if (transport == nullptr) {
    w->host_transport_ = NewGrpcKvTransport(options.kv_channel_credentials);
    transport = w->host_transport_.get();
    if (options.transport_kind == "nccl") {
      transport_label = common::metrics::kTransportNccl;
    }
  }
  if (options.engine.metrics != nullptr) {
    // For NCCL the metered stream carries the metadata blocks (their bytes counted from the
    // shape: they travel over the link).
    w->metered_transport_ =
        NewMeteredKvTransport(transport, *options.engine.metrics, transport_label);
    transport = w->metered_transport_.get();
  }
  if (options.transport == nullptr && options.transport_kind == "nccl") {
    ASSIGN_OR_RETURN(w->owned_transport_,
                     NewNcclKvTransport(w->backend_->backend(), transport,
                                        options.kv_channel_credentials, options.links));
    transport = w->owned_transport_.get();
  }
  ASSIGN_OR_RETURN(w->engine_,
                   PrefillEngine::Create(w->backend_->backend(), transport, options.engine));
  w->service_ = NewPrefillService(w->engine_.get(),
                                  PrefillServiceOptions{options.default_selection, w->worker_id_});

  ASSIGN_OR_RETURN(
      wire::WorkerServer server,
      wire::StartWorkerServer("prefill worker", options.listen_address, options.credentials,
                              options.max_receive_message_bytes, w->service_.get()));
  w->server_ = std::move(server);
  TS_LOG(INFO, "prefill worker {} listening on {} ({}; KV transport {})", w->worker_id_,
         w->address(), w->backend_->Describe(), options.transport_kind);
  return w;
}

void PrefillWorker::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  wire::StopWorkerServer(&server_, [&] {
    if (engine_ != nullptr) engine_->Shutdown(grace);
  });
}

PrefillWorker::~PrefillWorker() { Shutdown(absl::ZeroDuration()); }

}  // namespace tokenselect::prefill_worker
