#include "engine/transfer/selection_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tokenselect::engine {

namespace {

// SerializeLayerState of state_at(0 .. count - 1), or nothing when every one is empty.
template <typename StateAt>
std::vector<std::string> SerializeAll(int64_t count, const StateAt& state_at) {
  // Compared by bytes: whatever SelectionLayerState gains later, "empty" stays "equal to a
  // default-constructed state".
  const std::string empty = SerializeLayerState(SelectionLayerState());
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  bool any = false;
  for (int64_t l = 0; l < count; ++l) {
    out.push_back(SerializeLayerState(state_at(l)));
    any = any || out.back() != empty;
  }
  if (!any) out.clear();
  return out;
}

}  // namespace

std::vector<std::string> SerializeSelectionStates(absl::Span<const SelectionLayerState> states) {
  return SerializeAll(static_cast<int64_t>(states.size()),
                      [&](int64_t l) -> const SelectionLayerState& { return states[l]; });
}

std::vector<std::string> CollectSelectionStates(const SelectionAttention& attention,
                                                int64_t num_layers) {
  return SerializeAll(num_layers, [&](int64_t l) -> const SelectionLayerState& {
    return attention.layer_state(l);
  });
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
