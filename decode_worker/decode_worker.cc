#include "decode_worker/decode_worker.h"

#include <utility>

#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "decode_worker/decode_service.h"

namespace tokenselect::decode_worker {

absl::StatusOr<std::unique_ptr<DecodeWorker>> StartDecodeWorker(
    const DecodeWorkerOptions& options) {
  std::unique_ptr<DecodeWorker> w(new DecodeWorker());
  w->worker_id_ = common::NewId("decode");
  if (options.model != nullptr && options.tokenizer != nullptr) {
    ASSIGN_OR_RETURN(w->backend_, engine::CpuWorkerBackend(options.model, options.tokenizer,
                                                           options.backend));
  } else {
    ASSIGN_OR_RETURN(engine::LoadFormat format, engine::ParseLoadFormat(options.load_format));
    ASSIGN_OR_RETURN(w->backend_,
                     engine::LoadWorkerBackend(options.model_dir, format, options.backend));
  }
  ASSIGN_OR_RETURN(w->engine_, DecodeEngine::Create(w->backend_->backend(),
                                                    w->backend_->tokenizer(), options.engine));
  DecodeServiceOptions service_options;
  if (std::optional<engine::DeviceKvCache> cache = w->backend_->backend()->device_cache()) {
    // A GPU cache takes device links (the NCCL transport) when the build has NCCL.
    absl::StatusOr<std::unique_ptr<engine::KvLinkAcceptor>> links =
        engine::NewNcclKvLinkAcceptor(*cache, options.links);
    if (links.ok()) {
      w->links_ = *std::move(links);
      service_options.links = w->links_.get();
    } else {
      TS_LOG(INFO, "decode worker: no device K/V links: {}", links.status().ToString());
    }
  }
  service_options.default_selection = options.default_selection;
  service_options.worker_id = w->worker_id_;
  DecodeWorker* raw = w.get();
  service_options.address = [raw] { return raw->address(); };
  w->service_ = NewDecodeService(w->engine_.get(), std::move(service_options));

  ASSIGN_OR_RETURN(
      wire::WorkerServer server,
      wire::StartWorkerServer("decode worker", options.listen_address, options.credentials,
                              options.max_receive_message_bytes, w->service_.get()));
  w->server_ = std::move(server);
  TS_LOG(INFO, "decode worker {} listening on {} ({})", w->worker_id_, w->address(),
         w->backend_->Describe());
  return w;
}

void DecodeWorker::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  wire::StopWorkerServer(&server_, [&] {
    if (engine_ != nullptr) engine_->Shutdown(grace);  // every stream ends here
  });
}

DecodeWorker::~DecodeWorker() { Shutdown(absl::ZeroDuration()); }

}  // namespace tokenselect::decode_worker
