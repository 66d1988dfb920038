#include "engine/sampling/finish_reason.h"

namespace tokenselect::engine {

absl::string_view ToString(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
  }
  return "unknown";
}

}  // namespace tokenselect::engine
