#include "engine/model/checkpoint_writer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/dummy_weights.h"
#include "engine/model/model_presets.h"
#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CheckpointWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_writer_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  static void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
    EXPECT_EQ(a.architecture, b.architecture);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.num_layers, b.num_layers);
    EXPECT_EQ(a.num_heads, b.num_heads);
    EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.qkv_bias, b.qkv_bias);
    EXPECT_EQ(a.o_bias, b.o_bias);
    EXPECT_EQ(a.mlp_bias, b.mlp_bias);
    EXPECT_EQ(a.sliding_window, b.sliding_window);
    EXPECT_EQ(a.rope.theta, b.rope.theta);
    EXPECT_EQ(a.rope.scaling, b.rope.scaling);
    if (a.rope.scaling != kernels::RopeScaling::kNone) {
      EXPECT_EQ(a.rope.factor, b.rope.factor);
    }
    if (a.rope.scaling == kernels::RopeScaling::kLlama3) {
      EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
      EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
      EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
    }
    EXPECT_EQ(a.bos_token_ids, b.bos_token_ids);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  }

  std::string dir_;
};

TEST_F(CheckpointWriterTest, PresetsRoundTripThroughConfigAndWeights) {
  for (const std::string& preset : PresetNames()) {
    SCOPED_TRACE(preset);
    PresetOptions options;
    options.vocab_size = 320;
    options.seed = 11;
    const std::string dir = dir_ + "/" + preset;
    ASSERT_TRUE(WritePresetCheckpoint(dir, preset, options).ok());
    const ModelConfig expected = PresetConfig(preset, options).value();
    const ModelConfig config = LoadModelConfig(dir).value();
    ExpectSameConfig(config, expected);
    EXPECT_EQ(config.torch_dtype, "float32");
    EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
    const ModelWeights loaded = LoadWeights(config, dir).value();
    DummyWeightOptions dummy;
    dummy.seed = 11;
    dummy.init = DummyInit::kScaled;
    const ModelWeights original = LoadDummyWeights(expected, dummy).value();
    EXPECT_EQ(loaded.embed_tokens, original.embed_tokens);
    EXPECT_EQ(loaded.layers[3].down_proj, original.layers[3].down_proj);
    EXPECT_EQ(loaded.layers[2].q_bias, original.layers[2].q_bias);
    EXPECT_EQ(loaded.norm, original.norm);
    EXPECT_EQ(loaded.lm_head_weight, original.lm_head_weight);
    auto file = SafetensorsFile::Open(dir + "/model.safetensors").value();
    EXPECT_EQ(file->metadata().at("format"), "pt");
  }
}

TEST_F(CheckpointWriterTest, ConfigJsonIsHuggingFaceShaped) {
  PresetOptions options;
  options.vocab_size = 1000;
  const ModelConfig llama3 = PresetConfig("llama3-rope", options).value();
  const nlohmann::json j = nlohmann::json::parse(ModelConfigJson(llama3, DType::kBF16));
  EXPECT_EQ(j["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 256);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["bos_token_id"], 1);
  EXPECT_EQ(j["eos_token_id"], 2);
  ModelConfig qwen = PresetConfig("qwen2-bias", options).value();
  qwen.eos_token_ids = {2, 3};
  const nlohmann::json q = nlohmann::json::parse(ModelConfigJson(qwen, DType::kF32));
  EXPECT_EQ(q["model_type"], "qwen2");
  EXPECT_EQ(q["use_sliding_window"], false);
  EXPECT_TRUE(q["sliding_window"].is_null());
  EXPECT_EQ(q["tie_word_embeddings"], true);
  EXPECT_EQ(q["eos_token_id"], nlohmann::json({2, 3}));
  EXPECT_FALSE(q.contains("attention_bias"));
  EXPECT_EQ(nlohmann::json::parse(GenerationConfigJson(qwen)),
            nlohmann::json::parse(R"({"bos_token_id": 1, "eos_token_id": [2, 3]})"));

  // Mistral and linear scaling survive the round trip too.
  ModelConfig mistral = llama3;
  mistral.architecture = Architecture::kMistral;
  mistral.sliding_window = 4096;
  mistral.rope.scaling = kernels::RopeScaling::kLinear;
  mistral.rope.factor = 2.0;
  ExpectSameConfig(ParseModelConfig(ModelConfigJson(mistral, DType::kF32)).value(), mistral);
  ModelConfig biased = llama3;
  biased.qkv_bias = biased.o_bias = biased.mlp_bias = true;
  biased.bos_token_ids.clear();
  ExpectSameConfig(ParseModelConfig(ModelConfigJson(biased, DType::kF32)).value(), biased);
}

TEST_F(CheckpointWriterTest, ShardsWithIndexAndBf16) {
  PresetOptions options;
  options.vocab_size = 64;
  const ModelConfig config = PresetConfig("llama-gqa", options).value();
  const ModelWeights weights = LoadDummyWeights(config, 2).value();
  CheckpointOptions checkpoint;
  checkpoint.dtype = DType::kBF16;
  checkpoint.max_shard_bytes = 1 << 20;  // the model is ~4.5 MB in bf16
  ASSERT_TRUE(WriteCheckpoint(dir_, config, weights, checkpoint).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/model.safetensors"));
  const nlohmann::json index = nlohmann::json::parse(Read(dir_ + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], NumParameters(config) * 2);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00005-of-00005.safetensors");
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    if (entry.path().extension() == ".safetensors") {
      EXPECT_LE(entry.file_size(), (1u << 20) + 4096) << entry.path();
    }
  }
  EXPECT_EQ(LoadModelConfig(dir_).value().torch_dtype, "bfloat16");
  const ModelWeights loaded = LoadWeights(config, dir_).value();
  for (size_t i = 0; i < weights.layers[2].gate_proj.size(); ++i) {
    ASSERT_EQ(loaded.layers[2].gate_proj[i],
              Bf16ToFloat(FloatToBf16(weights.layers[2].gate_proj[i])));
  }
  // Rewriting unsharded removes the index.
  ASSERT_TRUE(WriteCheckpoint(dir_, config, weights).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/model.safetensors.index.json"));
  EXPECT_EQ(LoadWeights(config, dir_).value().layers[2].gate_proj, weights.layers[2].gate_proj);
}

TEST_F(CheckpointWriterTest, DummyCheckpointStreamsTheSameWeights) {
  PresetOptions options;
  options.vocab_size = 64;
  const ModelConfig config = PresetConfig("qwen2-bias", options).value();
  DummyWeightOptions dummy;
  dummy.seed = 9;
  CheckpointOptions checkpoint;
  checkpoint.max_shard_bytes = 2 << 20;
  ASSERT_TRUE(WriteDummyCheckpoint(dir_, config, dummy, checkpoint).ok());
  const ModelWeights expected = LoadDummyWeights(config, dummy).value();
  const ModelWeights loaded = LoadWeights(LoadModelConfig(dir_).value(), dir_).value();
  EXPECT_EQ(loaded.embed_tokens, expected.embed_tokens);
  EXPECT_EQ(loaded.layers[3].v_bias, expected.layers[3].v_bias);
  EXPECT_EQ(loaded.layers[0].down_proj, expected.layers[0].down_proj);
}

TEST_F(CheckpointWriterTest, Errors) {
  PresetOptions options;
  EXPECT_EQ(PresetConfig("gpt2", options).status().message(),
            "no model preset 'gpt2' (presets: llama-gqa, qwen2-bias, llama3-rope)");
  options.eos_token_id = 600;
  EXPECT_EQ(PresetConfig("llama-gqa", options).status().message(),
            "config.json: eos_token_id (600) must be below vocab_size (512)");
  options.eos_token_id = -1;
  options.bos_token_id = -1;
  EXPECT_TRUE(PresetConfig("llama-gqa", options).value().eos_token_ids.empty());

  const ModelConfig config = PresetConfig("qwen2-bias", PresetOptions()).value();
  ModelWeights weights = LoadDummyWeights(config, 1).value();
  ModelConfig no_bias = config;
  no_bias.qkv_bias = false;
  EXPECT_THAT(WriteCheckpoint(dir_, no_bias, weights).message(),
              HasSubstr("config.json cannot express these biases for Qwen2ForCausalLM"));
  CheckpointOptions i8;
  i8.dtype = DType::kI8;
  EXPECT_THAT(WriteCheckpoint(dir_, config, weights, i8).message(),
              HasSubstr("checkpoint dtype must be F32, F16 or BF16, not I8"));
  weights.norm.clear();
  EXPECT_THAT(WriteCheckpoint(dir_, config, weights).message(), HasSubstr("model.norm.weight"));
}

}  // namespace
}  // namespace tokenselect::engine
