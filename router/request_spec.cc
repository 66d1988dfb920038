#include "router/request_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tokenselect::router {
namespace {

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;  // continuation bytes
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // a truncated character
    for (size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace

absl::Status ValidateSampling(const SamplingSpec& p, int64_t vocab_size) {
  if (p.temperature && !(std::isfinite(*p.temperature) && *p.temperature >= 0)) {
    return Bad(absl::StrCat("sampling.temperature must be finite and >= 0, got ", *p.temperature));
  }
  if (p.top_p && !(*p.top_p > 0 && *p.top_p <= 1)) {
    return Bad(absl::StrCat("sampling.top_p must be in (0, 1], got ", *p.top_p));
  }
  if (p.min_p && !(*p.min_p >= 0 && *p.min_p <= 1)) {
    return Bad(absl::StrCat("sampling.min_p must be in [0, 1], got ", *p.min_p));
  }
  if (p.top_k && *p.top_k < -1) {
    return Bad(absl::StrCat("sampling.top_k must be >= -1, got ", *p.top_k));
  }
  if (p.repetition_penalty &&
      !(std::isfinite(*p.repetition_penalty) && *p.repetition_penalty > 0)) {
    return Bad(absl::StrCat("sampling.repetition_penalty must be finite and > 0, got ",
                            *p.repetition_penalty));
  }
  if (p.frequency_penalty && !(*p.frequency_penalty >= -2 && *p.frequency_penalty <= 2)) {
    return Bad(
        absl::StrCat("sampling.frequency_penalty must be in [-2, 2], got ", *p.frequency_penalty));
  }
  if (p.presence_penalty && !(*p.presence_penalty >= -2 && *p.presence_penalty <= 2)) {
    return Bad(
        absl::StrCat("sampling.presence_penalty must be in [-2, 2], got ", *p.presence_penalty));
  }
  if (p.max_new_tokens && *p.max_new_tokens < 1) {
    return Bad(absl::StrCat("sampling.max_new_tokens must be >= 1, got ", *p.max_new_tokens));
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return Bad(absl::StrCat("sampling.stop_token_ids: ", id, " is outside the vocabulary [0, ",
                              vocab_size, ")"));
    }
  }
  if (p.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return Bad(
        absl::StrCat("sampling.stop: at most ", kMaxStopStrings, " strings, got ", p.stop.size()));
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) return Bad("sampling.stop: stop strings must not be empty");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return Bad(absl::StrCat("sampling.stop: a stop string is longer than ", kMaxStopStringBytes,
                              " bytes"));
    }
    if (!ValidUtf8(s)) return Bad("sampling.stop: stop strings must be valid UTF-8");
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return Bad(absl::StrCat("sampling.top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ",
                            p.top_logprobs));
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return Bad("sampling.top_logprobs needs sampling.logprobs");
  }
  return absl::OkStatus();
}

absl::Status ValidateSelection(const SelectionSpec& s) {
  if (s.policy < 0 || s.policy >= kNumSelectionPolicies) {
    return Bad(absl::StrCat("selection.policy: unknown value ", s.policy));
  }
  if (s.k && *s.k < 0) return Bad(absl::StrCat("selection.k must be >= 0, got ", *s.k));
  if (s.n_init && *s.n_init < 0) {
    return Bad(absl::StrCat("selection.n_init must be >= 0, got ", *s.n_init));
  }
  if (s.n_local && *s.n_local < 0) {
    return Bad(absl::StrCat("selection.n_local must be >= 0, got ", *s.n_local));
  }
  if (s.theta && !(std::isfinite(*s.theta) && *s.theta >= -1)) {
    return Bad(absl::StrCat("selection.theta must be finite and >= -1, got ", *s.theta));
  }
  if (s.chunk_size && *s.chunk_size < 1) {
    return Bad(absl::StrCat("selection.chunk_size must be >= 1, got ", *s.chunk_size));
  }
  return absl::OkStatus();
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
