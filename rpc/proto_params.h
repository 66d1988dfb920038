// The public API's SamplingParams message (proto/tokenselect/v1/generate.proto, also carried in
// the worker protocol) as params::SamplingParams: one translation for the router and the
// workers. Only *_service.cc files include it, as they do the generated types.
#ifndef TOKENSELECT_RPC_PROTO_PARAMS_H_
#define TOKENSELECT_RPC_PROTO_PARAMS_H_

#include "params/sampling_params.h"
#include "proto/tokenselect/v1/generate.pb.h"

namespace tokenselect::rpc {

// Unset optional fields keep the defaults (params::SamplingParams{}); nothing is validated here
// (params::Validate does that where the vocabulary is known).
params::SamplingParams SamplingFromProto(const ::tokenselect::v1::SamplingParams& p);

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_PROTO_PARAMS_H_
