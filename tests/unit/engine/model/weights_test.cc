#include "engine/model/weights.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/model/checkpoint_writer.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_presets.h"
#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig TinyConfig(const std::string& preset) {
  PresetOptions options;
  options.vocab_size = 32;
  ModelConfig c = PresetConfig(preset, options).value();
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.rope.head_dim = 8;  // q_dim 32 != hidden 16
  return c;
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/weights_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // Writes every tensor of `weights` except `skip`, with `override_name` given `override_shape`,
  // plus `extra` tensors.
  void WriteTensors(const ModelConfig& config, const ModelWeights& weights,
                    const std::string& skip = "", const std::string& override_name = "",
                    std::vector<int64_t> override_shape = {},
                    const std::vector<std::string>& extra = {}) {
    std::vector<TensorToWrite> tensors;
    std::vector<std::vector<float>> storage;
    storage.reserve(8);
    for (const ConstWeightEntry& e : ListWeights(config, weights)) {
      if (e.name == skip) continue;
      if (e.name == override_name) {
        int64_t n = 1;
        for (int64_t d : override_shape) n *= d;
        storage.emplace_back(n, 0.5f);
        tensors.push_back({e.name, DType::kF32, override_shape, storage.back().data(), nullptr});
      } else {
        tensors.push_back({e.name, DType::kBF16, e.shape, e.data->data(), nullptr});
      }
    }
    for (const std::string& name : extra) {
      storage.emplace_back(4, 1.0f);
      tensors.push_back({name, DType::kF32, {4}, storage.back().data(), nullptr});
    }
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors, {{"format", "pt"}}).ok());
  }

  std::string dir_;
};

TEST_F(WeightsTest, ListsHuggingFaceNamesPerArchitecture) {
  const ModelConfig llama = TinyConfig("llama-gqa");
  std::vector<WeightEntry> entries = ListWeights(llama, nullptr);
  ASSERT_EQ(entries.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(entries[0].name, "model.embed_tokens.weight");
  EXPECT_THAT(entries[0].shape, ElementsAre(32, 16));
  EXPECT_EQ(entries[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(entries[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_THAT(entries[2].shape, ElementsAre(32, 16));
  EXPECT_EQ(entries[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_THAT(entries[3].shape, ElementsAre(16, 16));
  EXPECT_EQ(entries[5].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_THAT(entries[5].shape, ElementsAre(16, 32));
  EXPECT_EQ(entries[5].fan_in, 32);
  EXPECT_EQ(entries[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_THAT(entries[9].shape, ElementsAre(16, 24));
  EXPECT_EQ(entries[19].name, "model.norm.weight");
  EXPECT_EQ(entries[20].name, "lm_head.weight");

  const ModelConfig qwen = TinyConfig("qwen2-bias");  // q/k/v biases, tied embeddings
  entries = ListWeights(qwen, nullptr);
  ASSERT_EQ(entries.size(), 1 + 2 * 12 + 1u);
  EXPECT_EQ(entries[3].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_THAT(entries[3].shape, ElementsAre(32));
  EXPECT_EQ(entries[3].kind, WeightKind::kBias);
  EXPECT_EQ(entries.back().name, "model.norm.weight");

  ModelConfig all_bias = TinyConfig("llama-gqa");
  all_bias.qkv_bias = all_bias.o_bias = all_bias.mlp_bias = true;
  EXPECT_EQ(ListWeights(all_bias, nullptr).size(), 1 + 2 * 16 + 2u);
  EXPECT_EQ(NumParameters(llama),
            32 * 16 * 2 + 16 + 2 * (16 + 32 * 16 + 16 * 16 * 2 + 16 * 32 + 16 + 3 * 24 * 16));
}

TEST_F(WeightsTest, LoadsCheckpointAndTiesLmHead) {
  for (const char* preset : {"llama-gqa", "qwen2-bias"}) {
    const ModelConfig config = TinyConfig(preset);
    const ModelWeights original = LoadDummyWeights(config, 3).value();
    WriteTensors(config, original, "", "", {}, {"model.layers.0.self_attn.rotary_emb.inv_freq"});
    WeightLoadStats stats;
    ModelWeights loaded = LoadWeights(config, dir_, &stats).value();
    EXPECT_THAT(stats.ignored, ElementsAre("model.layers.0.self_attn.rotary_emb.inv_freq"));
    EXPECT_EQ(stats.num_loaded, static_cast<int64_t>(ListWeights(config, nullptr).size()));
    EXPECT_EQ(stats.bytes_loaded, NumParameters(config) * 4);
    ASSERT_TRUE(CheckWeightShapes(config, loaded).ok());
    // Written as bf16: loaded values are the bf16 roundings.
    for (size_t i = 0; i < original.layers[1].q_proj.size(); ++i) {
      ASSERT_EQ(loaded.layers[1].q_proj[i], Bf16ToFloat(FloatToBf16(original.layers[1].q_proj[i])));
    }
    if (config.tie_word_embeddings) {
      EXPECT_TRUE(loaded.lm_head_weight.empty());
      EXPECT_EQ(loaded.lm_head(), loaded.embed_tokens.data());
      EXPECT_FALSE(loaded.layers[0].q_bias.empty());
    } else {
      EXPECT_NE(loaded.lm_head(), loaded.embed_tokens.data());
      EXPECT_TRUE(loaded.layers[0].q_bias.empty());
    }
  }
}

TEST_F(WeightsTest, TiedCheckpointWithLmHeadIgnoresIt) {
  const ModelConfig config = TinyConfig("qwen2-bias");
  ModelConfig untied = config;
  untied.tie_word_embeddings = false;
  const ModelWeights weights = LoadDummyWeights(untied, 1).value();
  WriteTensors(untied, weights);
  WeightLoadStats stats;
  ModelWeights loaded = LoadWeights(config, dir_, &stats).value();
  EXPECT_THAT(stats.ignored, ElementsAre("lm_head.weight"));
  EXPECT_EQ(loaded.lm_head(), loaded.embed_tokens.data());
}

TEST_F(WeightsTest, ErrorsNameTheTensor) {
  ModelConfig config = TinyConfig("llama-gqa");
  config.hidden_size = 1024;
  config.num_heads = 4;
  config.num_kv_heads = 1;
  config.head_dim = config.rope.head_dim = 256;
  config.intermediate_size = 8;
  config.num_layers = 4;
  config.vocab_size = 8;
  const ModelWeights weights = LoadDummyWeights(config, 1).value();

  WriteTensors(config, weights, "", "model.layers.3.self_attn.k_proj.weight", {512, 1024});
  absl::StatusOr<ModelWeights> loaded = LoadWeights(config, dir_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(),
            dir_ +
                ": model.layers.3.self_attn.k_proj.weight: expected shape [256, 1024], got "
                "[512, 1024]");

  WriteTensors(config, weights, "model.norm.weight");
  loaded = LoadWeights(config, dir_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(loaded.status().message(), dir_ + ": checkpoint has no tensor model.norm.weight");

  ModelConfig biased = config;
  biased.qkv_bias = biased.o_bias = true;
  WriteTensors(config, weights);
  EXPECT_EQ(LoadWeights(biased, dir_).status().message(),
            dir_ + ": checkpoint has no tensor model.layers.0.self_attn.q_proj.bias");

  // An integer tensor where a weight belongs.
  std::vector<TensorToWrite> tensors;
  for (const ConstWeightEntry& e : ListWeights(config, weights)) {
    tensors.push_back({e.name, DType::kF32, e.shape, e.data->data(), nullptr});
  }
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors, {}).ok());
  // Patch the dtype of model.norm.weight from F32 to I32 (same size) in place.
  {
    std::FILE* f = std::fopen((dir_ + "/model.safetensors").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::string bytes(4096, '\0');
    const size_t n = std::fread(bytes.data(), 1, bytes.size(), f);
    const size_t pos = bytes.find("\"model.norm.weight\":{\"dtype\":\"F32\"");
    ASSERT_NE(pos, std::string::npos);
    ASSERT_LT(pos, n);
    std::fseek(f,
               static_cast<long>(pos + std::string("\"model.norm.weight\":{\"dtype\":\"").size()),
               SEEK_SET);
    std::fputs("I32", f);
    std::fclose(f);
  }
  EXPECT_EQ(LoadWeights(config, dir_).status().message(),
            dir_ + ": model.norm.weight: dtype I32 is not supported (F32, F16 or BF16)");
  EXPECT_EQ(LoadWeights(config, dir_ + "/nowhere").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(WeightsTest, CheckWeightShapes) {
  const ModelConfig config = TinyConfig("llama-gqa");
  ModelWeights weights = LoadDummyWeights(config, 1).value();
  EXPECT_TRUE(CheckWeightShapes(config, weights).ok());
  weights.layers[1].up_proj.resize(10);
  EXPECT_EQ(CheckWeightShapes(config, weights).message(),
            "model.layers.1.mlp.up_proj.weight: expected 384 values for shape [24, 16], got 10");
  weights.layers.pop_back();
  EXPECT_EQ(CheckWeightShapes(config, weights).message(), "weights have 1 layers, the config 2");
}

}  // namespace
}  // namespace tokenselect::engine
