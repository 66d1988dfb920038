// Repetition, frequency and presence penalties, applied sparsely: only ids that occur in the
// prompt or the generated ids are touched, so a step costs O(distinct ids seen), not O(vocab) and
// not O(prompt length) (prompts reach 1M tokens).
//
// The state is incremental: the prompt is absorbed once and generated ids as they are appended.
// Sync() relies on the request's ids being append-only (the prompt never changes, generated ids
// only grow); if the prompt length changes or the generated ids shrink it rebuilds from scratch.
#ifndef TOKENSELECT_ENGINE_SAMPLING_PENALTIES_H_
#define TOKENSELECT_ENGINE_SAMPLING_PENALTIES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sampling/sampling_params.h"

namespace tokenselect::engine {

class PenaltyState {
 public:
  // `params` should have passed Validate(params, vocab_size).
  PenaltyState(const SamplingParams& params, int vocab_size);

  // False when every penalty is neutral; Sync() and Apply() then do nothing.
  bool active() const { return active_; }

  // Brings the state up to date with the request's ids (see the file comment). Returns
  // InvalidArgument naming the position if an id is outside [0, vocab_size); the state is then
  // cleared and rebuilt on the next call.
  absl::Status Sync(absl::Span<const int32_t> prompt_ids, absl::Span<const int32_t> generated_ids);

  // Applies the penalties to `logits` ([vocab_size], raw model output) in place, in vLLM's order:
  // repetition over prompt + generated ids (positive / penalty, negative * penalty), then
  // - frequency_penalty * count - presence_penalty * (count > 0) over generated ids. -inf stays
  // -inf; finite results are clamped to the finite float range.
  void Apply(absl::Span<float> logits) const;

 private:
  void Clear();
  void Touch(int32_t id);

  float repetition_penalty_;
  float frequency_penalty_;
  float presence_penalty_;
  int vocab_size_;
  bool active_;
  bool use_prompt_;  // only the repetition penalty looks at the prompt

  bool valid_ = true;  // false after an invalid id: rebuild on the next Sync()
  size_t prompt_absorbed_ = 0;
  size_t generated_absorbed_ = 0;
  std::vector<bool> touched_mask_;                // [vocab_size] once the first id arrives
  std::vector<int32_t> touched_;                  // distinct ids of prompt + generated
  absl::flat_hash_map<int32_t, int32_t> counts_;  // generated id -> occurrences
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_PENALTIES_H_
