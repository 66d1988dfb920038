// The host KvTransport: gRPC client streaming of raw K/V bytes to DecodeWorker.PushKv
// (proto/tokenselect/v1/worker.proto, framing in docs/kv_transfer.md). One channel per decode
// worker address, created on first use and kept.
#ifndef TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_
#define TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_

#include <memory>

#include "engine/transfer/kv_transport.h"
#include "grpcpp/security/credentials.h"

namespace tokenselect::prefill_worker {

// `credentials`: insecure when null.
std::unique_ptr<engine::KvTransport> NewGrpcKvTransport(
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_
