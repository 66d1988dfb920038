// The public API's SamplingParams and SelectionParams messages (proto/tokenselect/v1/
// generate.proto, also carried in the worker protocol) against params::SamplingParams and
// params::SelectionOptions: one translation for the router and the workers. Only *_service.cc
// files include it, as they do the generated types.
#ifndef TOKENSELECT_RPC_PROTO_PARAMS_H_
#define TOKENSELECT_RPC_PROTO_PARAMS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "params/sampling_params.h"
#include "params/selection_options.h"
#include "proto/tokenselect/v1/generate.pb.h"

namespace tokenselect::rpc {

// tokenselect.v1.SelectionPolicy numbers and params policies map by name:
// SELECTION_POLICY_HEAD_VOTE is "head_vote" (params::PolicyName), so a policy is known exactly
// when both the protocol and params know it.
// The wire number of `kind`.
int SelectionPolicyNumber(params::SelectionPolicyKind kind);
// The policy of wire number `number`; nullopt for UNSPECIFIED (the workers' default);
// InvalidArgument naming selection.policy for a number unknown to the protocol or to params.
absl::StatusOr<std::optional<params::SelectionPolicyKind>> SelectionPolicyFromNumber(int number);

// Every field of `p` from `s` (a worker's or server's selection defaults).
void SelectionToProto(const params::SelectionOptions& s, ::tokenselect::v1::SelectionParams* p);
// The fields `p` sets over `base` (not validated: ValidateSelectionOptions does that);
// InvalidArgument naming selection.policy for an unknown policy number.
absl::StatusOr<params::SelectionOptions> SelectionFromProto(
    const ::tokenselect::v1::SelectionParams& p, params::SelectionOptions base = {});

// Unset optional fields keep the defaults (params::SamplingParams{}); nothing is validated here
// (params::Validate does that where the vocabulary is known).
params::SamplingParams SamplingFromProto(const ::tokenselect::v1::SamplingParams& p);

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_PROTO_PARAMS_H_
