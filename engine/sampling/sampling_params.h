// Per-request sampling and stopping options: they live in params/sampling_params.h (below the
// engine, so that the router shares them); this header keeps their engine names working.
#ifndef TOKENSELECT_ENGINE_SAMPLING_SAMPLING_PARAMS_H_
#define TOKENSELECT_ENGINE_SAMPLING_SAMPLING_PARAMS_H_

#include "params/sampling_params.h"

namespace tokenselect::engine {

using params::HasPenalties;
using params::kMaxAbsPenalty;
using params::kMaxStopStringBytes;
using params::kMaxStopStrings;
using params::kMaxTopLogprobs;
using params::SamplingParams;
using params::Validate;

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_SAMPLING_PARAMS_H_
