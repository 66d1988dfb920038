// quest: Quest (Tang et al.) in the same engine (docs/DESIGN.md section 4, docs/selection.md).
//
// Select over N cached tokens: the candidates [n_init, N - n_local) are cut into pages of
// baselines.quest_page_size tokens from n_init (the last page may be shorter). Per page and KV
// head, the per-channel minimum and maximum of its un-rotated keys bound every key of the page;
// the page's upper-bound score is
//   sum_h sum_i scale * max(q_h,i * min_i, q_h,i * max_i)   (KV head h / g).
// Pages best first (higher bound, then lower page) are taken while they fit into k tokens (a
// page that does not fit is skipped, so a short last page may fill the rest), plus the init and
// local windows. Stateless: this CPU reference recomputes the page bounds each call (a paged
// implementation keeps them with the pages); num_candidates_scored counts the pages.
#ifndef TOKENSELECT_ENGINE_SELECTION_QUEST_POLICY_H_
#define TOKENSELECT_ENGINE_SELECTION_QUEST_POLICY_H_

#include <memory>

#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

std::unique_ptr<SelectionPolicy> CreateQuestPolicy(const SelectionOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_QUEST_POLICY_H_
