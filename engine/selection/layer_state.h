// Per request and layer state of the stateful policies (tokenselect_span, infllm, cascade),
// owned by the request's SelectionAttention and freed with it. A policy fills it from each
// forward step (SelectionPolicy::ObserveChunk) and from its own Select calls. With prefill and
// decode on different workers it must travel with the KV: a decode worker that starts from an
// empty state makes infllm, tokenselect_span and cascade choose differently from a single
// process (quest and the TokenSelect policies need nothing but the keys).
//
// Binary layout (SerializeLayerState), little-endian:
//   4 bytes "TSLS", u32 version = 1
//   u64 R, R x f32 received
//   u64 B, B bytes: the span index (span_index.h layout, with its own hash)
//   i64 cascade next_token, u64 N sub-caches, N x (i64 capacity, i64 offers, u64 n,
//       n x (i32 token, f32 ema))
//   u32 FNV-1a hash of every preceding byte
#ifndef TOKENSELECT_ENGINE_SELECTION_LAYER_STATE_H_
#define TOKENSELECT_ENGINE_SELECTION_LAYER_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/selection/cascade_cache.h"
#include "engine/selection/span_index.h"

namespace tokenselect::engine {

struct SelectionLayerState {
  // received[t]: attention token t received from the queries of the chunk that wrote it,
  // summed over heads (chunk_attention.h); tokens [0, received.size()) have been observed.
  std::vector<float> received;
  SpanIndex spans;       // tokenselect_span
  CascadeCache cascade;  // cascade

  // Forgets what concerns tokens at or after num_tokens (a rollback); the cascade restarts.
  void TruncateTo(int64_t num_tokens);
};

std::string SerializeLayerState(const SelectionLayerState& state);

// DataLoss when the bytes are not a valid serialised state: size, magic, version, hash, a bad
// nested span index, a non-finite received value or EMA, a sub-cache over its capacity, or
// cascade tokens not ascending within a sub-cache or not below next_token.
absl::StatusOr<SelectionLayerState> DeserializeLayerState(absl::string_view bytes);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_LAYER_STATE_H_
