// Translation between the worker protocol (proto/tokenselect/v1/worker.proto) and engine structs
// for the prefill worker (seen only by this folder's *_service.cc files). The sampling and
// selection translations are the same in both workers, which never include each other.
#ifndef TOKENSELECT_PREFILL_WORKER_WIRE_SERVICE_H_
#define TOKENSELECT_PREFILL_WORKER_WIRE_SERVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/sampling/finish_reason.h"
#include "engine/sampling/sampling_params.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_format.h"
#include "grpcpp/support/status.h"
#include "proto/tokenselect/v1/worker.pb.h"

namespace tokenselect::prefill_worker::wire {

namespace v1 = ::tokenselect::v1;

// absl <-> gRPC status (the codes are numerically identical); `prefix` goes before the message.
grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status, absl::string_view prefix = "");

// Unset optional fields keep the engine defaults (engine::SamplingParams{}).
engine::SamplingParams ToEngine(const v1::SamplingParams& params);
// Overrides `defaults` with the fields that are set; InvalidArgument for an unknown policy (the
// values are validated later by ValidateSelectionOptions).
absl::StatusOr<engine::SelectionOptions> ToEngine(const v1::SelectionParams& params,
                                                  engine::SelectionOptions defaults);

engine::KvLayout ToEngine(const v1::KvLayout& layout);
// Moves the payload into `out`.
void ToWire(engine::KvBlock block, v1::KvChunk* out);
void ToWire(const engine::KvFinal& final, v1::KvFinal* out);

}  // namespace tokenselect::prefill_worker::wire

#endif  // TOKENSELECT_PREFILL_WORKER_WIRE_SERVICE_H_
