// The selection query of one attention step (docs/DESIGN.md section 4): the step's queries,
// rotated with RoPE as if query i of the chunk sat at position n_local + i (decode: one query at
// n_local), averaged over the chunk. One vector per head; it is scored against the un-rotated
// cached keys (key_scores.h) and compared across decode steps by the selection cache.
//
// RoPE is kernels::cpu::ApplyRope (Hugging Face "rotate_half" convention, kernels/ops.h).
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTION_QUERY_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTION_QUERY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tokenselect::engine {

// q: [num_q, num_heads, head_dim], un-rotated; inv_freq: [head_dim / 2]
// (kernels::RopeInverseFrequencies); out: [num_heads, head_dim] (must not alias q).
// out[h, :] = mean_i rope(q[i, h, :], position n_local + i), the mean accumulated in double.
// InvalidArgument (naming the argument) when a pointer is null, num_q, num_heads or head_dim
// < 1, head_dim is odd, n_local < 0, or n_local + num_q - 1 exceeds the int32 range.
absl::Status BuildSelectionQuery(const float* q, int64_t num_q, int64_t num_heads, int64_t head_dim,
                                 int64_t n_local, const float* inv_freq, float* out);

// As above, returning the [num_heads, head_dim] vector.
absl::StatusOr<std::vector<float>> BuildSelectionQuery(const float* q, int64_t num_q,
                                                       int64_t num_heads, int64_t head_dim,
                                                       int64_t n_local, const float* inv_freq);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTION_QUERY_H_
