// Fidelity of KV-cache selection policies against dense attention (docs/fidelity.md).
//
// For one model and prompt, RunFidelity runs dense attention and every requested policy at the
// same budget and measures:
//   (a) per layer, teacher-forced on the dense trajectory (probe_attention.h): the relative
//       attention-output error ||O - O_hat|| / ||O|| of the policy's list against the dense
//       list for the same q/K/V, and the share of dense attention mass (softmax probabilities,
//       averaged over heads and queries) on the tokens the policy's list attends to; at the
//       first `decode_steps` decode steps after the prompt and, optionally, for the prompt's
//       last prefill chunk;
//   (b) KL(dense || policy) of the next-token distributions, each policy on its own trajectory
//       (its own SelectionAttention and KV cache), teacher-forced on the dense greedy tokens:
//       position 0 is the end of the prompt, position t the prediction after t continuation
//       tokens;
//   (c) agreement of the policy's own greedy continuation with the dense one: the share of
//       equal positions and the first position where they differ.
// Policies are named as engine::ParsePolicy accepts them, so a policy added to the engine is
// measured without changes here.
//
// FP8 KV cache (FidelityOptions::kv_dtype = kFP8E4M3, docs/fp8_kv.md): the dense reference stays
// the model as given (unquantized cache), and every policy runs with the CPU's FP8 simulation of
// the cache: in (a) the policies select over, and their outputs O_hat attend to, the K/V
// quantized with the model's scales (float(e4m3(x / s)) * s), in (b) and (c) they run on a copy
// of the model with ModelOptions::kv_dtype = kFP8E4M3. Policy "dense" then measures the FP8
// cache alone.
#ifndef TOKENSELECT_BENCH_FIDELITY_FIDELITY_H_
#define TOKENSELECT_BENCH_FIDELITY_FIDELITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::bench {

struct FidelityOptions {
  // Budget, theta, chunk size and score scale shared by every policy (`policy` is ignored).
  engine::SelectionOptions selection;
  std::vector<std::string> policies = {"tokenselect", "topk", "head_vote", "streaming"};
  int64_t decode_steps = 8;          // teacher-forced decode steps probed for (a)
  int64_t continuation_tokens = 32;  // greedy tokens compared for (b) and (c)
  bool probe_last_prefill_chunk = true;
  int64_t page_size = 16;
  // The policies' KV cache (see above); the dense reference is always the model as given.
  engine::KvCacheDType kv_dtype = engine::KvCacheDType::kBF16;
};

// One layer's probe metrics over the measured steps.
struct LayerFidelity {
  int64_t layer = 0;
  int64_t samples = 0;  // measured forward steps
  double error_mean = 0;
  double error_max = 0;
  double error_true_mean = 0;     // the policy's tokens at their true positions (no compaction)
  double coverage_mean = 0;       // mean over steps of the per-(query, head) mean coverage
  double coverage_min = 0;        // lowest per-step value
  double attended_mean = 0;       // cached tokens in the policy's list (new tokens excluded)
  double cached_tokens_mean = 0;  // cached tokens in the dense list
};

struct PolicyFidelity {
  std::string policy;
  std::vector<LayerFidelity> decode_layers;   // (a) at decode steps
  std::vector<LayerFidelity> prefill_layers;  // (a) for the last prefill chunk; may be empty
  std::vector<double> kl;                     // (b) per continuation position
  double kl_mean = 0;
  double kl_max = 0;
  std::vector<int32_t> tokens;           // (c) the policy's own greedy continuation
  double agreement = 0;                  // share of positions equal to dense, in [0, 1]
  int64_t first_divergence = -1;         // -1 when every position agrees
  engine::SelectionCacheCounters cache;  // decode selection-cache lookups of the free run
};

struct FidelityReport {
  FidelityOptions options;
  int64_t prompt_tokens = 0;
  int64_t num_layers = 0;
  std::vector<int32_t> dense_tokens;  // dense greedy continuation
  std::vector<PolicyFidelity> policies;
  double seconds = 0;
};

// Runs the measurement. InvalidArgument for an empty prompt, an unknown policy name (from
// engine::ParsePolicy), invalid selection options, decode_steps < 0 or continuation_tokens < 1,
// or an FP8 run of a model that already has an FP8 cache; errors of the forward passes (and of
// the FP8 model's creation) are returned as they are.
absl::StatusOr<FidelityReport> RunFidelity(const engine::Model& model,
                                           absl::Span<const int32_t> prompt,
                                           const FidelityOptions& options);

// The mean of every field over the layers (layer = -1; samples summed; error_max and
// coverage_min are the extremes over layers).
LayerFidelity MeanOverLayers(const std::vector<LayerFidelity>& layers);

// Every policy name the engine knows (engine::PolicyName over the enum until "unknown").
std::vector<std::string> AllPolicyNames();

}  // namespace tokenselect::bench

#endif  // TOKENSELECT_BENCH_FIDELITY_FIDELITY_H_
