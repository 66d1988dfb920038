// Hand-written matchers for the split regexes of the byte-level BPE families. tokenizer.json
// gives them as Oniguruma regexes; we recognise each by its exact pattern string and match it
// with equivalent code (leftmost alternative wins, greedy quantifiers, the \s+(?!\S) lookahead),
// so no regex engine is needed. Any other pattern is rejected at load time.
//
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+        (also cl100k_base)
//   kQwen2:  as kLlama3 with \p{N} in place of \p{N}{1,3}
#ifndef TOKENSELECT_TOKENIZER_SPLIT_PATTERN_H_
#define TOKENSELECT_TOKENIZER_SPLIT_PATTERN_H_

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The exact regex strings (after JSON unescaping) as they appear in tokenizer.json files.
extern const char kGpt2Pattern[];
extern const char kLlama3Pattern[];
extern const char kQwen2Pattern[];

// Recognises a known pattern string; nullopt for anything else.
std::optional<SplitPattern> FindSplitPattern(absl::string_view regex);

// Returns the byte ranges [begin, end) of all non-overlapping matches of `pattern` in `text`,
// left to right (what Oniguruma's find-iter returns). For these patterns the matches cover
// every character. Invalid UTF-8 bytes count as one character that is neither letter, number
// nor whitespace.
std::vector<std::pair<size_t, size_t>> FindPatternMatches(SplitPattern pattern,
                                                          absl::string_view text);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_SPLIT_PATTERN_H_
