// cascade: the Cascading KV cache (Willette et al.) in the same engine (docs/DESIGN.md section
// 4, docs/selection.md). Our KV cache keeps every token; the policy selects exactly the tokens a
// cascading cache of the same size would still hold:
//   n_init sinks + a CascadeCache (cascade_cache.h) of k + n_local slots in
//   baselines.cascade_sub_caches equal sub-caches,
// so it attends n_init + k + n_local cached tokens like every policy at equal budget.
//
// EMA attention score (the statistic the boundary rule compares): at every Select the step's
// selection query is scored against the tokens the cache holds plus the tokens cached since the
// last Select, and the soft vote (soft_vote.h: per-head softmax over that set, summed over
// heads) is the step's attention p_t[j]. A held token's score becomes
// ema = decay * ema + (1 - decay) * p_t[j] (baselines.cascade_ema_decay); a new token starts at
// ema = p_t[j]. Then the new tokens are pushed, oldest first. So every token is scored at least
// once before it can meet a boundary.
//
// The cache lives in the layer state and is advanced lazily: while n_init + k + n_local >= N
// everything is selected and nothing is read; the first Select beyond the budget pushes every
// token [n_init, N). A cache length below what was pushed (a rollback) restarts it.
#ifndef TOKENSELECT_ENGINE_SELECTION_CASCADE_POLICY_H_
#define TOKENSELECT_ENGINE_SELECTION_CASCADE_POLICY_H_

#include <memory>

#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

std::unique_ptr<SelectionPolicy> CreateCascadePolicy(const SelectionOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CASCADE_POLICY_H_
