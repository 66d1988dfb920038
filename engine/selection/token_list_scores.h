// Scores of the selection query against an arbitrary list of cached tokens, for the policies
// that score a subset (span index, InfLLM representatives, cascade): the key_scores.h dot
// product (query head h uses KV head h / g) over keys.slots[tokens[i]].
#ifndef TOKENSELECT_ENGINE_SELECTION_TOKEN_LIST_SCORES_H_
#define TOKENSELECT_ENGINE_SELECTION_TOKEN_LIST_SCORES_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/selection/key_scores.h"

namespace tokenselect::engine {

// logits: resized to [num_heads, tokens.size()]; logits[h * m + i] = scale * q_h .
// K[slot(tokens[i]), h / g]. Tokens in [0, keys.num_tokens) (checked).
void ScoreTokenList(const float* query, int64_t num_heads, const KeyCacheView& keys,
                    absl::Span<const int32_t> tokens, float scale, std::vector<float>* logits,
                    std::vector<int32_t>* slot_scratch);

// sum_h max_i scale * q_h . K[slot(tokens[i]), h / g]: a group of tokens scored by its best
// key per head. tokens non-empty (checked).
double SumOfHeadMaxima(const float* query, int64_t num_heads, const KeyCacheView& keys,
                       absl::Span<const int32_t> tokens, float scale);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_TOKEN_LIST_SCORES_H_
