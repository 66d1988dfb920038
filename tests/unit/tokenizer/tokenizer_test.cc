#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/training_corpus.h"

namespace tokenselect::tokenizer {
namespace {

using testing::AddedTokenJson;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Json;
using ::testing::StartsWith;
using testing::TinyTokenizer;

std::unique_ptr<Tokenizer> Load(const TinyTokenizer& spec, const std::string& config = "") {
  auto tokenizer = Tokenizer::LoadFromStrings(spec.ToJson(), config);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

// Llama-2 style: <unk> <s> </s>, then a few pieces; mirrors a probe run against HF tokenizers.
TinyTokenizer Llama2Style() {
  TinyTokenizer spec{{"<unk>", "<s>", "</s>", "▁Hello", "▁", "H", "e", "l", "o", "<0x41>", "<0xE4>",
                      "<0xB8>", "<0xAD>", "▁▁", "a"}};
  spec.model_options = {{"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}};
  spec.normalizer = testing::Llama2Normalizer();
  spec.decoder = testing::Llama2Decoder();
  spec.added_tokens = {AddedTokenJson(0, "<unk>", true), AddedTokenJson(1, "<s>", true),
                       AddedTokenJson(2, "</s>", true)};
  return spec;
}

TEST(TokenizerTest, Llama2NormalizerRunsOnEachPieceBetweenAddedTokens) {
  auto t = Load(Llama2Style());
  // HF: ['▁', 'H', 'e', 'l', 'l', 'o', '</s>', '▁', 'H', 'e', 'l', 'l', 'o'].
  EXPECT_THAT(t->Encode("Hello</s>Hello", false),
              ElementsAre(4, 5, 6, 7, 7, 8, 2, 4, 5, 6, 7, 7, 8));
  EXPECT_THAT(t->Encode("<s>Hello", false), ElementsAre(1, 4, 5, 6, 7, 7, 8));
  EXPECT_THAT(t->Encode(" Hello", false), ElementsAre(4, 4, 5, 6, 7, 7, 8));
  EXPECT_THAT(t->Encode("", false), ElementsAre());
  EXPECT_THAT(t->Encode(" ", false), ElementsAre(4, 4));
  EXPECT_THAT(t->Encode("Hq", false), ElementsAre(4, 5, 0));  // no <0x71>: unk
  EXPECT_THAT(t->Encode("a中", false), ElementsAre(4, 14, 10, 11, 12));
  EXPECT_EQ(t->Decode({1, 3}, false), "<s> Hello");
  EXPECT_EQ(t->Decode({1, 3}, true), "Hello");
  EXPECT_EQ(t->Decode({10, 1, 11, 12}, true), "中");
  EXPECT_EQ(t->Decode({3, 999, -1, 3}, false), "Hello Hello");  // unknown ids skipped
}

TEST(TokenizerTest, InvalidUtf8InputNeverFails) {
  auto t = Load(Llama2Style());
  // A stray byte is a one-byte character: byte fallback if the vocab has it, else <unk>.
  EXPECT_THAT(t->Encode("a\xE4", false), ElementsAre(4, 14, 10));
  EXPECT_THAT(t->Encode("a\xFF", false), ElementsAre(4, 14, 0));
  EXPECT_EQ(t->Decode({4, 14, 10}, false), "a\xEF\xBF\xBD");
  auto trained = TrainByteLevelBpe(TrainingCorpus(), 400, {});
  ASSERT_TRUE(trained.ok());
  auto bl = Tokenizer::LoadFromStrings(*trained);
  ASSERT_TRUE(bl.ok());
  std::vector<int32_t> ids = (*bl)->Encode("ok \xFF\xC3 end\xE4\xB8", false);
  EXPECT_EQ((*bl)->Decode(ids, false), "ok \xEF\xBF\xBD\xEF\xBF\xBD end\xEF\xBF\xBD");
}

TEST(TokenizerTest, MetaspacePrependsOnlyAtTheInputStartWithSchemeFirst) {
  TinyTokenizer spec = Llama2Style();
  spec.normalizer = nullptr;
  spec.pre_tokenizer = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", true}};
  auto t = Load(spec);
  EXPECT_THAT(t->Encode("Hello</s>Hello", false), ElementsAre(4, 5, 6, 7, 7, 8, 2, 5, 6, 7, 7, 8));
  EXPECT_THAT(t->Encode("<s>Hello", false), ElementsAre(1, 5, 6, 7, 7, 8));
  EXPECT_THAT(t->Encode("  Hello", false), ElementsAre(4, 4, 5, 6, 7, 7, 8));
}

TEST(TokenizerTest, PostProcessorAndConfigFlags) {
  TinyTokenizer spec = Llama2Style();
  spec.post_processor = Json::parse(R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}})");
  auto t = Load(spec);
  EXPECT_THAT(t->Encode("a", true), ElementsAre(1, 4, 14));
  EXPECT_THAT(t->Encode("a", false), ElementsAre(4, 14));
  EXPECT_EQ(t->bos_id(), 1);  // from the template
  EXPECT_TRUE(t->eos_ids().empty());

  auto eos = Load(spec, R"({"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>",
                            "add_bos_token":false,"add_eos_token":true})");
  EXPECT_THAT(eos->Encode("a", true), ElementsAre(4, 14, 2));
  EXPECT_EQ(eos->bos_id(), 1);
  EXPECT_THAT(eos->eos_ids(), ElementsAre(2));
  EXPECT_TRUE(eos->IsSpecial(2));
  EXPECT_FALSE(eos->IsSpecial(14));
  EXPECT_EQ(eos->config().eos_token, "</s>");
}

TEST(TokenizerTest, AddedTokenFlagsBehaveAsInHf) {
  // Byte-level vocab of the 256 byte characters, no merges; added tokens after it.
  auto trained = TrainByteLevelBpe("", 256, {});
  ASSERT_TRUE(trained.ok());
  Json json = Json::parse(*trained);
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json["added_tokens"] = {AddedTokenJson(256, "<L>", false, /*lstrip=*/true),
                          AddedTokenJson(257, "<R>", false, false, /*rstrip=*/true),
                          AddedTokenJson(258, "<W>", false, false, false, /*single_word=*/true),
                          AddedTokenJson(259, "<LR>", false, true, true),
                          AddedTokenJson(260, "<LONG>", true),
                          AddedTokenJson(261, "<LO", true)};
  auto loaded = Tokenizer::LoadFromStrings(json.dump());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& t = **loaded;
  auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    for (int32_t id : t.Encode(text, false)) out.push_back(*t.IdToToken(id));
    return out;
  };
  // HF: ['a', ' <L>', 'Ġ', 'b'] (the id of <L> covers the swallowed space).
  EXPECT_THAT(pieces("a <L> b"), ElementsAre("a", "<L>", "Ġ", "b"));
  EXPECT_THAT(pieces("a <R> b"), ElementsAre("a", "Ġ", "<R>", "b"));
  EXPECT_THAT(pieces("a<W>b"), ElementsAre("a", "<", "W", ">", "b"));
  EXPECT_THAT(pieces("a <W> b"), ElementsAre("a", "Ġ", "<W>", "Ġ", "b"));
  EXPECT_THAT(pieces("x  <LR>  y"), ElementsAre("x", "<LR>", "y"));
  EXPECT_THAT(pieces("<W>a <W>"), ElementsAre("<", "W", ">", "a", "Ġ", "<W>"));
  EXPECT_THAT(pieces("a <L><L> b"), ElementsAre("a", "<L>", "<L>", "Ġ", "b"));
  EXPECT_THAT(pieces("<LONG><LO"), ElementsAre("<LONG>", "<LO"));  // longest match wins
  EXPECT_EQ(t.vocab_size(), 262);
  EXPECT_EQ(t.TokenToId("<LR>"), 259);
  EXPECT_EQ(t.IdToToken(260), "<LONG>");
  EXPECT_EQ(t.IdToToken(262), std::nullopt);
  EXPECT_EQ(t.Decode({256, 260, 97}, false), "<L><LONG>a");
  EXPECT_EQ(t.Decode({256, 260}, true), "<L>");
}

TEST(TokenizerTest, NfcNormalizerMakesDecomposedInputEncodeLikeComposed) {
  auto trained = TrainByteLevelBpe(TrainingCorpus(), 600, {"<|endoftext|>"});
  ASSERT_TRUE(trained.ok());
  Json json = Json::parse(*trained);
  json["normalizer"] = {{"type", "NFC"}};
  auto t = Tokenizer::LoadFromStrings(json.dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("cafe\xCC\x81 cre\xCC\x80me", false),
            (*t)->Encode("caf\xC3\xA9 cr\xC3\xA8me", false));
  EXPECT_EQ((*t)->Decode((*t)->Encode("cafe\xCC\x81", false), false), "caf\xC3\xA9");
}

TEST(TokenizerTest, MalformedAndTruncatedFilesAreInvalidArgument) {
  auto error = [](const std::string& json, const std::string& config = "") {
    auto t = Tokenizer::LoadFromStrings(json, config);
    EXPECT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    return std::string(t.status().message());
  };
  EXPECT_THAT(error(""), StartsWith("tokenizer.json: invalid JSON at byte"));
  EXPECT_THAT(error("{\"model\": {"), StartsWith("tokenizer.json: invalid JSON at byte"));
  auto trained = TrainByteLevelBpe(TrainingCorpus(), 400, {"<s>"});
  ASSERT_TRUE(trained.ok());
  for (size_t cut : {size_t{1}, trained->size() / 3, trained->size() / 2, trained->size() - 3}) {
    EXPECT_THAT(error(trained->substr(0, cut)), StartsWith("tokenizer.json: invalid JSON"));
  }
  EXPECT_EQ(error("[]"), "tokenizer.json: top level must be a JSON object");
  EXPECT_EQ(error("{}"), "tokenizer.json: model is missing");
  EXPECT_EQ(error(R"({"model":{"type":"Unigram","vocab":[]}})"),
            "tokenizer.json: model.type 'Unigram' is not supported");
  EXPECT_EQ(error(R"({"model":{"type":"WordPiece"}})"),
            "tokenizer.json: model.type 'WordPiece' is not supported");
  EXPECT_EQ(error(R"({"model":{"vocab":{}}})"), "tokenizer.json: model.type is missing");

  TinyTokenizer spec{{"a"}};
  spec.normalizer = {{"type", "Lowercase"}};
  EXPECT_EQ(error(spec.ToJson()), "tokenizer.json: normalizer.type 'Lowercase' is not supported");
  spec.normalizer = nullptr;
  spec.added_tokens = {{{"id", 5}, {"content", ""}}};
  EXPECT_EQ(error(spec.ToJson()), "tokenizer.json: added_tokens[0].content must not be empty");
  spec.added_tokens = {AddedTokenJson(1, "<x>", true), AddedTokenJson(1, "<y>", true)};
  EXPECT_EQ(error(spec.ToJson()), "tokenizer.json: added_tokens[1] reuses id 1");
  spec.added_tokens = Json::array();
  spec.post_processor = {{"type", "TemplateProcessing"}, {"single", Json::array()}};
  EXPECT_EQ(error(spec.ToJson()),
            "tokenizer.json: post_processor.single must contain $A exactly once");
  spec.post_processor = {{"type", "RobertaProcessing"}};
  EXPECT_EQ(error(spec.ToJson()), "tokenizer.json: post_processor.cls must be [token, id]");
  spec.post_processor = nullptr;

  EXPECT_THAT(error(spec.ToJson(), "{"), StartsWith("tokenizer_config.json: invalid JSON"));
  EXPECT_EQ(error(spec.ToJson(), R"({"bos_token": 3})"),
            "tokenizer_config.json: bos_token must be a string, null or an object with a "
            "string 'content'");
  EXPECT_EQ(error(spec.ToJson(), R"({"add_bos_token": "yes"})"),
            "tokenizer_config.json: add_bos_token must be true or false");
  EXPECT_EQ(error(spec.ToJson(), R"({"eos_token": "</s>"})"),
            "tokenizer_config.json: eos_token '</s>' is not in the vocab");
  EXPECT_EQ(error(spec.ToJson(), R"({"add_bos_token": true})"),
            "tokenizer_config.json: add_bos_token is true but there is no bos_token");
  EXPECT_EQ(error(spec.ToJson(), R"({"chat_template": 7})"),
            "tokenizer_config.json: chat_template must be a string or a list of named templates");
}

TEST(TokenizerTest, LoadFromDirectory) {
  std::string dir = ::testing::TempDir() + "/tokenizer_load_test";
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  auto missing = Tokenizer::LoadFromDirectory(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  BpeTrainerOptions options;
  options.bos_token = "<|begin_of_text|>";
  auto trained = TrainByteLevelBpe(TrainingCorpus(), 500,
                                   {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                    "<|start_header_id|>", "<|end_header_id|>"},
                                   options);
  ASSERT_TRUE(trained.ok());
  std::ofstream(dir + "/tokenizer.json") << *trained;
  std::remove((dir + "/tokenizer_config.json").c_str());
  auto no_config = Tokenizer::LoadFromDirectory(dir);
  ASSERT_TRUE(no_config.ok()) << no_config.status();
  EXPECT_EQ((*no_config)->chat_template_family(), ChatTemplateFamily::kLlama3);  // by tokens

  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token":"<|begin_of_text|>","eos_token":"<|end_of_text|>",
             "chat_template":"{{ '<|start_header_id|>' }}"})";
  auto t = Tokenizer::LoadFromDirectory(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), 495);
  EXPECT_THAT((*t)->eos_ids(), ElementsAre(496, 497));  // eos_token, then <|eot_id|>
  std::vector<int32_t> ids = (*t)->Encode("Hello world", true);
  EXPECT_EQ(ids.front(), 495);
  EXPECT_EQ((*t)->Decode(ids, false), "<|begin_of_text|>Hello world");
  EXPECT_EQ((*t)->Decode(ids, true), "Hello world");
  EXPECT_TRUE((*t)->IsSpecial(497));
}

}  // namespace
}  // namespace tokenselect::tokenizer

namespace tokenselect::tokenizer {
namespace {

std::unique_ptr<Tokenizer> TrainedLlama3Style() {
  BpeTrainerOptions options;
  options.bos_token = "<|begin_of_text|>";
  auto json =
      TrainByteLevelBpe(TrainingCorpus(), 3000, {"<|begin_of_text|>", "<|eot_id|>"}, options);
  EXPECT_TRUE(json.ok());
  auto t = Tokenizer::LoadFromStrings(*json);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(TokenizerTest, LongPromptsEncodeQuickly) {
  auto t = TrainedLlama3Style();
  // ~1 MB of mixed text, a few hundred thousand tokens: a long-context prompt.
  std::string text;
  while (text.size() < 1000000) absl::StrAppend(&text, TrainingCorpus(), "<|eot_id|>\n");
  auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = t->Encode(text, true);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 300000u);
  EXPECT_LT(seconds, 10.0) << ids.size() << " tokens";
  std::cout << ids.size() << " tokens in " << seconds << " s\n";
  EXPECT_EQ(t->Decode(ids, false), "<|begin_of_text|>" + text);
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  auto t = TrainedLlama3Style();
  std::string text(TrainingCorpus());
  std::vector<int32_t> want = t->Encode(text, false);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { got[i] = t->Encode(text, false); });
  }
  for (auto& th : threads) th.join();
  for (const auto& ids : got) EXPECT_EQ(ids, want);
}

}  // namespace
}  // namespace tokenselect::tokenizer
