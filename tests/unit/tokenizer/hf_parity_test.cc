// Parity with Hugging Face tokenizers: loads the reference data that
// tests/data/tokenizers/make_reference.py writes (tokenizers trained by HF, their encodings of
// every test case, decodings, pre-tokenizer splits) and checks that we produce exactly the
// same ids and text. The data directory is tests/data/tokenizers/reference/, or
// $TS_TOKENIZER_REFERENCE_DIR when set.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/split_pattern.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::tokenizer {
namespace {

using Json = nlohmann::json;

constexpr int kMaxReportedMismatches = 5;

std::string ReferenceDir() {
  if (const char* dir = std::getenv("TS_TOKENIZER_REFERENCE_DIR")) return dir;
  const char* source = std::getenv("TS_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/data/tokenizers/reference";
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

// Printable form of a test string for failure messages.
std::string Escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 160)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\x%02X", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return s.size() > 160 ? out + "..." : out;
}

std::string IdsToString(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) absl::StrAppend(&out, i ? "," : "", ids[i]);
  return out + (ids.size() > 40 ? ",...]" : "]");
}

struct Variant {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  const Json* data;  // the variant's entry in expected.json
};

struct Reference {
  Json expected;
  std::vector<std::string> cases;
  std::vector<Variant> variants;
  std::map<std::string, std::unique_ptr<Tokenizer>> bases;
};

// Loads everything once; on failure returns nullptr and sets *error.
const Reference* GetReference(std::string* error) {
  static std::string* load_error = nullptr;
  static const Reference* reference = []() -> const Reference* {
    auto fail = [](const std::string& message) -> const Reference* {
      load_error = new std::string(message);
      return nullptr;
    };
    const std::string dir = ReferenceDir();
    std::string text;
    if (!ReadFile(dir + "/expected.json", &text)) {
      return fail(absl::StrCat(
          "HF reference data not found: ", dir,
          "/expected.json is missing. Generate it on a "
          "host with Python 3 and the HF `tokenizers` package by running\n"
          "    python3 tests/data/tokenizers/make_reference.py tests/data/tokenizers/reference\n"
          "from the repository root, then commit tests/data/tokenizers/reference/."));
    }
    auto ref = std::make_unique<Reference>();
    ref->expected = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (ref->expected.is_discarded() || !ref->expected.contains("variants")) {
      return fail(dir + "/expected.json is not valid reference data; regenerate it");
    }
    ref->cases = ref->expected["cases"].get<std::vector<std::string>>();
    for (const auto& [name, variant] : ref->expected["variants"].items()) {
      std::string base = variant["base"].get<std::string>();
      std::string tokenizer_json, config_json;
      if (!ReadFile(dir + "/" + base + "/tokenizer.json", &tokenizer_json)) {
        return fail(absl::StrCat("missing ", dir, "/", base, "/tokenizer.json"));
      }
      ReadFile(dir + "/" + base + "/tokenizer_config.json", &config_json);
      Json patched = Json::parse(tokenizer_json);
      for (const auto& [key, value] : variant["patch"].items()) patched[key] = value;
      for (const auto& [key, value] : variant["model_patch"].items()) {
        patched["model"][key] = value;
      }
      auto tokenizer = Tokenizer::LoadFromStrings(patched.dump(), config_json);
      if (!tokenizer.ok()) {
        return fail(absl::StrCat("variant ", name, ": ", tokenizer.status().ToString()));
      }
      if (variant["patch"].empty() && variant["model_patch"].empty()) {
        // Also load the base from its directory, as the engine will.
        auto from_dir = Tokenizer::LoadFromDirectory(dir + "/" + base);
        if (!from_dir.ok()) return fail(from_dir.status().ToString());
        ref->bases[base] = *std::move(from_dir);
      }
      ref->variants.push_back({name, *std::move(tokenizer), &variant});
    }
    return ref.release();
  }();
  if (reference == nullptr) *error = *load_error;
  return reference;
}

#define REQUIRE_REFERENCE(ref)                      \
  std::string load_error;                           \
  const Reference* ref = GetReference(&load_error); \
  if (ref == nullptr) FAIL() << load_error

std::vector<int32_t> Ids(const Json& value) { return value.get<std::vector<int32_t>>(); }

TEST(HfParityTest, ReferenceDataIsPresent) {
  REQUIRE_REFERENCE(ref);
  EXPECT_GE(ref->cases.size(), 200u);
  EXPECT_GE(ref->variants.size(), 2u);
  std::cout << "reference from tokenizers "
            << ref->expected["tokenizers_version"].get<std::string>() << ", " << ref->cases.size()
            << " cases, " << ref->variants.size() << " variants\n";
}

TEST(HfParityTest, EncodeMatches) {
  REQUIRE_REFERENCE(ref);
  for (const Variant& v : ref->variants) {
    const Json& data = *v.data;
    std::vector<int32_t> prefix = Ids(data.value("special_prefix", Json::array()));
    std::vector<int32_t> suffix = Ids(data.value("special_suffix", Json::array()));
    int mismatches = 0;
    for (size_t i = 0; i < ref->cases.size(); ++i) {
      std::vector<int32_t> want = Ids(data["ids"][i]);
      std::vector<int32_t> want_special;
      if (data["ids_special"][i].is_null()) {
        want_special = prefix;
        want_special.insert(want_special.end(), want.begin(), want.end());
        want_special.insert(want_special.end(), suffix.begin(), suffix.end());
      } else {
        want_special = Ids(data["ids_special"][i]);
      }
      std::vector<int32_t> got = v.tokenizer->Encode(ref->cases[i], false);
      std::vector<int32_t> got_special = v.tokenizer->Encode(ref->cases[i], true);
      if (got != want || got_special != want_special) {
        if (++mismatches <= kMaxReportedMismatches) {
          ADD_FAILURE() << v.name << " case " << i << " \"" << Escape(ref->cases[i])
                        << "\"\n  want " << IdsToString(want) << "\n  got  " << IdsToString(got)
                        << "\n  want(special) " << IdsToString(want_special) << "\n  got(special)  "
                        << IdsToString(got_special);
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << v.name << ": encode mismatches in " << ref->cases.size()
                             << " cases";
  }
}

TEST(HfParityTest, DecodeAndStreamMatch) {
  REQUIRE_REFERENCE(ref);
  for (const Variant& v : ref->variants) {
    const Json& data = *v.data;
    int mismatches = 0;
    for (size_t i = 0; i < ref->cases.size(); ++i) {
      std::vector<int32_t> ids = v.tokenizer->Encode(ref->cases[i], true);
      std::string want_skip = data["decoded_skip"][i].is_null()
                                  ? ref->cases[i]
                                  : data["decoded_skip"][i].get<std::string>();
      std::string want =
          data["decoded"][i].is_null() ? want_skip : data["decoded"][i].get<std::string>();
      std::string got = v.tokenizer->Decode(ids, false);
      std::string got_skip = v.tokenizer->Decode(ids, true);
      StreamDecoder stream(*v.tokenizer, false);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.Push(id);
      streamed += stream.Flush();
      if (got != want || got_skip != want_skip || streamed != want) {
        if (++mismatches <= kMaxReportedMismatches) {
          ADD_FAILURE() << v.name << " case " << i << "\n  want      \"" << Escape(want)
                        << "\"\n  got       \"" << Escape(got) << "\"\n  want skip \""
                        << Escape(want_skip) << "\"\n  got skip  \"" << Escape(got_skip)
                        << "\"\n  streamed  \"" << Escape(streamed) << "\"";
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << v.name << ": decode mismatches";
  }
}

TEST(HfParityTest, RandomIdSequencesDecodeTheSame) {
  REQUIRE_REFERENCE(ref);
  for (const Variant& v : ref->variants) {
    int mismatches = 0;
    for (const Json& sample : (*v.data)["random_decode"]) {
      std::vector<int32_t> ids = Ids(sample["ids"]);
      std::string want = sample["text"].get<std::string>();
      std::string want_skip = sample["text_skip"].get<std::string>();
      std::string got = v.tokenizer->Decode(ids, false);
      std::string got_skip = v.tokenizer->Decode(ids, true);
      StreamDecoder stream(*v.tokenizer, true);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.Push(id);
      streamed += stream.Flush();
      if (got != want || got_skip != want_skip || streamed != want_skip) {
        if (++mismatches <= kMaxReportedMismatches) {
          ADD_FAILURE() << v.name << " ids " << IdsToString(ids) << "\n  want \"" << Escape(want)
                        << "\"\n  got  \"" << Escape(got) << "\"\n  want skip \""
                        << Escape(want_skip) << "\"\n  got skip  \"" << Escape(got_skip) << "\"";
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << v.name << ": random decode mismatches";
  }
}

TEST(HfParityTest, SplitRegexesMatchOniguruma) {
  REQUIRE_REFERENCE(ref);
  const std::map<std::string, SplitPattern> patterns = {{"gpt2", SplitPattern::kGpt2},
                                                        {"llama3", SplitPattern::kLlama3},
                                                        {"qwen2", SplitPattern::kQwen2}};
  for (const auto& [name, pattern] : patterns) {
    const Json& data = ref->expected["pretokenize"][name];
    EXPECT_EQ(FindSplitPattern(data["pattern"].get<std::string>()), pattern) << name;
    int mismatches = 0;
    for (size_t i = 0; i < ref->cases.size(); ++i) {
      std::vector<std::string> want = data["pieces"][i].get<std::vector<std::string>>();
      std::vector<std::string> got;
      for (const auto& [b, e] : FindPatternMatches(pattern, ref->cases[i])) {
        got.push_back(ref->cases[i].substr(b, e - b));
      }
      if (got != want && ++mismatches <= kMaxReportedMismatches) {
        std::string w, g;
        for (const auto& p : want) w += "|" + Escape(p);
        for (const auto& p : got) g += "|" + Escape(p);
        ADD_FAILURE() << name << " case " << i << "\n  want " << w << "\n  got  " << g;
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

TEST(HfParityTest, ConfigFilesAreUnderstood) {
  REQUIRE_REFERENCE(ref);
  ASSERT_EQ(ref->bases.count("bytelevel"), 1u);
  ASSERT_EQ(ref->bases.count("sentencepiece"), 1u);
  const Tokenizer& bl = *ref->bases.at("bytelevel");
  EXPECT_EQ(bl.bos_id(), bl.TokenToId("<|begin_of_text|>"));
  EXPECT_EQ(bl.eos_ids().front(), bl.TokenToId("<|end_of_text|>"));
  EXPECT_EQ(bl.chat_template_family(), ChatTemplateFamily::kLlama3);
  EXPECT_TRUE(bl.IsSpecial(*bl.TokenToId("<|eot_id|>")));
  const Tokenizer& sp = *ref->bases.at("sentencepiece");
  EXPECT_EQ(sp.bos_id(), 1);
  EXPECT_EQ(sp.eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(sp.TokenToId("<0x41>"), 3 + 0x41);
  EXPECT_FALSE(sp.IsSpecial(3 + 0x41));
}

}  // namespace
}  // namespace tokenselect::tokenizer
