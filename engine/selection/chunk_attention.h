// The causal attention map of one prefill chunk over itself (docs/DESIGN.md section 4, span
// index): the statistics the stateful policies build from each forward step.
//
// For a chunk of c new tokens at true positions p_0..p_{c-1} (already written to the K cache):
//   A[i, j] = sum_h softmax_{j' <= i}(scale * rope(q_i,h, p_i) . rope(k_j',h/g, p_j'))[j]
// for j <= i, and 0 above the diagonal. Every row sums to num_heads. The received attention of
// chunk token j is the column sum received[j] = sum_{i >= j} A[i, j]: the attention it received
// from the queries of the chunk that wrote it (averages num_heads per token in any chunk).
//
// Cost: c^2 / 2 * num_heads * head_dim multiply-adds, the chunk's own causal attention again
// (rows split over OpenMP threads; each row is computed by one thread, so the result does not
// depend on the thread count).
#ifndef TOKENSELECT_ENGINE_SELECTION_CHUNK_ATTENTION_H_
#define TOKENSELECT_ENGINE_SELECTION_CHUNK_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tokenselect::engine {

// What a policy sees of one forward step's new tokens (one layer).
struct ChunkObservation {
  int64_t layer = 0;
  int64_t first_token = 0;  // N: the chunk is tokens [N, N + num_new)
  int64_t num_new = 0;
  const float* q = nullptr;  // [num_new, num_heads, head_dim], un-rotated
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  const float* k_cache = nullptr;  // [num_slots, num_kv_heads, head_dim], un-rotated
  const int32_t* slots = nullptr;  // [num_new]: slots of the chunk's tokens
  int64_t num_slots = 0;
  const int32_t* positions = nullptr;  // [num_new]: true positions
  const float* inv_freq = nullptr;     // [head_dim / 2]
  float scale = 0.0f;                  // attention scale, 1 / sqrt(head_dim) for the models here
};

// OK when pointers are non-null, sizes >= 1, head_dim even, num_heads a multiple of
// num_kv_heads, slots within [0, num_slots) and scale finite > 0; InvalidArgument otherwise.
absl::Status ValidateChunkObservation(const ChunkObservation& chunk);

// a: resized to [c, c], row-major, as defined above. The chunk must be valid.
void ChunkAttentionMap(const ChunkObservation& chunk, std::vector<float>* a);

// received: resized to [c]; received[j] = sum_{i >= j} a[i * c + j].
void ReceivedAttention(const std::vector<float>& a, int64_t c, std::vector<float>* received);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CHUNK_ATTENTION_H_
