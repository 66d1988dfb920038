// Hard head vote (ablation of TokenSelect's soft vote): every query head picks its own top-k
// candidates by its logits s[h, :] (ties: lower index) and gives each one vote; the selected
// tokens are the k candidates with the most votes. Ties in the vote count are broken by the
// higher head-summed logit sum_h s[h, j], then by the lower index.
//
// Counts and summed logits are both sums over heads, so with tensor parallelism they can be
// all-reduced across head shards before the final pick.
#ifndef TOKENSELECT_ENGINE_SELECTION_HEAD_VOTE_H_
#define TOKENSELECT_ENGINE_SELECTION_HEAD_VOTE_H_

#include <cstdint>
#include <vector>

namespace tokenselect::engine {

// Reusable buffers (all optional state; contents are meaningless between calls).
struct HeadVoteScratch {
  std::vector<float> counts;        // [n] votes per candidate (exact small integers)
  std::vector<float> summed;        // [n] sum_h s[h, j]
  std::vector<float> values;        // top-k scratch
  std::vector<int32_t> head_picks;  // one head's top-k
  std::vector<int32_t> voted;       // candidates with at least one vote
};

// logits: [num_heads, n]. Writes the min(k, n) winners (candidate indices in [0, n)) to `out`
// in ascending order. n, k >= 0 and num_heads >= 1 (checked).
void HeadVote(const float* logits, int64_t num_heads, int64_t n, int64_t k,
              std::vector<int32_t>* out, HeadVoteScratch* scratch = nullptr);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_HEAD_VOTE_H_
