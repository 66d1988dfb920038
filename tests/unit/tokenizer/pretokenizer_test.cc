#include "tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/split_pattern.h"

namespace tokenselect::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Split(SplitPattern pattern, const std::string& text) {
  std::vector<std::string> out;
  for (const auto& [begin, end] : FindPatternMatches(pattern, text)) {
    out.push_back(text.substr(begin, end - begin));
  }
  return out;
}

std::vector<std::string> PreTokenize(const std::string& json, const std::string& text,
                                     bool at_start = true) {
  auto pre = PreTokenizer::FromJson(internal::Json::parse(json), "pre_tokenizer");
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> out;
  if (pre.ok()) pre->PreTokenize(text, at_start, &out);
  return out;
}

// Expected splits below were produced by HF tokenizers 0.23 (Oniguruma).
TEST(SplitPatternTest, Gpt2) {
  EXPECT_THAT(Split(SplitPattern::kGpt2, "Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "I'LL 'ſ x'S it's"),
              ElementsAre("I", "'", "LL", " '", "ſ", " x", "'", "S", " it", "'s"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a \t\n \nb"), ElementsAre("a", " \t\n ", "\n", "b"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "x\r\n\r\n  y  "),
              ElementsAre("x", "\r\n\r\n ", " y", "  "));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "1234567 \u0661\u0662"),
              ElementsAre("1234567", " \u0661\u0662"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a\u00a0b \u00a0 c"),
              ElementsAre("a", "\u00a0", "b", " \u00a0", " c"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a\u200bb \u200b"),
              ElementsAre("a", "\u200b", "b", " \u200b"));
  EXPECT_THAT(Split(SplitPattern::kGpt2,
                    "\xF0\x9F\x98\x80\xF0\x9F\x98\x80 \xF0\x9F\x98\x80"
                    "a"),
              ElementsAre("\xF0\x9F\x98\x80\xF0\x9F\x98\x80", " \xF0\x9F\x98\x80", "a"));
}

TEST(SplitPatternTest, Llama3) {
  EXPECT_THAT(Split(SplitPattern::kLlama3, "I'LL 'ſ 'ſt x'S"),
              ElementsAre("I", "'LL", " '", "ſ", " '", "ſt", " x", "'S"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "1234567 \u0661\u0662\u0663\u0664"),
              ElementsAre("123", "456", "7", " ", "\u0661\u0662\u0663", "\u0664"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a \t\n \nb"), ElementsAre("a", " \t\n \n", "b"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "x\r\n\r\n  y  "),
              ElementsAre("x", "\r\n\r\n", " ", " y", "  "));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "\u3000\u3000x"), ElementsAre("\u3000", "\u3000x"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a\u0085b \u0085c"),
              ElementsAre("a", "\u0085b", " ", "\u0085c"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "e\u0301t\u0301 \u0301x"),
              ElementsAre("e", "\u0301t", "\u0301", " \u0301", "x"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "foo(); // ok!\n\nbar"),
              ElementsAre("foo", "();", " //", " ok", "!\n\n", "bar"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "'\u212a"), ElementsAre("'\u212a"));
}

TEST(SplitPatternTest, Qwen2TakesDigitsOneByOne) {
  EXPECT_THAT(Split(SplitPattern::kQwen2, "x1234 I'M"),
              ElementsAre("x", "1", "2", "3", "4", " I", "'M"));
}

TEST(SplitPatternTest, RecognisesOnlyTheExactKnownPatterns) {
  EXPECT_EQ(FindSplitPattern(kGpt2Pattern), SplitPattern::kGpt2);
  EXPECT_EQ(FindSplitPattern(kLlama3Pattern), SplitPattern::kLlama3);
  EXPECT_EQ(FindSplitPattern(kQwen2Pattern), SplitPattern::kQwen2);
  EXPECT_FALSE(FindSplitPattern(std::string(kLlama3Pattern) + "|x").has_value());
  EXPECT_FALSE(FindSplitPattern("\\s+").has_value());
}

TEST(SplitByMatchesTest, AllBehaviors) {
  const std::string text = "-a-b--c-";
  std::vector<std::pair<size_t, size_t>> m = {{0, 1}, {2, 3}, {4, 5}, {5, 6}, {7, 8}};
  auto pieces = [&](SplitBehavior behavior) {
    std::vector<std::string> out;
    for (auto [b, e] : SplitByMatches(text, m, behavior)) out.push_back(text.substr(b, e - b));
    return out;
  };
  EXPECT_THAT(pieces(SplitBehavior::kRemoved), ElementsAre("a", "b", "c"));
  EXPECT_THAT(pieces(SplitBehavior::kIsolated),
              ElementsAre("-", "a", "-", "b", "-", "-", "c", "-"));
  EXPECT_THAT(pieces(SplitBehavior::kContiguous), ElementsAre("-", "a", "-", "b", "--", "c", "-"));
  EXPECT_THAT(pieces(SplitBehavior::kMergedWithPrevious), ElementsAre("-", "a-", "b-", "-", "c-"));
  EXPECT_THAT(pieces(SplitBehavior::kMergedWithNext), ElementsAre("-a", "-b", "-", "-c", "-"));
}

TEST(PreTokenizerTest, ByteLevelWithRegexAndPrefixSpace) {
  const char* json = R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})";
  EXPECT_THAT(PreTokenize(json, "Hi café"), ElementsAre("\xC4\xA0Hi",
                                                        "\xC4\xA0"
                                                        "caf\xC3\x83\xC2\xA9"));
  EXPECT_THAT(PreTokenize(json, " x"), ElementsAre("\xC4\xA0x"));  // no second space
  const char* no_regex = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})";
  EXPECT_THAT(PreTokenize(no_regex, "a b\n"), ElementsAre("a\xC4\xA0"
                                                          "b\xC4\x8A"));
}

TEST(PreTokenizerTest, Llama3Sequence) {
  std::string json = std::string(R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":)") +
                     internal::Json(std::string(kLlama3Pattern)).dump() + R"(},
       "behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
  EXPECT_THAT(PreTokenize(json, "Hello  world!"),
              ElementsAre("Hello", "\xC4\xA0", "\xC4\xA0world", "!"));
}

TEST(PreTokenizerTest, MetaspaceSchemesAndSplit) {
  const char* first =
      R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true})";
  EXPECT_THAT(PreTokenize(first, "Hello  world"), ElementsAre("▁Hello", "▁", "▁world"));
  EXPECT_THAT(PreTokenize(first, "Hello", /*at_start=*/false), ElementsAre("Hello"));
  EXPECT_THAT(PreTokenize(first, " Hello"), ElementsAre("▁Hello"));
  const char* never =
      R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false})";
  EXPECT_THAT(PreTokenize(never, "a b"), ElementsAre("a▁b"));
  const char* legacy = R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true})";
  EXPECT_THAT(PreTokenize(legacy, "a b", /*at_start=*/false), ElementsAre("▁a", "▁b"));
}

TEST(PreTokenizerTest, ErrorsNameTheField) {
  auto unknown_regex = PreTokenizer::FromJson(internal::Json::parse(R"({"type":"Sequence",
      "pretokenizers":[{"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"Isolated"}]})"),
                                              "pre_tokenizer");
  ASSERT_FALSE(unknown_regex.ok());
  EXPECT_EQ(unknown_regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown_regex.status().message(),
              HasSubstr("pre_tokenizer.pretokenizers[0].pattern.Regex '\\d+' is not a supported"));
  auto bad_type =
      PreTokenizer::FromJson(internal::Json::parse(R"({"type":"Whitespace"})"), "pre_tokenizer");
  EXPECT_EQ(bad_type.status().message(), "pre_tokenizer.type 'Whitespace' is not supported");
  auto bad_behavior = PreTokenizer::FromJson(
      internal::Json::parse(R"({"type":"Split","pattern":{"String":"x"},"behavior":"Weird"})"),
      "p");
  EXPECT_THAT(bad_behavior.status().message(), HasSubstr("p.behavior 'Weird'"));
  auto bad_scheme = PreTokenizer::FromJson(
      internal::Json::parse(R"({"type":"Metaspace","prepend_scheme":"sometimes"})"), "p");
  EXPECT_THAT(bad_scheme.status().message(), HasSubstr("p.prepend_scheme 'sometimes'"));
}

}  // namespace
}  // namespace tokenselect::tokenizer
