// The token set one attention step attends to (docs/DESIGN.md section 4), over the request's N
// cached tokens [0, N):
//   [0, n_init)  +  picks from the candidates [n_init, N - n_local)  +  [N - n_local, N)
// in ascending token order, without duplicates; when n_init + k + n_local >= N every token is
// selected (full attention). The current chunk is not part of it: it is appended by
// attention_list.h.
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTED_SET_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTED_SET_H_

#include <cstdint>
#include <vector>

#include "engine/selection/selection_options.h"

namespace tokenselect::engine {

struct SelectionResult {
  // Selected token indices in [0, N): ascending, unique.
  std::vector<int32_t> tokens;
  // The top-k part of `tokens` (ascending; token indices, not candidate offsets): what the
  // selection cache stores and reuses. Empty for dense, streaming and full attention.
  std::vector<int32_t> picks;
  // Every cached token is selected (dense policy, or the budget covers N).
  bool full_attention = false;
  // Candidates whose scores were computed this call: N - n_init - n_local when a scoring policy
  // ran (0 when k == 0), 0 for dense, streaming, full attention and selection-cache hits.
  int64_t num_candidates_scored = 0;
};

// n_init + k + n_local >= num_tokens: the budget covers every cached token.
bool BudgetCoversAll(const SelectionOptions& options, int64_t num_tokens);

// out->tokens = [0, n_init) + picks + [N - n_local, N) for N = num_tokens (both windows clipped
// to [0, N)); picks must be ascending (checked); picks outside [n_init, N - n_local) are
// skipped, since the windows either contain them or they are beyond N. Sets out->picks to the
// picks kept, full_attention to whether every token ended up selected, and leaves
// num_candidates_scored alone.
void AssembleSelection(int64_t num_tokens, int64_t n_init, int64_t n_local,
                       const std::vector<int32_t>& picks, SelectionResult* out);

// out = every token [0, num_tokens), full_attention = true, no picks, nothing scored.
void SelectAll(int64_t num_tokens, SelectionResult* out);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTED_SET_H_
