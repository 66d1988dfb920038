// Decides when a request stops and which text is safe to stream.
//
// Fed one token at a time with the text the incremental detokenizer produced for it, it reports
// the text a client may be sent now and, once, a finish reason. Precedence within one token
// (vLLM's): an end-of-sequence id (unless ignore_eos) or a stop_token_id -> kStop; else a stop
// string completed in the text -> kStopString; else the max_new_tokens-th token -> kLength.
//
// Holdback rule: with stop strings and !include_stop_str_in_output, the longest suffix of the
// text that is a proper prefix of some stop string is held back, since a later token could
// complete the match and that text would have to be cut; it is released as soon as the text
// moves on so that it can no longer match, and on any finish. A streaming client therefore never
// receives text that is later cut. With include_stop_str_in_output nothing is held back: the
// output is cut only after the end of a match, which lies in the newest delta.
//
// Matching is on bytes (stop strings are valid UTF-8, see Validate, and deltas are whole UTF-8
// characters, so cuts fall on character boundaries) with one KMP automaton per stop string, O(1)
// amortised per byte and string. When several stop strings complete, the one that ends first in
// the text wins, and among those ending at the same byte the longest (earliest start), so the
// result does not depend on how the text was split into deltas. The stop string and any text after
// it are dropped (the stop string is kept with include_stop_str_in_output); so is the text of a
// stop token.
#ifndef TOKENSELECT_ENGINE_SAMPLING_STOP_CHECKER_H_
#define TOKENSELECT_ENGINE_SAMPLING_STOP_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/sampling/finish_reason.h"
#include "engine/sampling/sampling_params.h"

namespace tokenselect::engine {

struct StopCheckResult {
  std::string text;  // safe to send now; may be empty
  FinishReason finish_reason = FinishReason::kNone;
};

class StopChecker {
 public:
  // `eos_token_ids`: the model's end-of-sequence ids (generation_config.json). `params` should
  // have passed Validate().
  StopChecker(const SamplingParams& params, absl::Span<const int32_t> eos_token_ids);

  // Takes the next generated token and the text it decoded to. Returns FailedPrecondition after
  // generation finished or after Flush().
  absl::StatusOr<StopCheckResult> Append(int32_t token_id, absl::string_view text_delta);

  // Releases the text still held back, for a request that ends for a reason of its own
  // (cancelled, context full). Nothing may be appended afterwards. Empty after a finish, since a
  // finish already released everything.
  std::string Flush();

  bool finished() const { return finish_reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_reason_; }
  int32_t num_tokens() const { return num_tokens_; }
  // The id that ended generation, set with kStop.
  std::optional<int32_t> stop_token_id() const { return stop_token_id_; }
  // The stop string that matched, set with kStopString.
  const std::optional<std::string>& stop_string() const { return stop_string_; }
  // The text received but not yet released.
  absl::string_view held_back() const { return pending_; }

 private:
  // KMP automaton for one stop string; `state` = length of the longest prefix of `pattern` that
  // is a suffix of all text so far.
  struct Matcher {
    std::string pattern;
    std::vector<size_t> failure;  // failure[i]: longest proper border of pattern[0, i]
    size_t state = 0;
  };
  static Matcher MakeMatcher(const std::string& pattern);
  // Feeds one byte; true when the whole pattern has just been matched.
  static bool Advance(Matcher* m, char c);

  bool IsStopToken(int32_t token_id) const;
  StopCheckResult Finish(FinishReason reason, size_t keep_bytes);

  int32_t max_new_tokens_;
  bool include_stop_str_;
  std::vector<int32_t> stop_ids_;  // eos ids (unless ignore_eos) and stop_token_ids
  std::vector<Matcher> matchers_;

  int32_t num_tokens_ = 0;
  bool flushed_ = false;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::optional<int32_t> stop_token_id_;
  std::optional<std::string> stop_string_;
  std::string pending_;  // received, not yet released
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_STOP_CHECKER_H_
