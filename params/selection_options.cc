#include "params/selection_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tokenselect::params {
namespace {

constexpr SelectionPolicyKind kAllPolicies[] = {
    SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
    SelectionPolicyKind::kHeadVote,    SelectionPolicyKind::kDense,
    SelectionPolicyKind::kStreaming,   SelectionPolicyKind::kTokenSelectSpan,
    SelectionPolicyKind::kInfLlm,      SelectionPolicyKind::kQuest,
    SelectionPolicyKind::kCascade,
};

constexpr absl::string_view kValidPolicyNames =
    "tokenselect, topk, head_vote, dense, streaming, tokenselect_span, infllm, quest, cascade";

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

absl::Status CheckRange(absl::string_view field, double value, double min, double max) {
  if (std::isfinite(value) && value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("selection.", field, " must be in [", min, ", ", max, "], got ", value));
}

absl::Status CheckInt(absl::string_view field, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("selection.", field, " must be in [", min, ", ", max, "], got ", value));
}

absl::Status ValidateSpanAndBaselines(const SelectionOptions& options) {
  const SpanOptions& span = options.span;
  RETURN_IF_ERROR(CheckRange("span.threshold_percentile", span.threshold_percentile, 0, 100));
  RETURN_IF_ERROR(CheckRange("span.nms_iou", span.nms_iou, 0, 1));
  RETURN_IF_ERROR(CheckInt("span.max_vectors", span.max_vectors, 1, 4096));
  RETURN_IF_ERROR(CheckInt("span.min_vectors", span.min_vectors, 1, span.max_vectors));
  RETURN_IF_ERROR(CheckRange("span.lambda", span.lambda, 0, 1e6));
  RETURN_IF_ERROR(CheckRange("span.lambda_early", span.lambda_early, 0, 1e6));
  RETURN_IF_ERROR(CheckInt("span.early_layers", span.early_layers, 0, kMaxSelectionTokens));
  RETURN_IF_ERROR(CheckInt("span.token_budget", span.token_budget, 0, kMaxSelectionTokens));
  const BaselineOptions& b = options.baselines;
  RETURN_IF_ERROR(CheckInt("baselines.infllm_block_size", b.infllm_block_size, 1, 1 << 20));
  RETURN_IF_ERROR(
      CheckInt("baselines.infllm_representatives", b.infllm_representatives, 1, 1 << 20));
  RETURN_IF_ERROR(CheckInt("baselines.quest_page_size", b.quest_page_size, 1, 1 << 20));
  RETURN_IF_ERROR(CheckInt("baselines.cascade_sub_caches", b.cascade_sub_caches, 1, 30));
  if (!std::isfinite(b.cascade_ema_decay) || b.cascade_ema_decay < 0 || b.cascade_ema_decay >= 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "selection.baselines.cascade_ema_decay must be in [0, 1), got ", b.cascade_ema_decay));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SpanTokenBudget(const SelectionOptions& options) {
  if (options.span.token_budget > 0) return options.span.token_budget;
  return std::min<int64_t>(4 * options.k, kMaxSelectionTokens);
}

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
    case SelectionPolicyKind::kTokenSelectSpan:
      return "tokenselect_span";
    case SelectionPolicyKind::kInfLlm:
      return "infllm";
    case SelectionPolicyKind::kQuest:
      return "quest";
    case SelectionPolicyKind::kCascade:
      return "cascade";
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
  return ValidateSpanAndBaselines(options);
}

}  // namespace tokenselect::params
