// Per-run settings of KV-cache token selection (docs/DESIGN.md section 4): which policy picks the
// attended tokens, its budget (n_init sinks, k picks, n_local recent tokens), the selection-cache
// threshold theta, the prefill chunk size and the score scale. Plain data and validation, below
// the engine, so that the router validates requests with the same rules as the workers without
// linking engine/ (docs/architecture.md); engine/selection/selection_options.h forwards these
// names into tokenselect::engine. The policies themselves live in engine/selection/.
//
// Policies:
//   tokenselect  (default) TokenSelect: per-head softmax over the candidates, soft vote
//                vote[j] = sum_h p[h, j], top-k of the votes.
//   topk         ablation: top-k of the head-summed logits sum_h s[h, j].
//   head_vote    ablation: every head votes for its own top-k tokens by s[h, :]; top-k of the
//                vote counts (ties: higher summed logits, then lower token index).
//   dense        full attention over every cached token.
//   streaming    StreamingLLM: n_init sinks plus a recent window. At equal budget the window is
//                k + n_local tokens, so every policy attends n_init + k + n_local cached tokens.
//   tokenselect_span  TokenSelect over a span index (Ltri-LLM, engine/selection/span_policy.h):
//                spans scored by their index vectors, the best spans up to span.token_budget
//                tokens, then the exact soft vote over their tokens only.
//   infllm       InfLLM: blocks of baselines.infllm_block_size tokens, representative keys by
//                received attention, top k / block_size blocks (engine/selection/infllm_policy.h).
//   quest        Quest: pages with per-channel min/max keys, upper-bound page score, top pages
//                until k tokens (engine/selection/quest_policy.h).
//   cascade      Cascading KV cache: n_init sinks + sub-caches of k + n_local tokens in total
//                (engine/selection/cascade_policy.h).
#ifndef TOKENSELECT_PARAMS_SELECTION_OPTIONS_H_
#define TOKENSELECT_PARAMS_SELECTION_OPTIONS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::params {

enum class SelectionPolicyKind {
  kTokenSelect = 0,
  kTopK = 1,
  kHeadVote = 2,
  kDense = 3,
  kStreaming = 4,
  kTokenSelectSpan = 5,
  kInfLlm = 6,
  kQuest = 7,
  kCascade = 8,
};

// The largest token index and budget value: token indices and kernel slot lists are int32.
inline constexpr int64_t kMaxSelectionTokens = 2147483647;

// The span index (tokenselect_span; engine/selection/span_detection.h, docs/selection.md).
struct SpanOptions {
  // Threshold subtracted from the chunk's attention map: this percentile of its causal entries.
  double threshold_percentile = 90.0;  // [0, 100]
  double nms_iou = 0.1;                // NMS keeps a span whose 1-D IoU with every kept one is <=
  int64_t min_vectors = 1;             // index vectors per span, [1, max_vectors]
  int64_t max_vectors = 8;
  double lambda = 3.0;         // r_v = exp(-lambda (1 - r_a)), layers >= early_layers
  double lambda_early = 20.0;  // ... layers < early_layers
  int64_t early_layers = 4;
  // Tokens of the best spans passed to the exact soft vote; 0 means 4 * k.
  int64_t token_budget = 0;
};

// The other baselines (docs/selection.md says how they map onto the budget fields).
struct BaselineOptions {
  int64_t infllm_block_size = 128;
  int64_t infllm_representatives = 4;  // representative keys per block
  int64_t quest_page_size = 16;
  int64_t cascade_sub_caches = 4;  // N ring sub-caches sharing k + n_local slots
  double cascade_ema_decay = 0.9;  // ema = decay * ema + (1 - decay) * vote, in [0, 1)
};

struct SelectionOptions {
  SelectionPolicyKind policy = SelectionPolicyKind::kTokenSelect;
  int64_t n_init = 128;   // attention-sink tokens [0, n_init), always attended
  int64_t k = 2048;       // tokens picked from the candidates [n_init, N - n_local)
  int64_t n_local = 512;  // most recent cached tokens [N - n_local, N), always attended
  // Selection cache (decode): a cached top-k is reused when cosine(q, cached_q) >= theta.
  // Any finite theta >= -1 is valid: -1 always hits after a layer's first lookup, and a theta
  // above 1 (e.g. 1.01) never hits, which disables the cache.
  double theta = 0.9;
  int64_t chunk_size = 512;  // prefill chunk c (tokens per chunk)
  float scale = 1.0f;        // s[h, j] = scale * q_h . k_j (1 as in the public TokenSelect code)
  SpanOptions span;
  BaselineOptions baselines;
};

// span.token_budget, or 4 * k when it is 0 (capped at kMaxSelectionTokens).
int64_t SpanTokenBudget(const SelectionOptions& options);

// The policy's name as ParsePolicy accepts it: "tokenselect", "topk", "head_vote", "dense",
// "streaming", "tokenselect_span", "infllm", "quest", "cascade"; "unknown" for a value outside the
// enum.
absl::string_view PolicyName(SelectionPolicyKind kind);

// Inverse of PolicyName (exact, lower case). InvalidArgument naming selection.policy and
// listing the valid names otherwise.
absl::StatusOr<SelectionPolicyKind> ParsePolicy(absl::string_view name);

// OK when every field is in range; otherwise InvalidArgument whose message names the field and
// the offending value, e.g. "selection.k must be >= 0, got -3". Ranges: policy one of the enum
// values; n_init, k, n_local in [0, kMaxSelectionTokens] with n_init + k + n_local also within
// it; theta finite and >= -1 (> 1 disables the cache); chunk_size in [1, kMaxSelectionTokens];
// scale finite and > 0; span: percentile in [0, 100], nms_iou in [0, 1], 1 <= min_vectors <=
// max_vectors <= 4096, lambdas finite and >= 0, early_layers >= 0, token_budget in [0,
// kMaxSelectionTokens]; baselines: block size, representatives, page size in [1, 1 << 20],
// sub-caches in [1, 30], ema decay in [0, 1).
absl::Status ValidateSelectionOptions(const SelectionOptions& options);

}  // namespace tokenselect::params

#endif  // TOKENSELECT_PARAMS_SELECTION_OPTIONS_H_
