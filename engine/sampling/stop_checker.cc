#include "engine/sampling/stop_checker.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tokenselect::engine {

StopChecker::StopChecker(const SamplingParams& params, absl::Span<const int32_t> eos_token_ids)
    : max_new_tokens_(params.max_new_tokens),
      include_stop_str_(params.include_stop_str_in_output),
      stop_ids_(params.stop_token_ids) {
  if (!params.ignore_eos) {
    stop_ids_.insert(stop_ids_.end(), eos_token_ids.begin(), eos_token_ids.end());
  }
  matchers_.reserve(params.stop.size());
  for (const std::string& s : params.stop) {
    if (!s.empty()) matchers_.push_back(MakeMatcher(s));  // Validate rejects empty ones
  }
}

StopChecker::Matcher StopChecker::MakeMatcher(const std::string& pattern) {
  Matcher m;
  m.pattern = pattern;
  m.failure.assign(pattern.size(), 0);
  size_t k = 0;
  for (size_t i = 1; i < pattern.size(); ++i) {
    while (k > 0 && pattern[i] != pattern[k]) k = m.failure[k - 1];
    if (pattern[i] == pattern[k]) ++k;
    m.failure[i] = k;
  }
  return m;
}

bool StopChecker::Advance(Matcher* m, char c) {
  if (m->state == m->pattern.size()) m->state = m->failure[m->state - 1];
  while (m->state > 0 && m->pattern[m->state] != c) m->state = m->failure[m->state - 1];
  if (m->pattern[m->state] == c) ++m->state;
  return m->state == m->pattern.size();
}

bool StopChecker::IsStopToken(int32_t token_id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token_id) != stop_ids_.end();
}

StopCheckResult StopChecker::Finish(FinishReason reason, size_t keep_bytes) {
  finish_reason_ = reason;
  pending_.resize(keep_bytes);
  StopCheckResult result{std::move(pending_), reason};
  pending_.clear();
  return result;
}

absl::StatusOr<StopCheckResult> StopChecker::Append(int32_t token_id,
                                                    absl::string_view text_delta) {
  if (finished()) {
    return absl::FailedPreconditionError(
        absl::StrCat("token appended after generation finished (", ToString(finish_reason_), ")"));
  }
  if (flushed_) return absl::FailedPreconditionError("token appended after Flush()");
  ++num_tokens_;

  const size_t base = pending_.size();
  if (IsStopToken(token_id)) {
    stop_token_id_ = token_id;
    if (include_stop_str_) pending_.append(text_delta.data(), text_delta.size());
    return Finish(FinishReason::kStop, pending_.size());
  }
  pending_.append(text_delta.data(), text_delta.size());

  // Feed the delta byte by byte to every automaton; stop at the first byte that completes a
  // stop string, preferring the longest of those completing there.
  const Matcher* match = nullptr;
  size_t match_end = 0;  // in pending_
  for (size_t j = 0; j < text_delta.size() && match == nullptr && !matchers_.empty(); ++j) {
    for (Matcher& m : matchers_) {
      if (Advance(&m, text_delta[j]) &&
          (match == nullptr || m.pattern.size() > match->pattern.size())) {
        match = &m;
      }
    }
    match_end = base + j + 1;
  }
  if (match != nullptr) {
    stop_string_ = match->pattern;
    // Without include, the match starts inside pending_: its first bytes were a proper prefix
    // of the stop string ending the text, hence held back.
    return Finish(FinishReason::kStopString,
                  include_stop_str_ ? match_end : match_end - match->pattern.size());
  }
  if (num_tokens_ >= max_new_tokens_) return Finish(FinishReason::kLength, pending_.size());

  size_t hold = 0;
  if (!include_stop_str_) {
    for (const Matcher& m : matchers_) hold = std::max(hold, m.state);
  }
  // A state grows by at most one per byte, so hold <= pending_.size().
  const size_t release = pending_.size() - hold;
  StopCheckResult result{pending_.substr(0, release), FinishReason::kNone};
  pending_.erase(0, release);
  return result;
}

std::string StopChecker::Flush() {
  flushed_ = true;
  std::string text = std::move(pending_);
  pending_.clear();
  return text;
}

}  // namespace tokenselect::engine
