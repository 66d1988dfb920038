// A grpc.health.v1.Health/Check client over the generic stub (the request and response are two
// tiny messages, encoded here by hand so that no generated health code is needed).
#ifndef TOKENSELECT_RPC_HEALTH_CLIENT_H_
#define TOKENSELECT_RPC_HEALTH_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace tokenselect::rpc {

enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// Calls Health/Check for `service` ("" is the whole server). Returns the serving status, or the
// RPC's error (UNAVAILABLE when the server cannot be reached, DEADLINE_EXCEEDED after
// `timeout`, NOT_FOUND for an unknown service).
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service, absl::Duration timeout);

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_HEALTH_CLIENT_H_
