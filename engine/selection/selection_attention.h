// The forward pass's AttentionListProvider (engine/model/attention_list.h) for every selection
// policy: per layer and step it chooses the attended cached tokens with a SelectionPolicy and
// builds the compact-position list over them plus the new tokens (docs/DESIGN.md section 4):
//   prefill chunk (num_new > 1): the chunk's mean selection query selects among the N cached
//     tokens; the chunk attends to the selected set and causally to itself;
//   decode step (num_new == 1): the step's selection query goes through the per-layer
//     Selection Cache (a hit reuses the cached top-k; the local window still moves).
// When the budget covers the cache (or the policy is dense) the list is every cached token in
// order, whose compact positions are the true positions: exactly dense attention.
// Stateful policies (tokenselect_span, infllm, cascade) get a per-layer SelectionLayerState
// owned here; for policies that observe chunks, every step's new tokens are passed to
// SelectionPolicy::ObserveChunk after the selection (building the span index in prefill).
//
// One per request; not thread-safe (the model calls it from one thread per step).
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTION_ATTENTION_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTION_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/attention_list.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selected_set.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"
#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

// What a request's selection did, summed over layers and steps.
struct SelectionStats {
  int64_t layer_steps = 0;            // Select calls (layers x forward steps)
  int64_t full_attention_steps = 0;   // of which attended every cached token
  int64_t attended_tokens = 0;        // sum of list lengths (cached tokens + new tokens)
  int64_t decode_layer_steps = 0;     // Select calls with one new token
  int64_t decode_attended_tokens = 0; // their list lengths
  int64_t candidates_scored = 0;      // keys read by the policy
  double selection_seconds = 0;       // time in the policy and the selection cache
};

class SelectionAttention : public AttentionListProvider {
 public:
  // InvalidArgument for invalid options (ValidateSelectionOptions) or num_layers < 1.
  static absl::StatusOr<std::unique_ptr<SelectionAttention>> Create(
      const SelectionOptions& options, int64_t num_layers);

  absl::Status Select(const AttentionQuery& query, AttentionList* list) override;

  const SelectionOptions& options() const { return policy_->options(); }
  const SelectionCache& cache() const { return cache_; }
  const SelectionStats& stats() const { return stats_; }
  // The per-layer state of stateful policies (layer in range, checked), e.g. the span index.
  const SelectionLayerState& layer_state(int64_t layer) const;
  // For carrying the state with the KV (layer_state.h SerializeLayerState): a decode worker
  // restores each layer's state before its first step. Layer in range (checked).
  SelectionLayerState* mutable_layer_state(int64_t layer);

 private:
  SelectionAttention(std::unique_ptr<SelectionPolicy> policy, int64_t num_layers);
  absl::Status ObserveChunk(const AttentionQuery& query);

  std::unique_ptr<SelectionPolicy> policy_;
  SelectionCache cache_;
  std::vector<SelectionLayerState> layer_states_;  // [num_layers]
  SelectionStats stats_;
  SelectionScratch scratch_;
  SelectionResult result_;
  std::vector<float> selection_query_;  // [num_heads, head_dim]
  // Slots of the request's tokens [0, N + num_new), built once per step (layer 0).
  std::vector<int32_t> token_slots_;
  int64_t slots_for_length_ = -1;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTION_ATTENTION_H_
