#include "engine/selection/selection_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tokenselect::engine {
namespace {

constexpr SelectionPolicyKind kAllPolicies[] = {
    SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
    SelectionPolicyKind::kHeadVote,    SelectionPolicyKind::kDense,
    SelectionPolicyKind::kStreaming,
};

constexpr absl::string_view kValidPolicyNames = "tokenselect, topk, head_vote, dense, streaming";

absl::Status CheckCount(absl::string_view field, int64_t value, int64_t min) {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.", field, " must be >= ", min, ", got ", value));
  }
  if (value > kMaxSelectionTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.", field, " must be <= ", kMaxSelectionTokens, ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view PolicyName(SelectionPolicyKind kind) {
  switch (kind) {
    case SelectionPolicyKind::kTokenSelect:
      return "tokenselect";
    case SelectionPolicyKind::kTopK:
      return "topk";
    case SelectionPolicyKind::kHeadVote:
      return "head_vote";
    case SelectionPolicyKind::kDense:
      return "dense";
    case SelectionPolicyKind::kStreaming:
      return "streaming";
  }
  return "unknown";
}

absl::StatusOr<SelectionPolicyKind> ParsePolicy(absl::string_view name) {
  for (SelectionPolicyKind kind : kAllPolicies) {
    if (PolicyName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("selection.policy: unknown policy \"", name,
                                                 "\" (valid: ", kValidPolicyNames, ")"));
}

absl::Status ValidateSelectionOptions(const SelectionOptions& options) {
  if (PolicyName(options.policy) == "unknown") {
    return absl::InvalidArgumentError(absl::StrCat("selection.policy has no valid value (",
                                                   static_cast<int>(options.policy),
                                                   "); valid: ", kValidPolicyNames));
  }
  if (absl::Status s = CheckCount("n_init", options.n_init, 0); !s.ok()) return s;
  if (absl::Status s = CheckCount("k", options.k, 0); !s.ok()) return s;
  if (absl::Status s = CheckCount("n_local", options.n_local, 0); !s.ok()) return s;
  // Each term is <= 2^31 - 1, so the sum cannot overflow int64.
  const int64_t budget = options.n_init + options.k + options.n_local;
  if (budget > kMaxSelectionTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "selection.n_init + selection.k + selection.n_local must be <= ", kMaxSelectionTokens,
        ", got ", budget));
  }
  if (!std::isfinite(options.theta) || options.theta < -1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "selection.theta must be finite and >= -1 (a value > 1 disables the selection cache), "
        "got ",
        options.theta));
  }
  if (absl::Status s = CheckCount("chunk_size", options.chunk_size, 1); !s.ok()) return s;
  if (!std::isfinite(options.scale) || options.scale <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.scale must be finite and > 0, got ", options.scale));
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
