// Scores of the selection query against the request's cached (un-rotated) keys:
//   s[h, j] = scale * q[h, :] . K[slot(j), h / g, :],  g = num_heads / num_kv_heads
// (docs/DESIGN.md section 4: query head h uses KV head h / g, not h % num_kv_heads).
//
// Memory access: tokens are scanned in order; each token's slot row [num_kv_heads, head_dim] is
// read once, and each of its KV-head keys is used by all g query heads of that group while it is
// in cache. The scan is split over OpenMP threads by token range when the work is large; every
// output element is computed by one thread in a fixed order, so results do not depend on the
// thread count.
#ifndef TOKENSELECT_ENGINE_SELECTION_KEY_SCORES_H_
#define TOKENSELECT_ENGINE_SELECTION_KEY_SCORES_H_

#include <cstdint>

namespace tokenselect::engine {

// One layer's key cache as seen by one request.
struct KeyCacheView {
  const float* k_cache = nullptr;  // [num_slots, num_kv_heads, head_dim], un-rotated
  const int32_t* slots = nullptr;  // [num_tokens]: cache slot of token j (TokenTable::Slots)
  int64_t num_tokens = 0;          // N: the request's cached tokens [0, N)
  int64_t num_slots = 0;           // rows of k_cache; every slot must be in [0, num_slots)
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// Writes logits[h * n + (j - begin)] = scale * query[h, :] . K[keys.slots[j], h / g, :] for the
// tokens j in [begin, end), n = end - begin. query: [num_heads, head_dim]; logits: [num_heads,
// n]. Shapes and slots must already be valid (SelectionPolicy::Select checks them); 0 <= begin
// <= end <= keys.num_tokens and num_heads % keys.num_kv_heads == 0 are checked.
void ScoreCandidates(const float* query, int64_t num_heads, const KeyCacheView& keys, int64_t begin,
                     int64_t end, float scale, float* logits);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_KEY_SCORES_H_
