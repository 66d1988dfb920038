// UTF-8 and the few Unicode properties the tokenizer needs: \p{L}, \p{N}, White_Space (what
// Oniguruma's \s matches), canonical combining classes, and NFC normalization. The Unicode
// version is that of the generated tables (kUnicodeVersion; scripts/gen_unicode_tables.py).
#ifndef TOKENSELECT_TOKENIZER_UNICODE_H_
#define TOKENSELECT_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tokenselect::tokenizer {

// A code point decoded from UTF-8 with the byte span it came from. Invalid bytes decode one at
// a time as kInvalidCodepoint (length 1), so every input byte belongs to exactly one Utf8Char.
struct Utf8Char {
  char32_t cp;
  uint32_t offset;  // byte offset in the input
  uint32_t length;  // 1..4 bytes
};

inline constexpr char32_t kInvalidCodepoint = 0xFFFFFFFF;
inline constexpr char32_t kReplacementCharacter = 0xFFFD;

// Decodes one UTF-8 sequence at text[pos]; never reads past the end. Overlong forms, surrogates
// and values above U+10FFFF are invalid (one byte, kInvalidCodepoint).
Utf8Char DecodeUtf8At(absl::string_view text, size_t pos);

// Decodes all of `text`.
std::vector<Utf8Char> DecodeUtf8(absl::string_view text);

// Appends the UTF-8 encoding of `cp` (which must be a valid scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// True when `text` is entirely valid UTF-8.
bool IsValidUtf8(absl::string_view text);

// Decodes `bytes` the way Rust's String::from_utf8_lossy does: every maximal invalid subpart
// becomes one U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Length of the trailing bytes of `bytes` that form a valid but incomplete UTF-8 sequence (the
// start of a character that more bytes could finish); 0 when the end is settled.
size_t IncompleteUtf8Suffix(absl::string_view bytes);

// General category L* (\p{L}).
bool IsLetter(char32_t cp);
// General category N* (\p{N}).
bool IsNumber(char32_t cp);
// The White_Space property (what \s matches in Oniguruma's Unicode mode).
bool IsWhitespace(char32_t cp);
// Canonical combining class (0 for starters and unassigned code points).
uint8_t CombiningClass(char32_t cp);

// Returns the NFC normalization of `text`. Invalid UTF-8 bytes are kept as they are.
std::string NormalizeNfc(absl::string_view text);

// The Unicode version of the tables, e.g. "15.0.0".
absl::string_view UnicodeVersion();

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_UNICODE_H_
