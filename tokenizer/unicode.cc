#include "tokenizer/unicode.h"

#include <algorithm>

#include "tokenizer/unicode_tables.h"

namespace tokenselect::tokenizer {
namespace {

using internal::CodepointRange;

bool InRanges(const CodepointRange* ranges, size_t size, char32_t cp) {
  const CodepointRange* end = ranges + size;
  // First range whose last >= cp.
  const CodepointRange* it = std::lower_bound(
      ranges, end, cp, [](const CodepointRange& r, char32_t value) { return r.last < value; });
  return it != end && it->first <= cp;
}

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// For a lead byte, the number of bytes of its sequence (0 if it cannot start one) and the
// valid range of the second byte.
int SequenceLength(unsigned char lead, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (lead == 0xE0) *lo = 0xA0;
    if (lead == 0xED) *hi = 0x9F;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (lead == 0xF0) *lo = 0x90;
    if (lead == 0xF4) *hi = 0x8F;
    return 4;
  }
  return 0;
}

// Number of bytes at text[pos] that are a valid prefix of the sequence started there (the
// lead byte counts), and whether the whole sequence is complete.
size_t ValidPrefix(absl::string_view text, size_t pos, int* expected) {
  unsigned char lo, hi;
  *expected = SequenceLength(static_cast<unsigned char>(text[pos]), &lo, &hi);
  if (*expected <= 1) return *expected;
  size_t k = 1;
  for (; k < static_cast<size_t>(*expected) && pos + k < text.size(); ++k) {
    unsigned char b = static_cast<unsigned char>(text[pos + k]);
    bool ok = k == 1 ? (b >= lo && b <= hi) : IsContinuation(b);
    if (!ok) break;
  }
  return k;
}

}  // namespace

Utf8Char DecodeUtf8At(absl::string_view text, size_t pos) {
  unsigned char lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return {lead, static_cast<uint32_t>(pos), 1};
  int expected = 0;
  size_t valid = ValidPrefix(text, pos, &expected);
  if (expected == 0 || valid != static_cast<size_t>(expected)) {
    return {kInvalidCodepoint, static_cast<uint32_t>(pos), 1};
  }
  char32_t cp = lead & (0x7F >> expected);
  for (int k = 1; k < expected; ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  }
  return {cp, static_cast<uint32_t>(pos), static_cast<uint32_t>(expected)};
}

std::vector<Utf8Char> DecodeUtf8(absl::string_view text) {
  std::vector<Utf8Char> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    Utf8Char c = DecodeUtf8At(text, pos);
    out.push_back(c);
    pos += c.length;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(absl::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    Utf8Char c = DecodeUtf8At(text, pos);
    if (c.cp == kInvalidCodepoint) return false;
    pos += c.length;
  }
  return true;
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    int expected = 0;
    size_t valid = ValidPrefix(bytes, pos, &expected);
    if (expected == 1) {
      out.push_back(bytes[pos]);
      pos += 1;
    } else if (expected == 0) {
      AppendUtf8(kReplacementCharacter, &out);
      pos += 1;
    } else if (valid == static_cast<size_t>(expected)) {
      out.append(bytes.data() + pos, valid);
      pos += valid;
    } else {
      // A maximal invalid subpart: the lead byte and the continuations that fit it.
      AppendUtf8(kReplacementCharacter, &out);
      pos += valid;
    }
  }
  return out;
}

size_t IncompleteUtf8Suffix(absl::string_view bytes) {
  size_t n = bytes.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    unsigned char b = static_cast<unsigned char>(bytes[n - k]);
    if (IsContinuation(b)) continue;
    int expected = 0;
    size_t valid = ValidPrefix(bytes, n - k, &expected);
    // Incomplete only if everything to the end fits and the sequence wants more.
    if (expected > 1 && valid == k && static_cast<size_t>(expected) > k) return k;
    return 0;
  }
  return 0;
}

bool IsLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(internal::kLetterRanges, internal::kLetterRangesSize, cp);
}

bool IsNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(internal::kNumberRanges, internal::kNumberRangesSize, cp);
}

bool IsWhitespace(char32_t cp) {
  // The White_Space property, unchanged since Unicode 6.3 (U+180E left it then).
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = internal::kCombiningClassRanges;
  const auto* end = begin + internal::kCombiningClassRangesSize;
  const auto* it = std::lower_bound(
      begin, end, cp,
      [](const internal::CombiningClassRange& r, char32_t value) { return r.last < value; });
  return (it != end && it->first <= cp) ? it->ccc : 0;
}

absl::string_view UnicodeVersion() { return internal::kUnicodeVersion; }

}  // namespace tokenselect::tokenizer
