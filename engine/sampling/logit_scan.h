// The one pass over a vocab-sized logits row that every sampling step starts with.
#ifndef TOKENSELECT_ENGINE_SAMPLING_LOGIT_SCAN_H_
#define TOKENSELECT_ENGINE_SAMPLING_LOGIT_SCAN_H_

#include "absl/types/span.h"

namespace tokenselect::engine {

struct LogitScan {
  float max;                // -inf when empty or all -inf (ignores NaN)
  bool has_nan_or_pos_inf;  // any NaN or +inf
};

// Eight independent lanes, so the compiler keeps them in registers (and vectorises) instead of
// running one compare-and-select dependency chain per element.
LogitScan ScanLogits(absl::Span<const float> logits);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_LOGIT_SCAN_H_
