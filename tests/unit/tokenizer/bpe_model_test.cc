#include "tokenizer/bpe_model.h"

#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/training_corpus.h"

namespace tokenselect::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TinyTokenizer;

std::unique_ptr<BpeModel> Model(const TinyTokenizer& spec) {
  auto json = internal::Json::parse(spec.ToJson());
  auto model = BpeModel::FromJson(json["model"], "model");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

std::vector<int32_t> Tokenize(const BpeModel& model, const std::string& word) {
  std::vector<int32_t> ids;
  model.Tokenize(word, &ids);
  return ids;
}

absl::Status LoadError(const TinyTokenizer& spec) {
  auto json = internal::Json::parse(spec.ToJson());
  return BpeModel::FromJson(json["model"], "model").status();
}

//                         0    1    2    3    4     5     6      7
const std::vector<std::string> kVocab = {"a", "b", "c", "d", "ab", "bc", "abc", "cd"};

TEST(BpeModelTest, LowestRankMergesFirst) {
  TinyTokenizer spec{kVocab};
  spec.merges = {"b c", "a bc"};
  auto model = Model(spec);
  EXPECT_THAT(Tokenize(*model, "abc"), ElementsAre(6));
  EXPECT_THAT(Tokenize(*model, "abcd"), ElementsAre(6, 3));
  // With "c d" first, c is taken before b can merge with it.
  spec.merges = {"c d", "a b", "b c", "a bc"};
  model = Model(spec);
  EXPECT_THAT(Tokenize(*model, "abcd"), ElementsAre(4, 7));
  EXPECT_THAT(Tokenize(*model, "abc"), ElementsAre(4, 2));
  EXPECT_THAT(Tokenize(*model, ""), ElementsAre());
}

TEST(BpeModelTest, PairMergeFormatMatchesStringFormat) {
  TinyTokenizer spec{kVocab};
  spec.merges =
      testing::Json::array({testing::Json::array({"b", "c"}), testing::Json::array({"a", "bc"})});
  EXPECT_THAT(Tokenize(*Model(spec), "dabcd"), ElementsAre(3, 6, 3));
}

TEST(BpeModelTest, EqualRanksMergeLeftmostFirst) {
  TinyTokenizer spec{{"a", "aa", "aaaa"}};
  spec.merges = {"a a", "aa aa"};
  auto model = Model(spec);
  EXPECT_THAT(Tokenize(*model, "aaa"), ElementsAre(1, 0));
  EXPECT_THAT(Tokenize(*model, "aaaaa"), ElementsAre(2, 0));
  EXPECT_THAT(Tokenize(*model, "aaaaaa"), ElementsAre(2, 1));
}

TEST(BpeModelTest, IgnoreMergesEmitsWholeVocabWords) {
  TinyTokenizer spec{{"a", "b", "c", "ab", "abc", "bc"}};
  spec.merges = {"a b"};  // "abc" is in the vocab but no merge makes it
  EXPECT_THAT(Tokenize(*Model(spec), "abc"), ElementsAre(3, 2));
  spec.model_options = {{"ignore_merges", true}};
  auto model = Model(spec);
  EXPECT_THAT(Tokenize(*model, "abc"), ElementsAre(4));
  EXPECT_THAT(Tokenize(*model, "abcab"), ElementsAre(3, 2, 3));  // not a vocab word: merges
}

TEST(BpeModelTest, ByteFallbackThenUnk) {
  std::vector<std::string> vocab = {"<unk>", "h", "i"};
  for (const std::string& t : testing::ByteTokens()) vocab.push_back(t);  // ids 3..258
  TinyTokenizer spec{vocab};
  spec.model_options = {{"byte_fallback", true}, {"unk_token", "<unk>"}};
  // é = C3 A9 -> <0xC3> <0xA9>.
  EXPECT_THAT(Tokenize(*Model(spec), "hé"), ElementsAre(1, 3 + 0xC3, 3 + 0xA9));
  // Without byte tokens the unknown characters become <unk>, fused when fuse_unk.
  TinyTokenizer no_bytes{{"<unk>", "h", "i"}};
  no_bytes.model_options = {{"unk_token", "<unk>"}};
  EXPECT_THAT(Tokenize(*Model(no_bytes), "hxyi"), ElementsAre(1, 0, 0, 2));
  no_bytes.model_options["fuse_unk"] = true;
  EXPECT_THAT(Tokenize(*Model(no_bytes), "hxyi"), ElementsAre(1, 0, 2));
  // And without an unk token they are dropped, as HF does.
  TinyTokenizer bare{{"h", "i"}};
  EXPECT_THAT(Tokenize(*Model(bare), "hxi"), ElementsAre(0, 1));
}

TEST(BpeModelTest, LoadErrorsNameTheField) {
  TinyTokenizer spec{kVocab};
  spec.merges = {"a b", "a z"};
  EXPECT_EQ(LoadError(spec).message(), "model.merges[1] 'a z': token 'z' is not in the vocab");
  spec.merges = {"a b", "abc"};
  EXPECT_EQ(LoadError(spec).message(), "model.merges[1] 'abc' must be 'left right'");
  spec.merges = {"c d", "ab cd"};
  EXPECT_THAT(LoadError(spec).message(), HasSubstr("token 'abcd' is not in the vocab"));
  spec.merges = internal::Json::array({1});
  EXPECT_EQ(LoadError(spec).message(), "model.merges[0] must be a string or a pair of strings");
  spec.merges = {};
  spec.model_options = {{"unk_token", "<unk>"}};
  EXPECT_EQ(LoadError(spec).message(), "model.unk_token '<unk>' is not in the vocab");
  spec.model_options = {{"dropout", 0.1}};
  EXPECT_THAT(LoadError(spec).message(), HasSubstr("model.dropout is not supported"));
  spec.model_options = {{"continuing_subword_prefix", "##"}};
  EXPECT_EQ(LoadError(spec).message(), "model.continuing_subword_prefix is not supported");
  spec.model_options = {{"type", "Unigram"}};
  EXPECT_EQ(LoadError(spec).message(), "model.type 'Unigram' is not supported");
  spec.model_options = {{"vocab", {{"a", "zero"}}}};
  EXPECT_EQ(LoadError(spec).message(), "model.vocab[\"a\"] must be an integer");
  spec.model_options = {{"vocab", {{"a", 0}, {"b", 0}}}};
  EXPECT_THAT(LoadError(spec).message(), HasSubstr("reuses id 0"));
  spec.model_options = {{"vocab", {{"a", -3}}}};
  EXPECT_THAT(LoadError(spec).message(), HasSubstr("has id -3 out of range"));
}

// A direct transcription of BPE: repeatedly apply the lowest-ranked merge present anywhere
// (leftmost occurrence first), one pair at a time.
std::vector<std::string> NaiveBpe(const std::vector<std::string>& symbols_in,
                                  const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> symbols = symbols_in;
  while (true) {
    int best_rank = -1;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best_pos = i;
      }
    }
    if (best_rank < 0) return symbols;
    symbols[best_pos] += symbols[best_pos + 1];
    symbols.erase(symbols.begin() + best_pos + 1);
  }
}

TEST(BpeModelTest, PriorityQueueMatchesNaiveBpeOnTrainedMerges) {
  auto json_text = TrainByteLevelBpe(TrainingCorpus(), 1200, {});
  ASSERT_TRUE(json_text.ok()) << json_text.status();
  auto json = internal::Json::parse(*json_text);
  auto model = BpeModel::FromJson(json["model"], "model");
  ASSERT_TRUE(model.ok());
  std::map<std::pair<std::string, std::string>, int> ranks;
  for (size_t i = 0; i < json["model"]["merges"].size(); ++i) {
    const auto& m = json["model"]["merges"][i];
    ranks[{m[0].get<std::string>(), m[1].get<std::string>()}] = static_cast<int>(i);
  }
  // Random words over a small alphabet of frequent corpus characters, so merges fire a lot.
  std::vector<std::string> alphabet = {"t", "h", "e", "a", "n", "d", "i",  "o",
                                       "s", "r", "Ġ", "l", "c", "u", "ing"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string word;
    std::vector<std::string> symbols;
    int length = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < length; ++i) word += alphabet[rng() % alphabet.size()];
    for (size_t pos = 0; pos < word.size();) {
      size_t len = (static_cast<unsigned char>(word[pos]) >= 0xC0) ? 2 : 1;
      symbols.push_back(word.substr(pos, len));
      pos += len;
    }
    std::vector<std::string> got;
    for (int32_t id : Tokenize(**model, word)) got.push_back(*(*model)->IdToToken(id));
    EXPECT_EQ(got, NaiveBpe(symbols, ranks)) << word;
  }
}

TEST(BpeModelTest, LongWordsAreFastAndCorrect) {
  // 200K characters in one pre-token (SentencePiece files have no pre-tokenizer, so a whole
  // prompt is one word): O(n log n) merging.
  TinyTokenizer spec{{"a", "b", "ab", "abab"}};
  spec.merges = {"a b", "ab ab"};
  auto model = Model(spec);
  std::string word;
  for (int i = 0; i < 100000; ++i) word += "ab";
  auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = Tokenize(*model, word);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(ids.size(), 50000u);
  for (int32_t id : ids) ASSERT_EQ(id, 3);
  EXPECT_LT(seconds, 2.0);
}

TEST(BpeModelTest, CacheGivesTheSameAnswerTwice) {
  TinyTokenizer spec{kVocab};
  spec.merges = {"b c", "a bc"};
  auto model = Model(spec);
  EXPECT_EQ(Tokenize(*model, "abcabc"), Tokenize(*model, "abcabc"));
  EXPECT_THAT(Tokenize(*model, "abcabc"), ElementsAre(6, 6));
  EXPECT_EQ(model->vocab_size(), 8);
  EXPECT_EQ(model->num_merges(), 2u);
  EXPECT_EQ(*model->IdToToken(7), "cd");
  EXPECT_EQ(model->IdToToken(8), nullptr);
  EXPECT_EQ(model->TokenToId("bc"), 5);
}

}  // namespace
}  // namespace tokenselect::tokenizer
