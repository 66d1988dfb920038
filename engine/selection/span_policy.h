// tokenselect_span: TokenSelect over the span index (Ltri-LLM; docs/DESIGN.md section 4).
//
// ObserveChunk (every forward step): the chunk's causal attention map A (chunk_attention.h)
// -> DetectSpans (span_detection.h, lambda by layer) -> appended to the layer's SpanIndex
// (layer_state.h); also the chunk's received attention. A one-token step (decode) becomes a
// one-token span whose index vector is its own key.
//
// Select over N cached tokens, candidates [n_init, N - n_local):
//   1. Every span that meets the candidates gets the score sum_h max_v q_h . K[v, h / g] over
//      its index tokens v (token_list_scores.h: the per-head best index vector, summed over
//      heads; max, not mean, so one strongly matching vector is enough to recall a span).
//   2. Spans best first (higher score, then lower begin) are kept while their candidate tokens
//      (the span clipped to the candidates) fit into SpanTokenBudget(options) (default 4 k);
//      a span that does not fit is skipped and the next one tried. Candidate tokens that no
//      span covers (at or after the index's covered_end) or that are in a span without index
//      vectors (tokens the index never observed) are always kept.
//   3. The exact soft vote (soft_vote.h) over the kept tokens only, top-k, plus the init and
//      local windows (all kept tokens when there are at most k).
// num_candidates_scored counts the index vectors and the kept tokens scored.
#ifndef TOKENSELECT_ENGINE_SELECTION_SPAN_POLICY_H_
#define TOKENSELECT_ENGINE_SELECTION_SPAN_POLICY_H_

#include <memory>

#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

// options must be valid (CreateSelectionPolicy checks them).
std::unique_ptr<SelectionPolicy> CreateSpanPolicy(const SelectionOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SPAN_POLICY_H_
