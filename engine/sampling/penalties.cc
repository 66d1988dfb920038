#include "engine/sampling/penalties.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tokenselect::engine {
namespace {

absl::Status BadId(absl::string_view which, size_t index, int32_t id, int vocab_size) {
  return absl::InvalidArgumentError(
      absl::StrCat(which, "[", index, "] = ", id, " is not a token id in [0, ", vocab_size, ")"));
}

// A finite logit scaled by a tiny repetition penalty can overflow; keep it finite so that later
// steps (max subtraction) never see inf - inf.
float ClampFinite(double x) {
  constexpr double kMax = std::numeric_limits<float>::max();
  return static_cast<float>(std::clamp(x, -kMax, kMax));
}

}  // namespace

PenaltyState::PenaltyState(const SamplingParams& params, int vocab_size)
    : repetition_penalty_(params.repetition_penalty),
      frequency_penalty_(params.frequency_penalty),
      presence_penalty_(params.presence_penalty),
      vocab_size_(vocab_size),
      active_(HasPenalties(params)),
      use_prompt_(params.repetition_penalty != 1.0f) {}

void PenaltyState::Clear() {
  for (int32_t id : touched_) touched_mask_[id] = false;
  touched_.clear();
  counts_.clear();
  prompt_absorbed_ = 0;
  generated_absorbed_ = 0;
  valid_ = true;
}

void PenaltyState::Touch(int32_t id) {
  if (touched_mask_.empty()) touched_mask_.assign(vocab_size_, false);
  if (!touched_mask_[id]) {
    touched_mask_[id] = true;
    touched_.push_back(id);
  }
}

absl::Status PenaltyState::Sync(absl::Span<const int32_t> prompt_ids,
                                absl::Span<const int32_t> generated_ids) {
  if (!active_) return absl::OkStatus();
  const size_t prompt_size = use_prompt_ ? prompt_ids.size() : 0;
  if (!valid_ || prompt_size != prompt_absorbed_ || generated_ids.size() < generated_absorbed_) {
    Clear();
  }
  for (size_t i = prompt_absorbed_; i < prompt_size; ++i) {
    const int32_t id = prompt_ids[i];
    if (id < 0 || id >= vocab_size_) {
      valid_ = false;
      return BadId("prompt_ids", i, id, vocab_size_);
    }
    Touch(id);
  }
  prompt_absorbed_ = prompt_size;
  for (size_t i = generated_absorbed_; i < generated_ids.size(); ++i) {
    const int32_t id = generated_ids[i];
    if (id < 0 || id >= vocab_size_) {
      valid_ = false;
      return BadId("generated_ids", i, id, vocab_size_);
    }
    Touch(id);
    ++counts_[id];
  }
  generated_absorbed_ = generated_ids.size();
  return absl::OkStatus();
}

void PenaltyState::Apply(absl::Span<float> logits) const {
  if (!active_) return;
  if (use_prompt_) {
    const double r = repetition_penalty_;
    for (int32_t id : touched_) {
      const double x = logits[id];
      if (std::isinf(x)) continue;  // -inf (a masked token) stays masked
      logits[id] = ClampFinite(x > 0 ? x / r : x * r);
    }
  }
  if (frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f) {
    for (const auto& [id, count] : counts_) {
      const double x = logits[id];
      if (std::isinf(x)) continue;
      logits[id] = ClampFinite(x - static_cast<double>(frequency_penalty_) * count -
                               static_cast<double>(presence_penalty_));
    }
  }
}

}  // namespace tokenselect::engine
