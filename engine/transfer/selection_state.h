// The selection state that travels in a KV stream's final record (KvFinal::selection_states;
// docs/kv_transfer.md "Selection state"): the per-layer SelectionLayerState a stateful policy
// (tokenselect_span, infllm, cascade) built during prefill, so that the decode worker's
// SelectionAttention continues exactly where the prefill worker's stopped.
//
// Sender: CollectSelectionStates after the last prefill chunk. Receiver: DecodeSelectionStates
// when the final record arrives (KvReceiver::Finish), RestoreSelectionStates into the request's
// new SelectionAttention before its first decode step.
#ifndef TOKENSELECT_ENGINE_TRANSFER_SELECTION_STATE_H_
#define TOKENSELECT_ENGINE_TRANSFER_SELECTION_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_attention.h"

namespace tokenselect::engine {

// SerializeLayerState of layers [0, num_layers) of `attention`, in layer order; an empty list
// when every layer's state is still empty (stateless policies, or nothing observed), so that
// stateless policies add nothing to the stream. num_layers must be the attention's.
std::vector<std::string> CollectSelectionStates(const SelectionAttention& attention,
                                                int64_t num_layers);
// The same for states held elsewhere (the GPU provider's, downloaded): SerializeLayerState of
// each, or an empty list when every one is empty (or there are none).
std::vector<std::string> SerializeSelectionStates(absl::Span<const SelectionLayerState> states);

// Decodes the final record's states for a request of `prompt_tokens` tokens on a model of
// `num_layers` layers. The list must be empty or hold exactly num_layers entries, each a valid
// serialised state that describes no token at or beyond prompt_tokens (received attention, span
// index coverage, cascade tokens). InvalidArgument naming final.selection_states (and the layer)
// otherwise; an empty list gives an empty vector.
absl::StatusOr<std::vector<SelectionLayerState>> DecodeSelectionStates(
    absl::Span<const std::string> states, int64_t num_layers, int64_t prompt_tokens);

// Moves `states` (empty, or one per layer of `attention`) into the attention's per-layer state.
// InvalidArgument when the count is neither 0 nor num_layers.
absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states, int64_t num_layers,
                                    SelectionAttention* attention);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_SELECTION_STATE_H_
