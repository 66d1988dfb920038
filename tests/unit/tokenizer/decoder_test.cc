#include "tokenizer/decoder.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {
namespace {

using ::testing::HasSubstr;

const std::string kFffd = "\xEF\xBF\xBD";

Decoder Make(const std::string& json) {
  auto decoder = Decoder::FromJson(internal::Json::parse(json), "decoder");
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  return decoder.ok() ? *decoder : Decoder();
}

std::string Incremental(const Decoder& decoder, const std::vector<std::string>& tokens) {
  DecoderState state(&decoder);
  std::string out;
  for (const std::string& t : tokens) state.Push(t, &out);
  state.Finish(&out);
  return out;
}

// Expected strings below are what HF tokenizers 0.23 returns for the same chains.
TEST(DecoderTest, Llama2Chain) {
  Decoder d = Make(testing::Llama2Decoder().dump());
  EXPECT_EQ(d.DecodeTokens({"<s>", "▁Hello"}), "<s> Hello");
  EXPECT_EQ(d.DecodeTokens({"▁Hello"}), "Hello");
  EXPECT_EQ(d.DecodeTokens({"▁Hello", "<s>", "▁Hello"}), "Hello<s> Hello");
  EXPECT_EQ(d.DecodeTokens({"<0xE4>", "<0xB8>", "<0xAD>"}), "中");
  EXPECT_EQ(d.DecodeTokens({"<0xE4>", "<s>", "<0xB8>", "<0xAD>"}), kFffd + "<s>" + kFffd + kFffd);
  // A run is decoded as a whole: one invalid byte turns every byte of it into U+FFFD.
  EXPECT_EQ(d.DecodeTokens({"<0x41>", "<0xAD>"}), kFffd + kFffd);
  EXPECT_EQ(d.DecodeTokens({"<0xE4>", "<0xB8>", "<0xAD>", "<0x80>"}),
            kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(d.DecodeTokens({"▁▁", "▁Hello"}), "  Hello");
  EXPECT_EQ(d.DecodeTokens({}), "");
}

TEST(DecoderTest, MetaspaceDropsEveryReplacementOfTheFirstToken) {
  const char* always = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})";
  EXPECT_EQ(Make(always).DecodeTokens({"▁▁a▁b", "▁c"}), "ab c");
  const char* never = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never"})";
  EXPECT_EQ(Make(never).DecodeTokens({"▁▁a▁b", "▁c"}), "  a b c");
  const char* legacy = R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true})";
  EXPECT_EQ(Make(legacy).DecodeTokens({"▁x", "▁y"}), "x y");
}

TEST(DecoderTest, StripAndByteFallbackDetails) {
  EXPECT_EQ(Make(R"({"type":"Strip","content":" ","start":1,"stop":1})").DecodeTokens({"  a  "}),
            " a ");
  EXPECT_EQ(Make(R"({"type":"Strip","content":" ","start":2,"stop":0})").DecodeTokens({" x", " y"}),
            "xy");
  // u8::from_str_radix accepts lower case and a leading '+'.
  EXPECT_EQ(Make(R"({"type":"ByteFallback"})").DecodeTokens({"<0xE4>", "<0xb8>", "<0x+F>", "a"}),
            kFffd + kFffd + kFffd + "a");
  uint8_t b = 0;
  EXPECT_TRUE(ParseByteToken("<0x0A>", &b));
  EXPECT_EQ(b, 0x0A);
  EXPECT_FALSE(ParseByteToken("<0x0A", &b));
  EXPECT_FALSE(ParseByteToken("<0xZZ>", &b));
  EXPECT_FALSE(ParseByteToken("<0x-1>", &b));
}

TEST(DecoderTest, ByteLevelIsLossyOverTheWholeByteString) {
  Decoder d = Make(R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true})");
  auto bl = [](const std::string& bytes) { return BytesToByteLevel(bytes); };
  EXPECT_EQ(d.DecodeTokens({bl("Hello"), bl(" world")}), "Hello world");
  // Added tokens that are not in the alphabet pass through as their own bytes.
  EXPECT_EQ(d.DecodeTokens({bl("\xE4\xB8"), "<|sp|>", bl("\xAD")}), kFffd + "<|sp|>" + kFffd);
  EXPECT_EQ(d.DecodeTokens({bl("\xE4"), bl("\xB8\xAD")}), "中");
  EXPECT_EQ(d.DecodeTokens({"▁x"}), "▁x");
}

TEST(DecoderTest, NullDecoderJoinsWithSpaces) {
  Decoder d;
  EXPECT_EQ(d.DecodeTokens({"a", "b", "c"}), "a b c");
  EXPECT_EQ(Incremental(d, {"a", "b", "c"}), "a b c");
}

TEST(DecoderTest, UnsupportedChainsAreRejectedWithTheirPath) {
  auto error = [](const std::string& json) {
    return std::string(
        Decoder::FromJson(internal::Json::parse(json), "decoder").status().message());
  };
  EXPECT_EQ(error(R"({"type":"CTC"})"), "decoder.type 'CTC' is not supported");
  EXPECT_THAT(error(R"({"type":"Sequence","decoders":[{"type":"Fuse"},
      {"type":"Replace","pattern":{"String":"a"},"content":"b"}]})"),
              HasSubstr("decoder.decoders[1]: Replace after Fuse is not supported"));
  EXPECT_THAT(error(R"({"type":"Sequence","decoders":[{"type":"ByteFallback"},
      {"type":"ByteLevel"}]})"),
              HasSubstr("decoder.decoders[1]: ByteLevel combined with other decoders"));
  EXPECT_THAT(error(R"({"type":"Replace","pattern":{"Regex":"a+"},"content":"b"})"),
              HasSubstr("decoder.pattern Regex patterns are not supported"));
  EXPECT_EQ(error(R"({"type":"Strip","content":"ab","start":1,"stop":0})"),
            "decoder.content must be exactly one character");
  EXPECT_EQ(error(R"({"decoders":[]})"), "decoder.type is missing");
}

// The incremental state must give exactly what the whole-list decoder gives, for any tokens.
TEST(DecoderTest, IncrementalEqualsWholeListOnRandomTokens) {
  const std::vector<std::string> chains = {
      testing::Llama2Decoder().dump(),
      R"({"type":"ByteLevel"})",
      R"({"type":"Sequence","decoders":[{"type":"ByteFallback"},
          {"type":"Metaspace","replacement":"▁","prepend_scheme":"always"}]})",
      R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},
          "content":" "},{"type":"ByteFallback"},{"type":"Fuse"},
          {"type":"Strip","content":" ","start":2,"stop":2}]})",
      R"({"type":"Sequence","decoders":[{"type":"Strip","content":"x","start":1,"stop":1},
          {"type":"ByteFallback"},{"type":"Metaspace","prepend_scheme":"first"},
          {"type":"ByteFallback"}]})",
      "null"};
  const std::vector<std::string> pieces = {
      "▁",      "▁▁",     "▁a",     "b",      " ",      "  ",       "x",      "xx▁",
      "<s>",    "<0x41>", "<0xC3>", "<0xA9>", "<0xE4>", "<0xB8>",   "<0xAD>", "<0x80>",
      "<0xF0>", "<0x9F>", "<0x20>", "é",      "ä¸",     "\xC4\xA0", "Ń",      "\xC4\xA0\xC4\xA0",
      "<0xE2>", "<0x96>", "<0x81>"};
  std::mt19937 rng(42);
  for (const std::string& chain : chains) {
    Decoder d = chain == "null" ? Decoder() : Make(chain);
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<std::string> tokens(rng() % 12);
      for (auto& t : tokens) t = pieces[rng() % pieces.size()];
      ASSERT_EQ(Incremental(d, tokens), d.DecodeTokens(tokens)) << chain << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace tokenselect::tokenizer
