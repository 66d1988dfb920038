#include "tokenizer/bpe_trainer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"
#include "tokenizer/training_corpus.h"

namespace tokenselect::tokenizer {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kSpecials = {"<|begin_of_text|>", "<|end_of_text|>",
                                            "<|start_header_id|>", "<|end_header_id|>",
                                            "<|eot_id|>"};

BpeTrainerOptions WithBos() {
  BpeTrainerOptions options;
  options.bos_token = "<|begin_of_text|>";
  return options;
}

TEST(BpeTrainerTest, CorpusIsMixedAndTensOfKilobytes) {
  absl::string_view corpus = TrainingCorpus();
  EXPECT_GT(corpus.size(), 20000u);
  EXPECT_LT(corpus.size(), 100000u);
  for (const char* needle :
       {"def ", "#include", "café", "中", "日本", "한국", "😀", "\t\t", "\r\n", "    ", "I'LL"}) {
    EXPECT_NE(corpus.find(needle), absl::string_view::npos) << needle;
  }
}

TEST(BpeTrainerTest, OutputIsByteIdenticalAcrossRuns) {
  auto first = TrainByteLevelBpe(TrainingCorpus(), 2000, kSpecials, WithBos());
  auto second = TrainByteLevelBpe(TrainingCorpus(), 2000, kSpecials, WithBos());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, *second);
}

TEST(BpeTrainerTest, TrainedTokenizerLoadsRoundTripsAndCompresses) {
  auto json = TrainByteLevelBpe(TrainingCorpus(), 2000, kSpecials, WithBos());
  ASSERT_TRUE(json.ok());
  auto parsed = nlohmann::json::parse(*json);
  EXPECT_EQ(parsed["model"]["ignore_merges"], false);
  EXPECT_EQ(parsed["model"]["vocab"].size(), 1995u);
  EXPECT_EQ(parsed["model"]["merges"].size(), 1995u - 256u);
  EXPECT_EQ(
      parsed["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>(),
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  auto t = Tokenizer::LoadFromStrings(*json);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 2000);
  EXPECT_EQ((*t)->TokenToId("<|eot_id|>"), 1999);
  EXPECT_EQ((*t)->bos_id(), 1995);

  std::string corpus(TrainingCorpus());
  std::vector<int32_t> ids = (*t)->Encode(corpus, false);
  EXPECT_EQ((*t)->Decode(ids, false), corpus);
  EXPECT_LT(ids.size() * 2, corpus.size());  // over 2 bytes per token (a third is CJK)
  for (const char* text : {"Hello world", "unseen zxqv words ✓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "  \t\n\n  x", ""}) {
    std::vector<int32_t> with_bos = (*t)->Encode(text, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos.front(), 1995);
    EXPECT_EQ((*t)->Decode(with_bos, true), text);
  }
  // Frequent words end up as single tokens.
  EXPECT_EQ((*t)->Encode(" the", false).size(), 1u);
  EXPECT_EQ((*t)->Encode(" and", false).size(), 1u);
}

TEST(BpeTrainerTest, StopsEarlyWhenNothingIsFrequentEnough) {
  auto json = TrainByteLevelBpe("abab abab", 10000, {"<eos>"});
  ASSERT_TRUE(json.ok());
  auto parsed = nlohmann::json::parse(*json);
  // Words "abab" and "Ġabab": a+b (4 times), then ab+ab (twice); Ġ+abab is seen once.
  EXPECT_EQ(parsed["model"]["merges"].size(), 2u);
  EXPECT_EQ(parsed["model"]["merges"][1], nlohmann::json::array({"ab", "ab"}));
  EXPECT_EQ(parsed["added_tokens"][0]["id"], 258);
  EXPECT_TRUE(parsed["post_processor"].is_null());
}

TEST(BpeTrainerTest, RejectsBadArguments) {
  EXPECT_THAT(TrainByteLevelBpe("x", 257, {"<a>", "<b>"}).status().message(),
              HasSubstr("vocab_size 257 must be at least 256 + 2"));
  EXPECT_THAT(TrainByteLevelBpe("x", 300, {"<a>", "<a>"}).status().message(),
              HasSubstr("'<a>' is repeated"));
  EXPECT_THAT(TrainByteLevelBpe("x", 300, {""}).status().message(), HasSubstr("empty"));
  BpeTrainerOptions options;
  options.bos_token = "<s>";
  EXPECT_THAT(TrainByteLevelBpe("x", 300, {"<a>"}, options).status().message(),
              HasSubstr("bos_token '<s>' is not one of the special tokens"));
}

}  // namespace
}  // namespace tokenselect::tokenizer
