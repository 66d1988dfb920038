// The workers' default token-selection flags (--selection_policy, --selection_k,
// --selection_n_init, --selection_n_local, --selection_theta, --prefill_chunk_size): requests may
// override each per call. Defined once here for both worker binaries.
#ifndef TOKENSELECT_WIRE_SELECTION_FLAGS_H_
#define TOKENSELECT_WIRE_SELECTION_FLAGS_H_

#include "absl/status/statusor.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::wire {

// The flags as SelectionOptions; InvalidArgument naming the field for an unknown policy or an
// invalid value (ValidateSelectionOptions).
absl::StatusOr<engine::SelectionOptions> SelectionDefaultsFromFlags();

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_SELECTION_FLAGS_H_
