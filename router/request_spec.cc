#include "router/request_spec.h"

#include "absl/strings/str_cat.h"

namespace tokenselect::router {
namespace {

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

}  // namespace

absl::Status ValidateSelection(const SelectionSpec& s) {
  params::SelectionOptions options;  // theta, chunk_size and the rest: valid defaults
  if (s.policy) options.policy = *s.policy;
  options.k = s.k.value_or(0);
  options.n_init = s.n_init.value_or(0);
  options.n_local = s.n_local.value_or(0);
  if (s.theta) options.theta = *s.theta;
  if (s.chunk_size) options.chunk_size = *s.chunk_size;
  return params::ValidateSelectionOptions(options);
}

absl::Status ValidatePrompt(const std::vector<int32_t>& prompt_ids, int64_t max_prompt_tokens,
                            int64_t vocab_size) {
  if (prompt_ids.empty()) return Bad("input: the prompt is empty");
  if (static_cast<int64_t>(prompt_ids.size()) > max_prompt_tokens) {
    return Bad(absl::StrCat("prompt: ", prompt_ids.size(), " tokens exceed the limit of ",
                            max_prompt_tokens, " tokens"));
  }
  for (int32_t id : prompt_ids) {
    if (id < 0 || id >= vocab_size) {
      return Bad(absl::StrCat("prompt_token_ids: ", id, " is outside the vocabulary [0, ",
                              vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::router
