// Deterministic top-k of a score array: the order is "higher score first, then lower index",
// so ties always go to the lower index and the result never depends on the platform's
// nth_element. NaN scores rank below every number, -inf included (among NaNs, lower index
// first).
//
// Cost: one copy of the scores, one std::nth_element (O(n) on average) to find the k-th best
// value, and one scan that emits the winners in ascending index order. Fine for n up to a few
// million per call.
#ifndef TOKENSELECT_ENGINE_SELECTION_TOP_K_H_
#define TOKENSELECT_ENGINE_SELECTION_TOP_K_H_

#include <cstdint>
#include <vector>

namespace tokenselect::engine {

// Writes to `out` (cleared first) the indices, in ascending order, of the min(k, n) best of
// scores[0, n). `scratch` (may be null) is reused for the copy of the scores. n, k >= 0
// (checked).
void TopKByScore(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out,
                 std::vector<float>* scratch = nullptr);

// Like TopKByScore over the subset `indices` (ascending, each in the score arrays' range):
// the order is higher primary[i] first, then higher secondary[i], then lower index. Writes the
// min(k, |indices|) winners to `out` in ascending order. Used by the head vote (vote count,
// then summed logits). primary must not be NaN (checked); a NaN secondary ranks lowest.
void TopKByTwoScores(const std::vector<int32_t>& indices, const float* primary,
                     const float* secondary, int64_t k, std::vector<int32_t>* out,
                     std::vector<float>* scratch = nullptr);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_TOP_K_H_
