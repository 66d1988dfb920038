#include "engine/model/dummy_weights.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/model_presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig Small() {
  PresetOptions options;
  options.vocab_size = 300;
  return PresetConfig("qwen2-bias", options).value();
}

TEST(DummyWeightsTest, DeterministicAndSeeded) {
  const ModelConfig config = Small();
  const ModelWeights a = LoadDummyWeights(config, 7).value();
  const ModelWeights b = LoadDummyWeights(config, 7).value();
  const ModelWeights c = LoadDummyWeights(config, 8).value();
  EXPECT_EQ(a.embed_tokens, b.embed_tokens);
  EXPECT_EQ(a.layers[3].down_proj, b.layers[3].down_proj);
  EXPECT_NE(a.embed_tokens, c.embed_tokens);
  // Different tensors of one model are different streams.
  EXPECT_NE(std::vector<float>(a.layers[0].gate_proj.begin(), a.layers[0].gate_proj.begin() + 64),
            std::vector<float>(a.layers[0].up_proj.begin(), a.layers[0].up_proj.begin() + 64));
}

// The generator is integer hashing plus exactly rounded fp64: these bits are the same on every
// platform. A change here changes every dummy model and test checkpoint.
TEST(DummyWeightsTest, GoldenValues) {
  EXPECT_EQ(DummyNormal(0, 0), DummyNormal(0, 0));
  const double v0 = DummyNormal(0, 0);
  const double v1 = DummyNormal(12345, 678);
  uint64_t bits0, bits1;
  std::memcpy(&bits0, &v0, 8);
  std::memcpy(&bits1, &v1, 8);
  EXPECT_EQ(bits0, 0x3ff6dba01a3a2ca4u);
  EXPECT_EQ(bits1, 0x3fdb2bea81ce932bu);
  DummyWeightOptions options;
  options.seed = 42;
  float out[3];
  FillDummyTensor("model.embed_tokens.weight", WeightKind::kEmbedding, 256, options, 1000, 3, out);
  EXPECT_EQ(out[0], -0x1.c0882ap-9f);
  EXPECT_EQ(out[2], -0x1.111c1ap-6f);
}

TEST(DummyWeightsTest, NormalLikeMoments) {
  double sum = 0, sum2 = 0, sum4 = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const double z = DummyNormal(99, i);
    ASSERT_LE(std::abs(z), 2 * std::sqrt(3.0));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sum2 / n, 1.0, 0.005);
  EXPECT_NEAR(sum4 / n, 2.7, 0.02);  // Irwin-Hall(4): excess kurtosis -6 / (5 * 4)
}

TEST(DummyWeightsTest, HuggingFaceAndScaledInit) {
  const ModelConfig config = Small();
  const ModelWeights hf = LoadDummyWeights(config, 1).value();
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    return std::sqrt(s2 / v.size() - (s / v.size()) * (s / v.size()));
  };
  EXPECT_NEAR(stddev(hf.embed_tokens), 0.02, 0.001);
  EXPECT_NEAR(stddev(hf.layers[0].q_proj), 0.02, 0.001);
  EXPECT_NEAR(stddev(hf.layers[0].q_bias), 0.02, 0.005);
  for (float w : hf.layers[2].post_attention_layernorm) ASSERT_EQ(w, 1.0f);
  for (float w : hf.norm) ASSERT_EQ(w, 1.0f);

  DummyWeightOptions scaled;
  scaled.init = DummyInit::kScaled;
  const ModelWeights s = LoadDummyWeights(config, scaled).value();
  EXPECT_NEAR(stddev(s.layers[0].q_proj), 2.0 / 16, 0.002);  // fan_in 256, gain 2
  EXPECT_NEAR(stddev(s.layers[0].v_proj), 1.0 / 16, 0.002);
  EXPECT_NEAR(stddev(s.layers[0].down_proj), 1.0 / std::sqrt(512.0), 0.002);
  EXPECT_NEAR(stddev(s.embed_tokens), 1.0 / 16, 0.002);
  EXPECT_NEAR(stddev(s.norm), 0.1, 0.02);
}

TEST(DummyWeightsTest, ChunksMatchTheWholeTensor) {
  const ModelConfig config = Small();
  DummyWeightOptions options;
  options.seed = 5;
  options.init = DummyInit::kScaled;
  const ModelWeights w = LoadDummyWeights(config, options).value();
  for (const ConstWeightEntry& e : ListWeights(config, w)) {
    const int64_t n = e.num_elements();
    const int64_t begin = n / 3, count = std::min<int64_t>(n - begin, 1000);
    std::vector<float> chunk(count);
    FillDummyTensor(e.name, e.kind, e.fan_in, options, begin, count, chunk.data());
    ASSERT_EQ(chunk, std::vector<float>(e.data->begin() + begin, e.data->begin() + begin + count))
        << e.name;
  }
}

TEST(DummyWeightsTest, RefusesTooLargeAndInvalidConfigs) {
  ModelConfig llama8b = Small();
  llama8b.architecture = Architecture::kLlama;
  llama8b.qkv_bias = false;
  llama8b.tie_word_embeddings = false;
  llama8b.hidden_size = 4096;
  llama8b.intermediate_size = 14336;
  llama8b.num_layers = 32;
  llama8b.num_heads = 32;
  llama8b.num_kv_heads = 8;
  llama8b.head_dim = llama8b.rope.head_dim = 128;
  llama8b.vocab_size = 128256;
  EXPECT_EQ(NumParameters(llama8b), 8030261248);
  absl::StatusOr<ModelWeights> w = LoadDummyWeights(llama8b, 0);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(w.status().message(), HasSubstr("29.9 GiB in fp32"));
  ModelConfig bad = Small();
  bad.num_kv_heads = 3;
  EXPECT_EQ(LoadDummyWeights(bad, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tokenselect::engine
