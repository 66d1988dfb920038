// The token list one attention step runs over, with compact positions (docs/DESIGN.md section 4):
// the selected cached tokens (selected_set.h, ascending) followed by the c new tokens of the
// current chunk (prefill: a chunk; decode: c = 1), whose K/V are already written at token
// indices [N, N + c).
//
// With L selected tokens the list has L + c entries; entry j gets RoPE position j ("compact
// positions": the model never sees a distance beyond ~n_init + k + n_local + c, which is the
// length extrapolation mechanism). Chunk token i is query i: it is entry L + i of the list, so
// its position is L + i and it sees the list prefix [0, L + i + 1): every selected token, and
// the chunk causally (itself included).
//
// Example: N = 10 cached tokens, selected {0, 1, 5, 8, 9}, a chunk of c = 3 tokens (10, 11, 12),
// token t in slot 100 + t:
//   kv_slots     = 100 101 105 108 109 110 111 112
//   kv_positions =   0   1   2   3   4   5   6   7
//   q_positions  = 5 6 7
//   visible      = 6 7 8
#ifndef TOKENSELECT_ENGINE_SELECTION_ATTENTION_LIST_H_
#define TOKENSELECT_ENGINE_SELECTION_ATTENTION_LIST_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model/attention_list.h"

namespace tokenselect::engine {

// AttentionList is the forward pass's hook type (engine/model/attention_list.h); the model
// points kernels::GatherAttentionParams at it.

// Builds `out` (overwritten) from the selected cached tokens and the chunk [num_cached,
// num_cached + chunk_len). token_slots: slot of every token of the request, at least
// [0, num_cached + chunk_len) (TokenTable::Slots). InvalidArgument when chunk_len < 0,
// num_cached < 0, token_slots is too short, `selected` is not strictly ascending within
// [0, num_cached), or L + c exceeds the int32 range.
absl::Status BuildAttentionList(absl::Span<const int32_t> selected,
                                absl::Span<const int32_t> token_slots, int64_t num_cached,
                                int64_t chunk_len, AttentionList* out);


}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_ATTENTION_LIST_H_
