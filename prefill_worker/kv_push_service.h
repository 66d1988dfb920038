// The host KvTransport: gRPC client streaming of raw K/V bytes to DecodeWorker.PushKv
// (proto/tokenselect/v1/worker.proto, framing in docs/kv_transfer.md). One channel per decode
// worker address, created on first use and kept.
#ifndef TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_
#define TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/generation/backend.h"
#include "engine/transfer/kv_links.h"
#include "engine/transfer/kv_transport.h"
#include "grpcpp/security/credentials.h"

namespace tokenselect::prefill_worker {

// `credentials`: insecure when null.
std::unique_ptr<engine::KvTransport> NewGrpcKvTransport(
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// The NCCL transport (engine/transfer/kv_links.h) from `backend`'s GPU cache: links to decode
// workers are set up through their DecodeWorker.ConnectKvLink RPC (with `credentials`, insecure
// when null); `meta` (which must outlive the result) carries the metadata blocks and final
// records. InvalidArgument naming --transport without a GPU backend; FailedPrecondition in builds
// without NCCL.
absl::StatusOr<std::unique_ptr<engine::KvTransport>> NewNcclKvTransport(
    engine::GenerationBackend* backend, engine::KvTransport* meta,
    std::shared_ptr<grpc::ChannelCredentials> credentials, const engine::KvLinkOptions& options);

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_KV_PUSH_SERVICE_H_
