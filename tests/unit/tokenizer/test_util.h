// Helpers for tokenizer tests: tiny tokenizer.json files built in code.
#ifndef TOKENSELECT_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_
#define TOKENSELECT_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tokenselect::tokenizer::testing {

using Json = nlohmann::ordered_json;

// A tokenizer.json description; ids are positions in `vocab`.
struct TinyTokenizer {
  std::vector<std::string> vocab;
  Json merges = Json::array();          // "a b" strings or ["a", "b"] pairs
  Json model_options = Json::object();  // merged into "model" (byte_fallback, unk_token, ...)
  Json added_tokens = Json::array();
  Json normalizer = nullptr;
  Json pre_tokenizer = nullptr;
  Json post_processor = nullptr;
  Json decoder = nullptr;

  std::string ToJson() const {
    Json vocab_json = Json::object();
    for (size_t i = 0; i < vocab.size(); ++i) vocab_json[vocab[i]] = i;
    Json model = {{"type", "BPE"}, {"vocab", vocab_json}, {"merges", merges}};
    for (auto it = model_options.begin(); it != model_options.end(); ++it) {
      model[it.key()] = it.value();
    }
    Json out = {{"version", "1.0"},
                {"added_tokens", added_tokens},
                {"normalizer", normalizer},
                {"pre_tokenizer", pre_tokenizer},
                {"post_processor", post_processor},
                {"decoder", decoder},
                {"model", model}};
    return out.dump();
  }
};

inline Json AddedTokenJson(int id, const std::string& content, bool special, bool lstrip = false,
                           bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

// The Llama-2 normalizer and decoder.
inline Json Llama2Normalizer() {
  return Json::parse(R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},
      {"type":"Replace","pattern":{"String":" "},"content":"▁"}]})");
}
inline Json Llama2Decoder() {
  return Json::parse(R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},
      {"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})");
}

// "<0x00>".."<0xFF>" in byte order.
inline std::vector<std::string> ByteTokens() {
  std::vector<std::string> out;
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    out.push_back(std::string("<0x") + hex[b / 16] + hex[b % 16] + ">");
  }
  return out;
}

}  // namespace tokenselect::tokenizer::testing

#endif  // TOKENSELECT_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_
