// Parity with Hugging Face transformers (fp32, eager attention) on our generated checkpoints.
// tests/data/golden/make_golden.py recorded, on a host with transformers, full-vocabulary logits
// at several positions of fixed prompts (lengths 1 to 1024) and 32-token greedy continuations;
// this test regenerates the same checkpoints (WriteDemoCheckpoint is deterministic) and checks
//   max |logit - hf_logit| <= 1e-3 at every recorded position, and identical greedy tokens.
// Two golden sets: tests/data/golden (make-model's default "trained-looking" weights) and
// tests/data/golden_hf (make-model --init hf: transformers' own N(0, 0.02) init).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/generator.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

constexpr double kMaxLogitDiff = 1e-3;

struct GoldenCase {
  const char* dir;
  const char* preset;
  DummyInit init;
};

nlohmann::json ReadGolden(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  EXPECT_TRUE(in.good()) << "missing " << dir << "/golden.json (see make_golden.py)";
  return nlohmann::json::parse(in);
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

class HfParityTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(HfParityTest, LogitsAndGreedyContinuationsMatchTransformers) {
  const std::string preset = GetParam().preset;
  const std::string golden_dir = GetParam().dir;
  const nlohmann::json golden = ReadGolden(golden_dir);
  ASSERT_TRUE(golden["presets"].contains(preset));
  const nlohmann::json& entry = golden["presets"][preset];
  const std::vector<float> hf_rows = ReadFloats(golden_dir + "/" + preset + ".logits.bin");

  const std::string dir = ::testing::TempDir() + "/hf_parity_" + preset +
                          (GetParam().init == DummyInit::kHuggingFace ? "_hf" : "");
  DemoCheckpointOptions options;
  options.preset = preset;
  options.init = GetParam().init;
  ASSERT_TRUE(WriteDemoCheckpoint(dir, options).ok());
  absl::StatusOr<LoadedModel> loaded = LoadModelDirectory(dir, LoadFormat::kSafetensors);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = *loaded->model;
  const int64_t vocab = model.config().vocab_size;
  ASSERT_EQ(vocab, entry["vocab_size"].get<int64_t>());

  int64_t row = 0;
  double worst = 0;
  for (const nlohmann::json& prompt : entry["prompts"]) {
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(::testing::Message() << preset << ", prompt of " << ids.size() << " tokens");
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t page_size = 16;
    auto pool = PagePool::Create(model.KvCacheOptions((n + 64) / page_size + 1, page_size));
    ASSERT_TRUE(pool.ok());

    // All positions' logits, computed in prefill chunks of 512 as generation does.
    std::vector<float> logits_all, chunk_logits;
    {
      TokenTable table(pool->get(), "parity");
      ForwardWorkspace ws;
      for (int64_t begin = 0; begin < n; begin += 512) {
        ForwardRequest request;
        request.tokens = absl::MakeConstSpan(ids).subspan(begin, std::min<int64_t>(512, n - begin));
        request.table = &table;
        request.logits = LogitsRows::kAll;
        ASSERT_TRUE(model.Forward(request, &ws, &chunk_logits).ok());
        logits_all.insert(logits_all.end(), chunk_logits.begin(), chunk_logits.end());
      }
    }
    for (int64_t pos : prompt["logit_positions"].get<std::vector<int64_t>>()) {
      double max_diff = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double diff = std::fabs(double(logits_all[pos * vocab + v]) -
                                      double(hf_rows[row * vocab + v]));
        max_diff = std::max(max_diff, diff);
      }
      EXPECT_LE(max_diff, kMaxLogitDiff) << "position " << pos;
      worst = std::max(worst, max_diff);
      ++row;
    }

    GenerationOptions gen;
    gen.sampling.temperature = 0;
    gen.sampling.max_new_tokens = golden["greedy_tokens"].get<int32_t>();
    gen.sampling.ignore_eos = true;
    Generator generator(&model, loaded->tokenizer.get(), pool->get());
    absl::StatusOr<GenerationResult> result = generator.Generate(ids, gen, nullptr);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->token_ids, prompt["greedy"].get<std::vector<int32_t>>());
    EXPECT_TRUE((*pool)->CheckNoLeaks().ok());
  }
  EXPECT_EQ(row * vocab, static_cast<int64_t>(hf_rows.size()));
  std::printf("[%s] max |logit diff| vs transformers %s: %.3g over %lld rows\n", preset.c_str(),
              golden["transformers"].get<std::string>().c_str(), worst,
              static_cast<long long>(row));
}

INSTANTIATE_TEST_SUITE_P(
    Presets, HfParityTest,
    ::testing::Values(GoldenCase{"tests/data/golden", "llama-gqa", DummyInit::kScaled},
                      GoldenCase{"tests/data/golden", "qwen2-bias", DummyInit::kScaled},
                      GoldenCase{"tests/data/golden", "llama3-rope", DummyInit::kScaled},
                      GoldenCase{"tests/data/golden_hf", "llama-gqa", DummyInit::kHuggingFace},
                      GoldenCase{"tests/data/golden_hf", "qwen2-bias", DummyInit::kHuggingFace},
                      GoldenCase{"tests/data/golden_hf", "llama3-rope", DummyInit::kHuggingFace}),
    [](const auto& info) {
      std::string name = std::string(info.param.preset) +
                         (info.param.init == DummyInit::kHuggingFace ? "_hf_init" : "");
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace tokenselect::engine
