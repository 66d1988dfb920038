#include "wire/selection_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "common/status.h"

ABSL_FLAG(std::string, selection_policy, "tokenselect",
          "workers, serve: default selection policy (requests may override): tokenselect, topk, "
          "head_vote, dense, streaming, tokenselect_span, infllm, quest, cascade");
ABSL_FLAG(int64_t, selection_k, 2048,
          "workers, serve: default selection budget k (tokens picked per layer)");
ABSL_FLAG(int64_t, selection_n_init, 128, "workers, serve: default attention-sink tokens");
ABSL_FLAG(int64_t, selection_n_local, 512, "workers, serve: default recent-window tokens");
ABSL_FLAG(double, selection_theta, 0.9, "workers, serve: default selection-cache cosine threshold");
ABSL_FLAG(int64_t, prefill_chunk_size, 512, "workers, serve: default prefill chunk size in tokens");

namespace tokenselect::wire {

absl::StatusOr<engine::SelectionOptions> SelectionDefaultsFromFlags() {
  engine::SelectionOptions s;
  ASSIGN_OR_RETURN(s.policy, engine::ParsePolicy(absl::GetFlag(FLAGS_selection_policy)));
  s.k = absl::GetFlag(FLAGS_selection_k);
  s.n_init = absl::GetFlag(FLAGS_selection_n_init);
  s.n_local = absl::GetFlag(FLAGS_selection_n_local);
  s.theta = absl::GetFlag(FLAGS_selection_theta);
  s.chunk_size = absl::GetFlag(FLAGS_prefill_chunk_size);
  RETURN_IF_ERROR(engine::ValidateSelectionOptions(s));
  return s;
}

}  // namespace tokenselect::wire
