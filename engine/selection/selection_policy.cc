#include "engine/selection/selection_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/selection/cascade_policy.h"
#include "engine/selection/infllm_policy.h"
#include "engine/selection/quest_policy.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/span_policy.h"
#include "engine/selection/top_k.h"

namespace tokenselect::engine {
namespace {

absl::Status CheckPositive(absl::string_view field, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("selection input: ", field, " must be >= 1, got ", value));
}

absl::Status CheckNumTokens(int64_t num_tokens) {
  if (num_tokens >= 0 && num_tokens <= kMaxSelectionTokens) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("selection input: keys.num_tokens must be in [0, ",
                                                 kMaxSelectionTokens, "], got ", num_tokens));
}

// Shared by the three scoring policies: candidates [n_init, N - n_local) are scored and reduced
// to votes by PickCandidates, which returns candidate offsets in ascending order.
class ScoringPolicy : public SelectionPolicy {
 public:
  explicit ScoringPolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const final { return true; }

 protected:
  // logits: [num_heads, n] (may be overwritten); picks: min(k, n) offsets in [0, n), ascending.
  virtual void PickCandidates(float* logits, int64_t num_heads, int64_t n, int64_t k,
                              SelectionScratch* scratch, std::vector<int32_t>* picks) const = 0;

  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const final {
    const SelectionOptions& opt = options();
    const int64_t num_tokens = input.keys.num_tokens;
    const int64_t begin = opt.n_init;
    const int64_t end = num_tokens - opt.n_local;  // > begin + k: the budget is below N
    const int64_t n = end - begin;
    std::vector<int32_t>& picks = scratch->picks;
    picks.clear();
    out->num_candidates_scored = 0;
    if (opt.k > 0) {
      scratch->logits.resize(static_cast<size_t>(input.num_heads * n));
      ScoreCandidates(input.query, input.num_heads, input.keys, begin, end, opt.scale,
                      scratch->logits.data());
      PickCandidates(scratch->logits.data(), input.num_heads, n, opt.k, scratch, &picks);
      for (int32_t& p : picks) p += static_cast<int32_t>(begin);
      out->num_candidates_scored = n;
    }
    AssembleSelection(num_tokens, opt.n_init, opt.n_local, picks, out);
  }
};

class TokenSelectPolicy final : public ScoringPolicy {
 public:
  explicit TokenSelectPolicy(const SelectionOptions& options) : ScoringPolicy(options) {}

 protected:
  void PickCandidates(float* logits, int64_t num_heads, int64_t n, int64_t k,
                      SelectionScratch* scratch, std::vector<int32_t>* picks) const override {
    scratch->votes.resize(static_cast<size_t>(n));
    SoftVote(logits, num_heads, n, scratch->votes.data());
    TopKByScore(scratch->votes.data(), n, k, picks, &scratch->values);
  }
};

class TopKPolicy final : public ScoringPolicy {
 public:
  explicit TopKPolicy(const SelectionOptions& options) : ScoringPolicy(options) {}

 protected:
  void PickCandidates(float* logits, int64_t num_heads, int64_t n, int64_t k,
                      SelectionScratch* scratch, std::vector<int32_t>* picks) const override {
    scratch->votes.resize(static_cast<size_t>(n));
    SumOverHeads(logits, num_heads, n, scratch->votes.data());
    TopKByScore(scratch->votes.data(), n, k, picks, &scratch->values);
  }
};

class HeadVotePolicy final : public ScoringPolicy {
 public:
  explicit HeadVotePolicy(const SelectionOptions& options) : ScoringPolicy(options) {}

 protected:
  void PickCandidates(float* logits, int64_t num_heads, int64_t n, int64_t k,
                      SelectionScratch* scratch, std::vector<int32_t>* picks) const override {
    HeadVote(logits, num_heads, n, k, picks, &scratch->head_vote);
  }
};

class DensePolicy final : public SelectionPolicy {
 public:
  explicit DensePolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return false; }

 protected:
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    SelectAll(input.keys.num_tokens, out);
  }
};

class StreamingPolicy final : public SelectionPolicy {
 public:
  explicit StreamingPolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return false; }

 protected:
  // At equal budget the recent window is k + n_local tokens.
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    const SelectionOptions& opt = options();
    const int64_t num_tokens = input.keys.num_tokens;
    if (BudgetCoversAll(opt, num_tokens)) {
      SelectAll(num_tokens, out);
      return;
    }
    AssembleSelection(num_tokens, opt.n_init, opt.k + opt.n_local, {}, out);
    out->num_candidates_scored = 0;
  }
};

}  // namespace

absl::Status ValidateSelectionInput(const SelectionInput& input, bool check_slots) {
  const KeyCacheView& keys = input.keys;
  RETURN_IF_ERROR(CheckNumTokens(keys.num_tokens));
  if (input.query == nullptr) {
    return absl::InvalidArgumentError("selection input: query is null");
  }
  if (keys.k_cache == nullptr) {
    return absl::InvalidArgumentError("selection input: keys.k_cache is null");
  }
  if (keys.slots == nullptr) {
    return absl::InvalidArgumentError("selection input: keys.slots is null");
  }
  RETURN_IF_ERROR(CheckPositive("num_heads", input.num_heads));
  RETURN_IF_ERROR(CheckPositive("keys.num_kv_heads", keys.num_kv_heads));
  RETURN_IF_ERROR(CheckPositive("keys.head_dim", keys.head_dim));
  RETURN_IF_ERROR(CheckPositive("keys.num_slots", keys.num_slots));
  if (input.num_heads % keys.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("selection input: num_heads (", input.num_heads,
                                                   ") must be a multiple of keys.num_kv_heads (",
                                                   keys.num_kv_heads, ")"));
  }
  for (int64_t j = 0; check_slots && j < keys.num_tokens; ++j) {
    const int32_t slot = keys.slots[j];
    if (slot < 0 || slot >= keys.num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("selection input: keys.slots[", j,
                                                     "] = ", slot, " is outside [0, ",
                                                     keys.num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status SelectionPolicy::ObserveChunk(const ChunkObservation& chunk,
                                           SelectionLayerState* state) const {
  return absl::OkStatus();
}

absl::Status SelectionPolicy::Select(const SelectionInput& input, SelectionResult* out,
                                     SelectionScratch* scratch) const {
  RETURN_IF_ERROR(CheckNumTokens(input.keys.num_tokens));
  if (scores_keys()) {
    if (BudgetCoversAll(options_, input.keys.num_tokens)) {
      SelectAll(input.keys.num_tokens, out);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ValidateSelectionInput(input));
  }
  if (needs_state() && input.state == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "selection policy ", PolicyName(kind()), " needs per-layer state (input.state is null)"));
  }
  SelectionScratch local;
  DoSelect(input, scratch != nullptr ? scratch : &local, out);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreateSelectionPolicy(
    const SelectionOptions& options) {
  RETURN_IF_ERROR(ValidateSelectionOptions(options));
  switch (options.policy) {
    case SelectionPolicyKind::kTokenSelect:
      return std::unique_ptr<SelectionPolicy>(new TokenSelectPolicy(options));
    case SelectionPolicyKind::kTopK:
      return std::unique_ptr<SelectionPolicy>(new TopKPolicy(options));
    case SelectionPolicyKind::kHeadVote:
      return std::unique_ptr<SelectionPolicy>(new HeadVotePolicy(options));
    case SelectionPolicyKind::kDense:
      return std::unique_ptr<SelectionPolicy>(new DensePolicy(options));
    case SelectionPolicyKind::kStreaming:
      return std::unique_ptr<SelectionPolicy>(new StreamingPolicy(options));
    case SelectionPolicyKind::kTokenSelectSpan:
      return CreateSpanPolicy(options);
    case SelectionPolicyKind::kInfLlm:
      return CreateInfLlmPolicy(options);
    case SelectionPolicyKind::kQuest:
      return CreateQuestPolicy(options);
    case SelectionPolicyKind::kCascade:
      return CreateCascadePolicy(options);
  }
  return absl::InvalidArgumentError("selection.policy has no valid value");
}

}  // namespace tokenselect::engine
