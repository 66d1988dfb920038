// Why a request's generation ended.
#ifndef TOKENSELECT_ENGINE_SAMPLING_FINISH_REASON_H_
#define TOKENSELECT_ENGINE_SAMPLING_FINISH_REASON_H_

#include "absl/strings/string_view.h"

namespace tokenselect::engine {

enum class FinishReason {
  kNone = 0,    // still generating
  kStop,        // the model's end-of-sequence id (unless ignore_eos) or one of stop_token_ids
  kStopString,  // the output text contained one of the stop strings
  kLength,      // max_new_tokens reached
};

// "none", "stop", "stop_string", "length". (The OpenAI API reports both kStop and kStopString
// as "stop"; the service maps them there.)
absl::string_view ToString(FinishReason reason);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_FINISH_REASON_H_
