// The tokenizer.json "normalizer": a sequence of text rewrites applied to each piece of input
// between added tokens. Supported types: Sequence, Prepend, Replace (String pattern), NFC.
#ifndef TOKENSELECT_TOKENIZER_NORMALIZER_H_
#define TOKENSELECT_TOKENIZER_NORMALIZER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

class Normalizer {
 public:
  // Identity.
  Normalizer() = default;

  // Builds from the JSON value at `path` (null gives the identity). InvalidArgument naming the
  // field for unsupported types ("normalizer.type 'Lowercase' is not supported") and for a
  // Replace with a Regex pattern.
  static absl::StatusOr<Normalizer> FromJson(const internal::Json& value, absl::string_view path);

  // Applies every step in order. Prepend leaves empty text empty (as HF does).
  std::string Normalize(absl::string_view text) const;

  bool is_identity() const { return steps_.empty(); }

 private:
  struct Step {
    enum class Kind { kPrepend, kReplace, kNfc };
    Kind kind;
    std::string pattern;  // kReplace: text to find
    std::string content;  // kPrepend: prefix; kReplace: replacement
  };
  static absl::Status Parse(const internal::Json& value, absl::string_view path,
                            std::vector<Step>* steps);

  std::vector<Step> steps_;
};

// Replaces every non-overlapping occurrence of `pattern` (non-empty) in `text`, left to right.
std::string ReplaceAll(absl::string_view text, absl::string_view pattern,
                       absl::string_view content);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_NORMALIZER_H_
