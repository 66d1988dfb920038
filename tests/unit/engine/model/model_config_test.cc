#include "engine/model/model_config.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Llama-3.1-8B's config.json (abridged to the fields that matter).
Json Llama31() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "attention_bias": false, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

absl::StatusOr<ModelConfig> Parse(const Json& json) { return ParseModelConfig(json.dump()); }

void ExpectError(const Json& json, absl::StatusCode code, const std::string& message) {
  absl::StatusOr<ModelConfig> config = Parse(json);
  ASSERT_FALSE(config.ok()) << json.dump();
  EXPECT_EQ(config.status().code(), code) << config.status();
  EXPECT_EQ(config.status().message(), message);
}

TEST(ModelConfigTest, Llama31) {
  ModelConfig c = Parse(Llama31()).value();
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.group_size(), 4);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_THAT(c.bos_token_ids, ElementsAre(128000));
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  kernels::RopeParams rope = ToRopeParams(c);
  EXPECT_EQ(rope.head_dim, 128);
  EXPECT_DOUBLE_EQ(rope.theta, 500000.0);
  EXPECT_EQ(rope.scaling, kernels::RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(rope.high_freq_factor, 4.0);
  EXPECT_EQ(rope.original_max_position, 8192);
}

TEST(ModelConfigTest, Llama2DefaultsAndSingleEos) {
  Json j = Llama31();
  j.erase("num_key_value_heads");
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("rms_norm_eps");
  j["eos_token_id"] = 2;
  j["bos_token_id"] = 1;
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::kNone);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
  // Nulls count as absent.
  j["num_key_value_heads"] = nullptr;
  j["rope_scaling"] = nullptr;
  j["eos_token_id"] = nullptr;
  c = Parse(j).value();
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfigTest, LinearScalingWithLegacyTypeKey) {
  Json j = Llama31();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(Parse(j).value().rope.scaling, kernels::RopeScaling::kNone);
}

TEST(ModelConfigTest, Transformers5RopeParameters) {
  Json j = Llama31();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 250000.0},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 250000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.torch_dtype, "float32");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = Parse(j).value();
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::kNone);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBias) {
  Json j = Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": true,
    "use_sliding_window": false, "sliding_window": 32768, "bos_token_id": 151643,
    "eos_token_id": 151643, "torch_dtype": "bfloat16", "hidden_act": "silu"})");
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.architecture, Architecture::kQwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.group_size(), 7);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  j["attention_bias"] = false;  // not Qwen2's switch: ignored
  EXPECT_TRUE(Parse(j).value().qkv_bias);
}

TEST(ModelConfigTest, MistralWithExplicitHeadDim) {
  Json j = Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120,
    "head_dim": 128, "intermediate_size": 14336, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 131072,
    "rope_theta": 1000000.0, "sliding_window": null, "max_position_embeddings": 1024000,
    "bos_token_id": 1, "eos_token_id": 2})");
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);  // != hidden_size
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  j["sliding_window"] = 4096;
  EXPECT_EQ(Parse(j).value().sliding_window, 4096);
}

TEST(ModelConfigTest, ArchitectureFromModelTypeAlone) {
  Json j = Llama31();
  j.erase("architectures");
  EXPECT_EQ(Parse(j).value().architecture, Architecture::kLlama);
  j["model_type"] = "gpt2";
  ExpectError(j, absl::StatusCode::kUnimplemented,
              "config.json: model_type 'gpt2' is not supported (supported: llama, qwen2, "
              "mistral)");
  j.erase("model_type");
  ExpectError(j, absl::StatusCode::kInvalidArgument,
              "config.json: architectures is missing (and so is model_type)");
}

TEST(ModelConfigTest, Errors) {
  using absl::StatusCode;
  Json j = Llama31();
  j["num_key_value_heads"] = 5;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: num_key_value_heads (5) must divide num_attention_heads (32)");
  j = Llama31();
  j["num_key_value_heads"] = 64;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: num_key_value_heads (64) must divide num_attention_heads (32)");
  j = Llama31();
  j["architectures"] = {"GPTNeoXForCausalLM"};
  ExpectError(j, StatusCode::kUnimplemented,
              "config.json: architecture GPTNeoXForCausalLM is not supported (supported: "
              "LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)");
  j = Llama31();
  j["architectures"] = Json::array();
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: architectures must be a non-empty list of names, got []");
  j = Llama31();
  j.erase("hidden_size");
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: hidden_size is missing");
  j = Llama31();
  j["num_hidden_layers"] = "32";
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: num_hidden_layers must be an integer, got \"32\"");
  j = Llama31();
  j["intermediate_size"] = 14336.5;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: intermediate_size must be an integer, got 14336.5");
  j = Llama31();
  j["vocab_size"] = 0;
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: vocab_size (0) must be positive");
  j = Llama31();
  j["num_attention_heads"] = 30;
  j["num_key_value_heads"] = 10;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: hidden_size (4096) must be divisible by num_attention_heads (30) "
              "when head_dim is not given");
  j["head_dim"] = 127;
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: head_dim (127) must be even for RoPE");
  j = Llama31();
  j["rms_norm_eps"] = -1;
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: rms_norm_eps (-1) must be positive");
  j = Llama31();
  j["rms_norm_eps"] = "small";
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rms_norm_eps must be a number, got \"small\"");
  j = Llama31();
  j["tie_word_embeddings"] = 1;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: tie_word_embeddings must be true or false, got 1");
  j = Llama31();
  j["hidden_act"] = "gelu";
  ExpectError(j, StatusCode::kUnimplemented,
              "config.json: hidden_act \"gelu\" is not supported (only silu)");
  j = Llama31();
  j["eos_token_id"] = {1, "x"};
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: eos_token_id must be a token id or a list of them, got [1,\"x\"]");
  j = Llama31();
  j["bos_token_id"] = 200000;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: bos_token_id (200000) must be below vocab_size (128256)");
  j = Llama31();
  j["torch_dtype"] = 16;
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: torch_dtype must be a string, got 16");
  j = Llama31();
  j["partial_rotary_factor"] = 0.5;
  ExpectError(j, StatusCode::kUnimplemented,
              "config.json: partial_rotary_factor 0.5 is not supported (only 1.0)");
}

TEST(ModelConfigTest, RopeErrors) {
  using absl::StatusCode;
  Json j = Llama31();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectError(j, StatusCode::kUnimplemented,
              "config.json: rope_scaling type 'yarn' is not supported (supported: default, "
              "linear, llama3)");
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ExpectError(j, StatusCode::kUnimplemented,
              "config.json: rope_scaling type 'dynamic' is not supported (supported: default, "
              "linear, llama3)");
  j["rope_scaling"] = {{"type", "linear"}};
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling.factor is missing (rope type linear)");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 0}};
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: rope_scaling.factor must be positive");
  j = Llama31();
  j["rope_scaling"].erase("low_freq_factor");
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling.low_freq_factor is missing (rope type llama3)");
  j = Llama31();
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling.high_freq_factor (1) must be greater than "
              "low_freq_factor (1)");
  j = Llama31();
  j["rope_scaling"].erase("original_max_position_embeddings");
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling.original_max_position_embeddings must be a positive "
              "integer (rope type llama3)");
  j = Llama31();
  j["rope_scaling"] = "llama3";
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling must be an object, got \"llama3\"");
  j = Llama31();
  j["rope_theta"] = 0;
  ExpectError(j, StatusCode::kInvalidArgument, "config.json: rope_theta must be positive");
  j = Llama31();
  j["rope_scaling"]["rope_type"] = 3;
  ExpectError(j, StatusCode::kInvalidArgument,
              "config.json: rope_scaling.rope_type must be a string, got 3");
}

TEST(ModelConfigTest, InvalidJson) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("{\"hidden_size\": 12,");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("config.json: invalid JSON: "));
  c = ParseModelConfig("[1, 2]");
  EXPECT_EQ(c.status().message(), "config.json: not a JSON object");
}

TEST(ModelConfigTest, LoadFromDirectory) {
  const std::string dir = ::testing::TempDir() + "/model_config_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/config.json");
    out << Llama31().dump(2);
  }
  EXPECT_EQ(LoadModelConfig(dir).value().vocab_size, 128256);
  {
    std::ofstream out(dir + "/config.json");
    out << "{\"architectures\": [\"LlamaForCausalLM\"]}";
  }
  absl::StatusOr<ModelConfig> bad = LoadModelConfig(dir);
  EXPECT_EQ(bad.status().message(), dir + ": config.json: hidden_size is missing");
  EXPECT_EQ(LoadModelConfig(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelConfigTest, ValidateCatchesHandBuiltConfigs) {
  ModelConfig c = Parse(Llama31()).value();
  EXPECT_TRUE(ValidateModelConfig(c).ok());
  c.head_dim = 64;  // rope.head_dim still 128
  EXPECT_FALSE(ValidateModelConfig(c).ok());
  c = Parse(Llama31()).value();
  c.num_kv_heads = 0;
  EXPECT_EQ(ValidateModelConfig(c).message(),
            "config.json: num_key_value_heads (0) must be positive");
}

}  // namespace
}  // namespace tokenselect::engine
