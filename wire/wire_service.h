// Translation between the worker protocol (proto/tokenselect/v1/worker.proto) and engine structs,
// shared by the prefill and decode workers (which never include each other). Seen only by
// *_service.cc files, as the protocol's generated types are.
#ifndef TOKENSELECT_WIRE_WIRE_SERVICE_H_
#define TOKENSELECT_WIRE_WIRE_SERVICE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/sampling/finish_reason.h"
#include "engine/transfer/kv_format.h"
#include "proto/tokenselect/v1/worker.pb.h"

namespace tokenselect::wire {

namespace v1 = ::tokenselect::v1;

// SamplingParams and SelectionParams: rpc::SamplingFromProto and rpc::SelectionFromProto
// (rpc/proto_params.h), shared with the router.

v1::FinishReason ToWire(engine::FinishReason reason);

// KV transfer records, both directions (prefill sends, decode receives).
void ToWire(const engine::KvLayout& layout, v1::KvLayout* out);
engine::KvLayout ToEngine(const v1::KvLayout& layout);
// Moves the payload into `out`.
void ToWire(engine::KvBlock block, v1::KvChunk* out);
// Moves the payload out of `chunk`.
engine::KvBlock ToEngine(v1::KvChunk* chunk);
void ToWire(const engine::KvFinal& final, v1::KvFinal* out);
// Moves the selection states out of `final` (they can be large: 4 bytes per prompt token and
// layer of received attention, plus span indexes).
engine::KvFinal ToEngine(v1::KvFinal* final);

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_WIRE_SERVICE_H_
