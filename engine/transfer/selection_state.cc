#include "engine/transfer/selection_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tokenselect::engine {

std::vector<std::string> CollectSelectionStates(const SelectionAttention& attention,
                                                int64_t num_layers) {
  // Compared by bytes: whatever SelectionLayerState gains later, "empty" stays "equal to a
  // default-constructed state".
  const std::string empty = SerializeLayerState(SelectionLayerState());
  std::vector<std::string> states;
  states.reserve(static_cast<size_t>(num_layers));
  bool any = false;
  for (int64_t l = 0; l < num_layers; ++l) {
    states.push_back(SerializeLayerState(attention.layer_state(l)));
    any = any || states.back() != empty;
  }
  if (!any) states.clear();
  return states;
}

absl::StatusOr<std::vector<SelectionLayerState>> DecodeSelectionStates(
    absl::Span<const std::string> states, int64_t num_layers, int64_t prompt_tokens) {
  std::vector<SelectionLayerState> out;
  if (states.empty()) return out;
  if (static_cast<int64_t>(states.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("final.selection_states has ", states.size(),
                                                   " entries, expected 0 or one per layer (",
                                                   num_layers, ")"));
  }
  out.reserve(states.size());
  for (size_t l = 0; l < states.size(); ++l) {
    absl::StatusOr<SelectionLayerState> state = DeserializeLayerState(states[l]);
    if (!state.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("final.selection_states[", l,
                       "] is not a valid layer state: ", state.status().message()));
    }
    // Deserialize checks the structure; the request's length is only known here. A state past
    // the prompt would make the decode-time policy index past the request's tokens.
    int64_t end = static_cast<int64_t>(state->received.size());
    end = std::max(end, state->spans.covered_end());
    end = std::max(end, state->cascade.next_token);
    if (end > prompt_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("final.selection_states[", l,
                                                     "] describes tokens up to ", end,
                                                     ", beyond the prompt's ", prompt_tokens));
    }
    out.push_back(std::move(state).value());
  }
  return out;
}

absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states, int64_t num_layers,
                                    SelectionAttention* attention) {
  if (states.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(states.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("final.selection_states has ", states.size(),
                                                   " layers, the model ", num_layers));
  }
  for (int64_t l = 0; l < num_layers; ++l) {
    *attention->mutable_layer_state(l) = std::move(states[static_cast<size_t>(l)]);
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
