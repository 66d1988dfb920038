#include "tokenizer/split_pattern.h"

namespace tokenselect::tokenizer {

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// A decoded view of the text with the character classes the patterns use.
class Matcher {
 public:
  Matcher(SplitPattern pattern, const std::vector<Utf8Char>& chars)
      : pattern_(pattern), chars_(chars), n_(chars.size()) {}

  // Number of characters matched at `i` (0 if no alternative matches).
  size_t MatchAt(size_t i) const {
    if (size_t len = Contraction(i)) return len;
    if (pattern_ == SplitPattern::kGpt2) {
      if (size_t len = OptionalSpaceThenRun(i, &Matcher::IsL)) return len;
      if (size_t len = OptionalSpaceThenRun(i, &Matcher::IsN)) return len;
      if (size_t len = OptionalSpaceThenRun(i, &Matcher::IsPunct)) return len;
      return Whitespace(i);
    }
    if (size_t len = LettersWithPrefix(i)) return len;
    if (size_t len = Digits(i, pattern_ == SplitPattern::kLlama3 ? 3 : 1)) return len;
    if (size_t len = OptionalSpaceThenRun(i, &Matcher::IsPunct)) {
      size_t j = i + len;
      while (j < n_ && IsCrLf(j)) ++j;
      return j - i;
    }
    if (size_t len = WhitespaceToLastNewline(i)) return len;
    return Whitespace(i);
  }

 private:
  char32_t Cp(size_t i) const { return chars_[i].cp; }
  bool IsL(size_t i) const { return IsLetter(Cp(i)); }
  bool IsN(size_t i) const { return IsNumber(Cp(i)); }
  bool IsS(size_t i) const { return IsWhitespace(Cp(i)); }
  bool IsCrLf(size_t i) const { return Cp(i) == '\r' || Cp(i) == '\n'; }
  // [^\s\p{L}\p{N}]
  bool IsPunct(size_t i) const { return !IsS(i) && !IsL(i) && !IsN(i); }

  char32_t Lower(size_t i) const {
    char32_t c = Cp(i);
    bool case_insensitive = pattern_ != SplitPattern::kGpt2;
    return (case_insensitive && c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
  }

  // 's|'t|'re|'ve|'m|'ll|'d (ASCII case-insensitive for the Llama-3 family).
  size_t Contraction(size_t i) const {
    if (Cp(i) != '\'' || i + 1 >= n_) return 0;
    char32_t a = Lower(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n_) return 0;
    char32_t b = Lower(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // " ?X+" for a class X that excludes the space.
  size_t OptionalSpaceThenRun(size_t i, bool (Matcher::*in_class)(size_t) const) const {
    size_t j = i;
    if (Cp(j) == ' ' && j + 1 < n_ && (this->*in_class)(j + 1)) ++j;
    if (!(this->*in_class)(j)) return 0;
    while (j < n_ && (this->*in_class)(j)) ++j;
    return j - i;
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t LettersWithPrefix(size_t i) const {
    size_t j = i;
    if (!IsCrLf(j) && !IsL(j) && !IsN(j) && j + 1 < n_ && IsL(j + 1)) ++j;
    if (!IsL(j)) return 0;
    while (j < n_ && IsL(j)) ++j;
    return j - i;
  }

  // \p{N}{1,max}
  size_t Digits(size_t i, size_t max) const {
    size_t j = i;
    while (j < n_ && j - i < max && IsN(j)) ++j;
    return j - i;
  }

  size_t WhitespaceRun(size_t i) const {
    size_t j = i;
    while (j < n_ && IsS(j)) ++j;
    return j - i;
  }

  // \s*[\r\n]+ : backtracking ends the match after the last CR/LF of the whitespace run.
  size_t WhitespaceToLastNewline(size_t i) const {
    size_t run = WhitespaceRun(i);
    for (size_t k = run; k > 0; --k) {
      if (IsCrLf(i + k - 1)) return k;
    }
    return 0;
  }

  // \s+(?!\S)|\s+ : a run that ends the text is taken whole; before a non-space the run gives
  // up its last character (which then prefixes the next word), unless it is one character.
  size_t Whitespace(size_t i) const {
    size_t run = WhitespaceRun(i);
    if (run == 0) return 0;
    if (i + run == n_ || run == 1) return run;
    return run - 1;
  }

  SplitPattern pattern_;
  const std::vector<Utf8Char>& chars_;
  size_t n_;
};

}  // namespace

std::optional<SplitPattern> FindSplitPattern(absl::string_view regex) {
  if (regex == kGpt2Pattern) return SplitPattern::kGpt2;
  if (regex == kLlama3Pattern) return SplitPattern::kLlama3;
  if (regex == kQwen2Pattern) return SplitPattern::kQwen2;
  return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> FindPatternMatches(SplitPattern pattern,
                                                          absl::string_view text) {
  std::vector<Utf8Char> chars = DecodeUtf8(text);
  Matcher matcher(pattern, chars);
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t i = 0; i < chars.size();) {
    size_t len = matcher.MatchAt(i);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t begin = chars[i].offset;
    size_t end = chars[i + len - 1].offset + chars[i + len - 1].length;
    matches.emplace_back(begin, end);
    i += len;
  }
  return matches;
}

}  // namespace tokenselect::tokenizer
