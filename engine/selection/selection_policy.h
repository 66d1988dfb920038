// SelectionPolicy: picks, for one layer of one request, the cached tokens an attention step
// attends to (docs/DESIGN.md section 4). The model's attention step calls Select once per layer:
// in prefill once per chunk with the chunk's mean selection query, in decode once per step
// (usually through SelectionCache). Attention then runs over the selected tokens plus the
// current chunk with compact positions (attention_list.h).
//
// Policies (selection_options.h), over N cached tokens with budget (n_init, k, n_local):
//   tokenselect, topk, head_vote  score the candidates [n_init, N - n_local) against the query
//        (key_scores.h), reduce to one vote per candidate (soft_vote.h, head_vote.h), keep the
//        top k (higher vote first, then lower token index), and return [0, n_init) + picks +
//        [N - n_local, N). If n_init + k + n_local >= N they select everything without reading
//        any key.
//   dense      every token [0, N).
//   streaming  [0, n_init) + the last k + n_local tokens (everything when that covers N).
//   tokenselect_span, infllm, quest, cascade  span_policy.h, infllm_policy.h, quest_policy.h,
//        cascade_policy.h; like the scoring policies they select everything without reading
//        any key when n_init + k + n_local >= N.
//
// Select is const and thread-safe; pass a SelectionScratch per thread to reuse the O(H * N)
// score buffer across calls instead of allocating it each time.
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTION_POLICY_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/selection/head_vote.h"
#include "engine/selection/key_scores.h"
#include "engine/selection/selected_set.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::engine {

struct ChunkObservation;     // chunk_attention.h
struct SelectionLayerState;  // layer_state.h

struct SelectionInput {
  // [num_heads, head_dim]: the selection query of this step (selection_query.h), RoPE applied.
  const float* query = nullptr;
  int64_t num_heads = 0;
  KeyCacheView keys;  // this layer's keys of the request's cached tokens [0, N)
  // This request's and layer's state, for the stateful policies (needs_state()); else unused.
  SelectionLayerState* state = nullptr;
};

// Buffers a caller may keep between Select calls (one per thread).
struct SelectionScratch {
  std::vector<float> logits;  // [num_heads, num_candidates]
  std::vector<float> votes;   // [num_candidates]
  std::vector<float> values;  // top-k copy
  std::vector<int32_t> picks;
  HeadVoteScratch head_vote;
};

// OK when the input can be scored: query, keys.k_cache and keys.slots non-null; num_heads,
// keys.num_kv_heads, keys.head_dim, keys.num_slots >= 1; num_heads a multiple of num_kv_heads;
// 0 <= keys.num_tokens <= kMaxSelectionTokens; and, when check_slots, every slot in
// [0, num_slots) (O(N)). InvalidArgument naming the field otherwise.
absl::Status ValidateSelectionInput(const SelectionInput& input, bool check_slots = true);

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  SelectionPolicy(const SelectionPolicy&) = delete;
  SelectionPolicy& operator=(const SelectionPolicy&) = delete;

  const SelectionOptions& options() const { return options_; }
  SelectionPolicyKind kind() const { return options_.policy; }

  // Whether Select reads keys and the query (every policy but dense and streaming).
  virtual bool scores_keys() const = 0;
  // Whether decode steps go through the selection cache (tokenselect, topk, head_vote,
  // tokenselect_span; the other baselines run as their papers describe, every step).
  virtual bool uses_selection_cache() const { return scores_keys(); }
  // Whether Select needs input.state (tokenselect_span, infllm, cascade).
  virtual bool needs_state() const { return false; }
  // Whether the provider must call ObserveChunk for every forward step's new tokens
  // (tokenselect_span builds its span index there, infllm its received attention).
  virtual bool observes_chunks() const { return false; }
  // Records what the policy needs of the new tokens [chunk.first_token, + num_new) into
  // `state`. InvalidArgument for an invalid chunk (ValidateChunkObservation).
  virtual absl::Status ObserveChunk(const ChunkObservation& chunk,
                                    SelectionLayerState* state) const;

  // Fills `out` (all fields overwritten) for the N = input.keys.num_tokens cached tokens.
  // InvalidArgument when N is outside [0, kMaxSelectionTokens], or when keys are to be read
  // (scoring policy, budget below N) and ValidateSelectionInput fails; `out` is unspecified then.
  // Dense and streaming read nothing but keys.num_tokens. FailedPrecondition when needs_state()
  // and input.state is null.
  absl::Status Select(const SelectionInput& input, SelectionResult* out,
                      SelectionScratch* scratch = nullptr) const;

 protected:
  explicit SelectionPolicy(const SelectionOptions& options) : options_(options) {}

  // Called with a valid input (and, for scoring policies, only when the budget is below N).
  virtual void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                        SelectionResult* out) const = 0;

 private:
  SelectionOptions options_;
};

// The policy named by options.policy. InvalidArgument from ValidateSelectionOptions.
absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreateSelectionPolicy(
    const SelectionOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTION_POLICY_H_
