// The gRPC face of the prefill worker: tokenselect.v1.PrefillWorker (proto/tokenselect/v1/
// worker.proto) over a PrefillEngine. Translates at the edge; the handler thread waits for the
// job and aborts it when the RPC is cancelled or its deadline passes.
#ifndef TOKENSELECT_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TOKENSELECT_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <memory>
#include <string>

#include "engine/selection/selection_options.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "prefill_worker/prefill_engine.h"

namespace tokenselect::prefill_worker {

struct PrefillServiceOptions {
  engine::SelectionOptions default_selection;  // the base that per-request overrides modify
  std::string worker_id;
};

// `engine` must outlive the service.
std::unique_ptr<grpc::Service> NewPrefillService(PrefillEngine* engine,
                                                 PrefillServiceOptions options);

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_PREFILL_SERVICE_H_
