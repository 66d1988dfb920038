// Writes the fixtures for hf_parity.py, the check that our checkpoints load in Hugging Face
// transformers and that engine::Model computes the same logits and greedy tokens. Skipped
// unless TS_HF_PARITY_DIR names an output folder (transformers is not installed on the CPU
// machines; the script runs where it is):
//   TS_HF_PARITY_DIR=/tmp/parity build/bin/engine_model_hf_parity_fixture_test
//   python3 tests/unit/engine/model/hf_parity.py /tmp/parity
// Per case, <dir>/<case>/ holds the checkpoint, prompt.json {"prompt": [...], "greedy": [...]}
// and logits.f32 (the prompt's logits, [prompt length, vocab] little-endian fp32).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/checkpoint_writer.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_presets.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

constexpr int64_t kVocab = 512;

void WriteCase(const std::string& dir, const ModelConfig& config, const CheckpointOptions& opts) {
  DummyWeightOptions dummy;
  dummy.seed = 17;
  dummy.init = DummyInit::kScaled;
  ASSERT_TRUE(WriteCheckpoint(dir, config, LoadDummyWeights(config, dummy).value(), opts).ok());
  // Run what was written (bf16 checkpoints round the weights).
  const ModelConfig loaded_config = LoadModelConfig(dir).value();
  auto model = Model::Create(loaded_config, LoadWeights(loaded_config, dir).value()).value();
  auto pool = PagePool::Create(model->KvCacheOptions(16, 16)).value();
  TokenTable table(pool.get(), "parity");
  ForwardWorkspace ws;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 131 + 7) % kVocab);
  std::vector<float> logits;
  ASSERT_TRUE(model->Forward({prompt, &table, nullptr, LogitsRows::kAll}, &ws, &logits).ok());
  std::ofstream(dir + "/logits.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  std::vector<int32_t> greedy;
  const float* last = logits.data() + (prompt.size() - 1) * kVocab;
  std::vector<float> step(last, last + kVocab);
  for (int i = 0; i < 24; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(step.begin(), step.end()) - step.begin());
    greedy.push_back(next);
    const std::vector<int32_t> one = {next};
    ASSERT_TRUE(model->Forward({one, &table, nullptr, LogitsRows::kLast}, &ws, &step).ok());
  }
  std::ofstream(dir + "/prompt.json") << nlohmann::json({{"prompt", prompt}, {"greedy", greedy}});
}

TEST(HfParityFixture, Write) {
  const char* out = std::getenv("TS_HF_PARITY_DIR");
  if (out == nullptr) GTEST_SKIP() << "TS_HF_PARITY_DIR not set";
  PresetOptions options;
  options.vocab_size = kVocab;
  for (const std::string& preset : PresetNames()) {
    WriteCase(std::string(out) + "/" + preset, PresetConfig(preset, options).value(), {});
  }
  // Mistral, and a Llama with every bias, stored as sharded bf16.
  ModelConfig mistral = PresetConfig("llama-gqa", options).value();
  mistral.architecture = Architecture::kMistral;
  mistral.num_layers = 2;
  WriteCase(std::string(out) + "/mistral", mistral, {});
  ModelConfig biased = PresetConfig("llama-gqa", options).value();
  biased.num_layers = 2;
  biased.qkv_bias = biased.o_bias = biased.mlp_bias = true;
  biased.rope.scaling = kernels::RopeScaling::kLinear;
  biased.rope.factor = 4.0;
  CheckpointOptions sharded;
  sharded.dtype = DType::kBF16;
  sharded.max_shard_bytes = 1 << 20;
  WriteCase(std::string(out) + "/llama-bias-bf16-sharded", biased, sharded);
}

}  // namespace
}  // namespace tokenselect::engine
