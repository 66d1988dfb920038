// Per-run settings of KV-cache token selection: they live in params/selection_options.h (below
// the engine, so that the router shares them); this header keeps their engine names working.
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTION_OPTIONS_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTION_OPTIONS_H_

#include "params/selection_options.h"

namespace tokenselect::engine {

using params::BaselineOptions;
using params::kMaxSelectionTokens;
using params::ParsePolicy;
using params::PolicyName;
using params::SelectionOptions;
using params::SelectionPolicyKind;
using params::SpanOptions;
using params::SpanTokenBudget;
using params::ValidateSelectionOptions;

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTION_OPTIONS_H_
