// The tokenizer.json "pre_tokenizer": splits each normalized piece of input into pre-tokens
// (the units BPE runs on) and rewrites them. Supported types:
//   ByteLevel  {add_prefix_space, use_regex}: optional GPT-2 regex split, bytes -> alphabet
//   Split      {pattern: {"Regex": known pattern} | {"String": s}, behavior, invert}
//   Metaspace  {replacement, prepend_scheme: first|always|never (or legacy add_prefix_space),
//               split}
//   Sequence   {pretokenizers: [...]}
#ifndef TOKENSELECT_TOKENIZER_PRETOKENIZER_H_
#define TOKENSELECT_TOKENIZER_PRETOKENIZER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/json_util.h"
#include "tokenizer/split_pattern.h"

namespace tokenselect::tokenizer {

// How Split (and Metaspace's split) keep the delimiters; names as in tokenizer.json.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `text` at `matches` (sorted, non-overlapping byte ranges) according to `behavior`.
// Returns the non-empty pieces as byte ranges.
std::vector<std::pair<size_t, size_t>> SplitByMatches(
    absl::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
    SplitBehavior behavior);

enum class PrependScheme { kFirst, kAlways, kNever };

class PreTokenizer {
 public:
  // No pre-tokenization: the whole piece is one pre-token.
  PreTokenizer() = default;

  // Builds from the JSON value at `path` (null gives the default). InvalidArgument naming the
  // field for unsupported types or an unknown split regex.
  static absl::StatusOr<PreTokenizer> FromJson(const internal::Json& value, absl::string_view path);

  // Appends the pre-tokens of `text` to `out`. `at_input_start` says whether `text` begins at
  // offset 0 of the caller's input (Metaspace prepend_scheme "first" only prepends there).
  void PreTokenize(absl::string_view text, bool at_input_start,
                   std::vector<std::string>* out) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kSplitRegex, kSplitString, kMetaspace };
    Kind kind;
    bool add_prefix_space = false;               // kByteLevel
    bool use_regex = false;                      // kByteLevel
    SplitPattern pattern = SplitPattern::kGpt2;  // kSplitRegex
    std::string literal;                         // kSplitString; kMetaspace: replacement
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
    bool split = true;                                      // kMetaspace
  };
  struct Piece {
    std::string text;
    bool at_input_start;
  };

  static absl::Status Parse(const internal::Json& value, absl::string_view path,
                            std::vector<Step>* steps);
  static void Apply(const Step& step, Piece piece, std::vector<Piece>* out);

  std::vector<Step> steps_;
};

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_PRETOKENIZER_H_
