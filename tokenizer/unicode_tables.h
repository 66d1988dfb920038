// Generated Unicode tables (scripts/gen_unicode_tables.py writes unicode_tables.cc and
// nfc_tables.cc). Private to the tokenizer library: use tokenizer/unicode.h.
#ifndef TOKENSELECT_TOKENIZER_UNICODE_TABLES_H_
#define TOKENSELECT_TOKENIZER_UNICODE_TABLES_H_

#include <cstddef>
#include <cstdint>

namespace tokenselect::tokenizer::internal {

// Inclusive code point range, sorted and disjoint within a table.
struct CodepointRange {
  char32_t first;
  char32_t last;
};

// Canonical combining class of every code point in [first, last]; absent code points have 0.
struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};

// One level of canonical decomposition: code_point -> first [second]; second is 0 for a
// singleton. `composes` is 1 when NFC composes first+second back (a primary composite).
struct Decomposition {
  char32_t code_point;
  char32_t first;
  char32_t second;
  uint8_t composes;
};

extern const char kUnicodeVersion[];
extern const CodepointRange kLetterRanges[];  // \p{L}
extern const size_t kLetterRangesSize;
extern const CodepointRange kNumberRanges[];  // \p{N}
extern const size_t kNumberRangesSize;
extern const CombiningClassRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangesSize;
extern const Decomposition kDecompositions[];  // sorted by code_point
extern const size_t kDecompositionsSize;

}  // namespace tokenselect::tokenizer::internal

#endif  // TOKENSELECT_TOKENIZER_UNICODE_TABLES_H_
