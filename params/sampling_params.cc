#include "params/sampling_params.h"

#include <cmath>
#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tokenselect::params {
namespace {

template <typename T>
absl::Status Bad(absl::string_view field, absl::string_view requirement, const T& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling.", field, " must ", requirement, ", got ", value));
}

// Well-formed UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, <= U+10FFFF.
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;  // overlong
      if (b0 == 0xED) hi = 0x9F;  // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;  // overlong
      if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (s.size() - i < static_cast<size_t>(len)) return false;
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b1 < lo || b1 > hi) return false;
    for (int k = 2; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < 0x80 || b > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

bool HasPenalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.frequency_penalty != 0.0f ||
         params.presence_penalty != 0.0f;
}

absl::Status Validate(const SamplingParams& p, int vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be positive, got ", vocab_size));
  }
  // Comparisons are written so that NaN fails them.
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Bad("temperature", "be a finite number >= 0", p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return Bad("top_p", "be in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return Bad("min_p", "be in [0, 1]", p.min_p);
  if (p.top_k < -1) return Bad("top_k", "be >= -1 (0 or -1 disable it)", p.top_k);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return Bad("repetition_penalty", "be a finite number > 0", p.repetition_penalty);
  }
  if (!(p.frequency_penalty >= -kMaxAbsPenalty && p.frequency_penalty <= kMaxAbsPenalty)) {
    return Bad("frequency_penalty", "be in [-2, 2]", p.frequency_penalty);
  }
  if (!(p.presence_penalty >= -kMaxAbsPenalty && p.presence_penalty <= kMaxAbsPenalty)) {
    return Bad("presence_penalty", "be in [-2, 2]", p.presence_penalty);
  }
  if (p.max_new_tokens < 1) return Bad("max_new_tokens", "be >= 1", p.max_new_tokens);
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t id = p.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return Bad(absl::StrCat("stop_token_ids[", i, "]"),
                 absl::StrCat("be a token id in [0, ", vocab_size, ")"), id);
    }
  }
  if (p.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return Bad("stop", absl::StrCat("hold at most ", kMaxStopStrings, " strings"),
               absl::StrCat(p.stop.size(), " strings"));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    const std::string field = absl::StrCat("stop[", i, "]");
    const std::string& s = p.stop[i];
    if (s.empty()) return Bad(field, "not be empty", "\"\"");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return Bad(field, absl::StrCat("be at most ", kMaxStopStringBytes, " bytes"),
                 absl::StrCat(s.size(), " bytes"));
    }
    if (!IsValidUtf8(s)) return Bad(field, "be valid UTF-8", "invalid byte sequence");
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return Bad("top_logprobs", absl::StrCat("be in [0, ", kMaxTopLogprobs, "]"), p.top_logprobs);
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return Bad("top_logprobs", "be 0 unless sampling.logprobs is true", p.top_logprobs);
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::params
