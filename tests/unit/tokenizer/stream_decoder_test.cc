#include "tokenizer/stream_decoder.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/training_corpus.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {
namespace {

using testing::AddedTokenJson;
using testing::TinyTokenizer;

std::unique_ptr<Tokenizer> ByteLevelTokenizer() {
  auto json = TrainByteLevelBpe(TrainingCorpus(), 800, {"<|begin_of_text|>", "<|eot_id|>"});
  EXPECT_TRUE(json.ok());
  auto t = Tokenizer::LoadFromStrings(*json);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// SentencePiece layout: <unk> <s> </s>, the 256 byte tokens (ids 3..258), some pieces.
std::unique_ptr<Tokenizer> SentencePieceTokenizer() {
  std::vector<std::string> vocab = {"<unk>", "<s>", "</s>"};
  for (const std::string& t : testing::ByteTokens()) vocab.push_back(t);
  for (const char* piece : {"▁", "▁▁", "▁Hello", "▁world", "a", "b", "é", "▁a", "!", " "}) {
    vocab.push_back(piece);  // ids 259..268
  }
  TinyTokenizer spec{vocab};
  spec.model_options = {{"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}};
  spec.normalizer = testing::Llama2Normalizer();
  spec.decoder = testing::Llama2Decoder();
  spec.added_tokens = {AddedTokenJson(0, "<unk>", true), AddedTokenJson(1, "<s>", true),
                       AddedTokenJson(2, "</s>", true)};
  auto t = Tokenizer::LoadFromStrings(spec.ToJson());
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::vector<std::string> Pushes(const Tokenizer& t, const std::vector<int32_t>& ids,
                                bool skip_special) {
  StreamDecoder stream(t, skip_special);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.Push(id));
  out.push_back(stream.Flush());
  return out;
}

std::string Concat(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

TEST(StreamDecoderTest, SentencePieceLeadingSpaceAndByteRuns) {
  auto t = SentencePieceTokenizer();
  const int32_t kHello = 261, kWorld = 262, kA = 266;
  // The first piece loses its "▁" (Strip), later ones keep it as a space.
  std::vector<std::string> parts = Pushes(*t, {1, kHello, kWorld}, /*skip_special=*/true);
  EXPECT_EQ(parts, (std::vector<std::string>{"", "Hello", " world", ""}));
  parts = Pushes(*t, {1, kHello, kWorld}, /*skip_special=*/false);
  EXPECT_EQ(parts, (std::vector<std::string>{"<s>", " Hello", " world", ""}));
  // 中 = E4 B8 AD as byte-fallback tokens: held until the run ends.
  parts = Pushes(*t, {kHello, 3 + 0xE4, 3 + 0xB8, 3 + 0xAD, kA}, true);
  EXPECT_EQ(parts, (std::vector<std::string>{"Hello", "", "", "", "中 a", ""}));
  // A run at the very end comes out in Flush.
  parts = Pushes(*t, {3 + 0xE4, 3 + 0xB8, 3 + 0xAD}, true);
  EXPECT_EQ(parts, (std::vector<std::string>{"", "", "", "中"}));
  // An invalid run becomes one U+FFFD per byte, as Decode gives.
  parts = Pushes(*t, {3 + 0xE4, 3 + 0xB8, kA}, true);
  EXPECT_EQ(Concat(parts), "\xEF\xBF\xBD\xEF\xBF\xBD a");
}

TEST(StreamDecoderTest, ByteLevelNeverSplitsACharacter) {
  auto t = ByteLevelTokenizer();
  std::string text = "naïve 中文 😀!";
  std::vector<int32_t> ids;
  // One byte per token: the worst case for UTF-8 boundaries.
  for (char c : text) {
    std::string piece = BytesToByteLevel(std::string(1, c));
    ids.push_back(*t->TokenToId(piece));
  }
  std::vector<std::string> parts = Pushes(*t, ids, true);
  EXPECT_EQ(Concat(parts), text);
  for (const std::string& p : parts) EXPECT_TRUE(IsValidUtf8(p)) << p;
  // "中" arrives whole on its third byte.
  size_t zhong = text.find("中");
  EXPECT_EQ(parts[zhong], "");
  EXPECT_EQ(parts[zhong + 1], "");
  EXPECT_EQ(parts[zhong + 2], "中");
}

TEST(StreamDecoderTest, FlushStartsANewStream) {
  auto t = SentencePieceTokenizer();
  StreamDecoder stream(*t, true);
  EXPECT_EQ(stream.Push(261), "Hello");
  EXPECT_EQ(stream.Flush(), "");
  EXPECT_EQ(stream.Push(262), "world");  // first piece of the new stream
  EXPECT_EQ(stream.Push(9999), "");      // unknown id: skipped
}

// The property that matters for streaming: pushes + flush == Decode(all), for any ids.
void CheckRandomSequences(const Tokenizer& t, uint32_t seed, const std::vector<int32_t>& hot) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 600; ++trial) {
    std::vector<int32_t> ids(rng() % 40);
    for (int32_t& id : ids) {
      switch (rng() % 4) {
        case 0:
          id = hot[rng() % hot.size()];
          break;
        case 1:
          id = static_cast<int32_t>(rng() % (t.vocab_size() + 3));  // some unknown
          break;
        default:
          id = static_cast<int32_t>(rng() % t.vocab_size());
      }
    }
    for (bool skip : {false, true}) {
      std::vector<std::string> parts = Pushes(t, ids, skip);
      ASSERT_EQ(Concat(parts), t.Decode(ids, skip)) << "trial " << trial << " skip " << skip;
      for (const std::string& p : parts) ASSERT_TRUE(IsValidUtf8(p));
    }
  }
}

TEST(StreamDecoderTest, RandomSequencesByteLevel) {
  auto t = ByteLevelTokenizer();
  std::vector<int32_t> hot;
  for (int b : {0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9, 0x20, 0x41}) {
    hot.push_back(*t->TokenToId(BytesToByteLevel(std::string(1, static_cast<char>(b)))));
  }
  hot.push_back(*t->TokenToId("<|eot_id|>"));
  CheckRandomSequences(*t, 1, hot);
}

TEST(StreamDecoderTest, RandomSequencesSentencePiece) {
  auto t = SentencePieceTokenizer();
  std::vector<int32_t> hot = {0, 1, 2, 259, 260, 261, 265, 268};
  for (int b :
       {0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9, 0x20, 0x41, 0xE2, 0x96, 0x81}) {
    hot.push_back(3 + b);
  }
  CheckRandomSequences(*t, 2, hot);
}

}  // namespace
}  // namespace tokenselect::tokenizer
