#include "engine/selection/selected_set.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace tokenselect::engine {

bool BudgetCoversAll(const SelectionOptions& options, int64_t num_tokens) {
  return options.n_init + options.k + options.n_local >= num_tokens;
}

void AssembleSelection(int64_t num_tokens, int64_t n_init, int64_t n_local,
                       const std::vector<int32_t>& picks, SelectionResult* out) {
  TS_CHECK(num_tokens >= 0 && n_init >= 0 && n_local >= 0, "AssembleSelection(N={}, {}, {})",
           num_tokens, n_init, n_local);
  TS_CHECK(std::is_sorted(picks.begin(), picks.end()), "AssembleSelection: picks not sorted");
  const int64_t init_end = std::min(n_init, num_tokens);
  const int64_t local_begin = std::max(init_end, num_tokens - n_local);
  std::vector<int32_t> kept;
  kept.reserve(picks.size());
  for (int32_t p : picks) {
    if (p >= init_end && p < local_begin && (kept.empty() || kept.back() != p)) kept.push_back(p);
  }
  std::vector<int32_t>& tokens = out->tokens;
  tokens.clear();
  tokens.reserve(static_cast<size_t>(init_end + (num_tokens - local_begin)) + kept.size());
  for (int64_t i = 0; i < init_end; ++i) tokens.push_back(static_cast<int32_t>(i));
  tokens.insert(tokens.end(), kept.begin(), kept.end());
  for (int64_t i = local_begin; i < num_tokens; ++i) tokens.push_back(static_cast<int32_t>(i));
  out->full_attention = static_cast<int64_t>(tokens.size()) == num_tokens;
  out->picks = std::move(kept);
}

void SelectAll(int64_t num_tokens, SelectionResult* out) {
  out->tokens.resize(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) out->tokens[i] = static_cast<int32_t>(i);
  out->picks.clear();
  out->full_attention = true;
  out->num_candidates_scored = 0;
}

}  // namespace tokenselect::engine
