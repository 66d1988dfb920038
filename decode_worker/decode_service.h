// The gRPC face of the decode worker: tokenselect.v1.DecodeWorker (proto/tokenselect/v1/
// worker.proto) over a DecodeEngine. The only file of this folder that sees generated proto
// types; it translates requests into engine structs and engine events/statuses back.
#ifndef TOKENSELECT_DECODE_WORKER_DECODE_SERVICE_H_
#define TOKENSELECT_DECODE_WORKER_DECODE_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "decode_worker/decode_engine.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_links.h"
#include "grpcpp/impl/codegen/service_type.h"

namespace tokenselect::decode_worker {

struct DecodeServiceOptions {
  engine::SelectionOptions default_selection;  // the base that per-request overrides modify
  std::string worker_id;
  // The worker's address as clients reach it (filled into reservations).
  std::function<std::string()> address;
  // Device K/V links (ConnectKvLink, PushKv chunks with a link_id): null when the worker has no
  // GPU cache or no NCCL (ConnectKvLink is FAILED_PRECONDITION then). Must outlive the service.
  engine::KvLinkAcceptor* links = nullptr;
};

// `engine` must outlive the service.
std::unique_ptr<grpc::Service> NewDecodeService(DecodeEngine* engine, DecodeServiceOptions options);

}  // namespace tokenselect::decode_worker

#endif  // TOKENSELECT_DECODE_WORKER_DECODE_SERVICE_H_
