// absl::Status <-> grpc::Status at the service edge (the codes are numerically the same).
#ifndef TOKENSELECT_RPC_STATUS_CONVERT_H_
#define TOKENSELECT_RPC_STATUS_CONVERT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace tokenselect::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view prefix = "");

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_STATUS_CONVERT_H_
