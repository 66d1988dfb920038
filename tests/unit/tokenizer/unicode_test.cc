#include "tokenizer/unicode.h"

#include <string>

#include "gtest/gtest.h"
#include "tokenizer/byte_level.h"

namespace tokenselect::tokenizer {
namespace {

TEST(UnicodeTest, Categories) {
  EXPECT_TRUE(IsLetter('a'));
  EXPECT_TRUE(IsLetter('Z'));
  EXPECT_TRUE(IsLetter(0x4E2D));  // 中 Lo
  EXPECT_TRUE(IsLetter(0x1F88));  // ᾈ Lt
  EXPECT_TRUE(IsLetter(0x02B0));  // ʰ Lm
  EXPECT_TRUE(IsLetter(0x212A));  // Kelvin sign, Lu
  EXPECT_FALSE(IsLetter('1'));
  EXPECT_FALSE(IsLetter(0x0301));  // combining acute, Mn
  EXPECT_FALSE(IsLetter(0x1F600));
  EXPECT_TRUE(IsNumber('7'));
  EXPECT_TRUE(IsNumber(0x0661));  // Arabic-Indic one, Nd
  EXPECT_TRUE(IsNumber(0x2164));  // Roman numeral five, Nl
  EXPECT_TRUE(IsNumber(0x00BD));  // ½, No
  EXPECT_FALSE(IsNumber('x'));
  for (char32_t ws : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A,
                      0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) {
    EXPECT_TRUE(IsWhitespace(ws)) << std::hex << ws;
  }
  for (char32_t not_ws : {0x1C, 0x1F, 0x200B, 0x180E, 0xFEFF, 0x61}) {
    EXPECT_FALSE(IsWhitespace(not_ws)) << std::hex << not_ws;
  }
  EXPECT_EQ(CombiningClass(0x0301), 230);
  EXPECT_EQ(CombiningClass(0x0327), 202);
  EXPECT_EQ(CombiningClass('a'), 0);
  EXPECT_FALSE(UnicodeVersion().empty());
}

TEST(UnicodeTest, DecodeUtf8RejectsMalformedSequencesOneByteAtATime) {
  std::string text = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  auto chars = DecodeUtf8(text);
  ASSERT_EQ(chars.size(), 4u);
  EXPECT_EQ(chars[1].cp, 0xE9u);
  EXPECT_EQ(chars[2].cp, 0x4E2Du);
  EXPECT_EQ(chars[3].cp, 0x1F600u);
  EXPECT_EQ(chars[3].offset, 6u);
  for (const char* bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xE4\xB8"}) {
    auto decoded = DecodeUtf8(bad);
    EXPECT_EQ(decoded.size(), std::string(bad).size()) << bad;
    EXPECT_EQ(decoded[0].cp, kInvalidCodepoint);
    EXPECT_FALSE(IsValidUtf8(bad));
  }
  std::string encoded;
  for (char32_t cp : {0x41, 0xE9, 0x4E2D, 0x1F600}) AppendUtf8(cp, &encoded);
  EXPECT_EQ(encoded, "A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

TEST(UnicodeTest, LossyDecodingReplacesMaximalSubparts) {
  const std::string kFffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"
                      "A"),
            kFffd + "A");  // truncated 3-byte sequence: one
  EXPECT_EQ(Utf8Lossy("\xF0\x90\x80"
                      "A"),
            kFffd + "A");
  EXPECT_EQ(Utf8Lossy("\xC0\x80"), kFffd + kFffd);              // C0 never starts a sequence
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(Utf8Lossy("\xE4\xB8\xAD\xAD"), "\xE4\xB8\xAD" + kFffd);
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"), kFffd);
}

TEST(UnicodeTest, IncompleteSuffixIsOnlyAValidUnfinishedSequence) {
  EXPECT_EQ(IncompleteUtf8Suffix(""), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xE4"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xE4\xB8"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE0\x80"), 0u);  // E0 80 can never complete
  EXPECT_EQ(IncompleteUtf8Suffix("\x80\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE4\xB8\xE4"), 1u);
}

TEST(UnicodeTest, NfcComposesReordersAndKeepsExclusions) {
  EXPECT_EQ(NormalizeNfc("plain ascii"), "plain ascii");
  EXPECT_EQ(NormalizeNfc("e\xCC\x81"), "\xC3\xA9");                  // e + U+0301 -> é
  EXPECT_EQ(NormalizeNfc("\xE2\x84\xAB"), "\xC3\x85");               // U+212B Angstrom -> U+00C5
  EXPECT_EQ(NormalizeNfc("e\xCC\x81\xCC\xA7"), "\xC8\xA9\xCC\x81");  // -> U+0229 U+0301
  EXPECT_EQ(NormalizeNfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // 각
  EXPECT_EQ(NormalizeNfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");  // U+0958 excluded
  EXPECT_EQ(NormalizeNfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");    // canonical order
  EXPECT_EQ(NormalizeNfc("\xC3\x85\xCC\x81"), "\xC7\xBA");              // Å + acute -> Ǻ
  EXPECT_EQ(NormalizeNfc("a\xFF"
                         "e\xCC\x81"),
            "a\xFF\xC3\xA9");  // invalid byte kept
}

TEST(ByteLevelTest, MappingMatchesGpt2Alphabet) {
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(ByteToUnicode('A'), static_cast<char32_t>('A'));
  EXPECT_EQ(ByteToUnicode(0xAD), 0x143u);  // the last remapped byte
  EXPECT_EQ(ByteToUnicode(0xE9), 0xE9u);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(UnicodeToByte(ByteToUnicode(static_cast<uint8_t>(b))), b);
  }
  EXPECT_FALSE(UnicodeToByte(0x144).has_value());
  EXPECT_EQ(BytesToByteLevel(" caf\xC3\xA9\n"),
            "\xC4\xA0"
            "caf\xC3\x83\xC2\xA9\xC4\x8A");
  std::string bytes;
  EXPECT_TRUE(
      ByteLevelToBytes("\xC4\xA0"
                       "caf\xC3\x83\xC2\xA9",
                       &bytes));
  EXPECT_EQ(bytes, " caf\xC3\xA9");
  EXPECT_FALSE(ByteLevelToBytes("\xE2\x96\x81", &bytes));  // ▁ is not in the alphabet
  EXPECT_EQ(bytes, " caf\xC3\xA9");
}

}  // namespace
}  // namespace tokenselect::tokenizer
