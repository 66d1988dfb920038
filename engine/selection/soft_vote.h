// The reductions that turn per-head candidate logits s[h, j] (key_scores.h) into one vote per
// candidate token:
//   SoftVote      TokenSelect: p[h, :] = softmax_j s[h, :], vote[j] = sum_h p[h, j]
//   SumOverHeads  the top-k ablation: vote[j] = sum_h s[h, j]
// Both votes are sums over heads, so with tensor parallelism (heads sharded over ranks) the
// per-rank votes add up (all-reduce) to the single-rank result.
//
// Heads are always summed in order h = 0, 1, ..., so two tokens with identical logit columns get
// bitwise-identical votes and their tie is broken by index (top_k.h), on any thread count.
#ifndef TOKENSELECT_ENGINE_SELECTION_SOFT_VOTE_H_
#define TOKENSELECT_ENGINE_SELECTION_SOFT_VOTE_H_

#include <cstdint>

namespace tokenselect::engine {

// logits: [num_heads, n], overwritten with exp(s[h, j] - max_j s[h, :]); votes: [n]. The
// softmax normaliser of each head is summed in double. n >= 1, num_heads >= 1 (checked).
void SoftVote(float* logits, int64_t num_heads, int64_t n, float* votes);

// votes[j] = sum_h logits[h, j]. logits: [num_heads, n]; votes: [n].
void SumOverHeads(const float* logits, int64_t num_heads, int64_t n, float* votes);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SOFT_VOTE_H_
