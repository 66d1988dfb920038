// Needs a GPU (label gpu): the GPU forward pass (engine/model/cuda_model.h) against the CPU
// Model::Forward on the preset test models (engine/model/model_presets.h: the weights that
// WritePresetCheckpoint and the demo checkpoints write, built in memory here), vocab 2048.
//
// Oracle. These random "trained-looking" models are chaotic: rounding only the WEIGHTS to bf16
// and running the fp32 CPU model moves the logits by 2-10% (relative L2) and flips the greedy
// token within a few steps on most prompts (measured on the CPU, all three presets). So the GPU
// (bf16 weights, activations and KV) is checked against the CPU model run on the same
// bf16-rounded weights (what the GPU holds), teacher-forced: both are fed the prompt and then the
// oracle's own greedy tokens for 32 steps, and at every step the logits are compared and the
// GPU's argmax (kernels/cuda Argmax) against the oracle's. The first disagreeing step is how long
// a free-running GPU greedy continuation would have matched. The fp32-weight CPU model's
// distance is printed too.
// Tolerances (a broken layer gives O(1) errors): relative L2 vs the bf16-weight oracle: worst
// step <= 0.15, median <= 5e-2; argmax agreement on >= 75% of the teacher-forced steps.
// Also SimpleDecodeAttention (the any-head_dim path the head_dim-32 presets take) against
// cpu::GatherAttention, in simple_attention_test.cc.
#include "engine/model/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_presets.h"
#include "gtest/gtest.h"
#include "tests/gpu/cpu_oracle_test_util.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::engine {
namespace {

using gpu_test::CpuArgmax;
using gpu_test::RoundedToBf16;

class CudaModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelTest, TracksTheCpuForwardTeacherForced) {
  PresetOptions preset;
  preset.vocab_size = 2048;
  auto config = PresetConfig(GetParam(), preset);
  ASSERT_TRUE(config.ok()) << config.status();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kScaled;
  auto weights = LoadDummyWeights(*config, dummy);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto gpu = CudaModel::Create(*config, *weights, CudaModelOptions{256, 16});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto oracle = Model::Create(*config, RoundedToBf16(*weights));
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  auto fp32 = Model::Create(*config, *std::move(weights));
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  auto pool = PagePool::Create((*oracle)->KvCacheOptions(32, 16));
  ASSERT_TRUE(pool.ok()) << pool.status();

  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::uniform_int_distribution<int32_t> any_token(3, static_cast<int32_t>(preset.vocab_size - 1));
  constexpr int kPrompts = 4, kSteps = 32;
  std::vector<double> rel_oracle;
  double worst_fp32 = 0.0;
  int agree = 0, total = 0;
  for (int prompt_index = 0; prompt_index < kPrompts; ++prompt_index) {
    std::vector<int32_t> tokens(static_cast<size_t>(5 + 17 * prompt_index));
    for (int32_t& t : tokens) t = any_token(rng);
    TokenTable table_o(pool->get(), "oracle"), table_f(pool->get(), "fp32");
    ForwardWorkspace ws_o, ws_f;
    std::vector<float> oracle_logits, fp32_logits, gpu_logits;
    (*gpu)->Reset();
    int first_disagreement = kSteps;
    for (int step = 0; step < kSteps; ++step) {
      ForwardRequest request;
      request.tokens = tokens;
      request.table = &table_o;
      ASSERT_TRUE((*oracle)->Forward(request, &ws_o, &oracle_logits).ok());
      request.table = &table_f;
      ASSERT_TRUE((*fp32)->Forward(request, &ws_f, &fp32_logits).ok());
      ASSERT_TRUE((*gpu)->Forward(tokens, &gpu_logits).ok());
      rel_oracle.push_back(
          gpu_test::RelativeL2(gpu_logits.data(), oracle_logits.data(), oracle_logits.size()));
      worst_fp32 = std::max(worst_fp32, gpu_test::RelativeL2(gpu_logits.data(), fp32_logits.data(),
                                                             fp32_logits.size()));
      const int32_t want = CpuArgmax(oracle_logits);
      auto got = (*gpu)->GreedyToken();
      ASSERT_TRUE(got.ok()) << got.status();
      ++total;
      if (*got == want) {
        ++agree;
      } else if (first_disagreement == kSteps) {
        first_disagreement = step;
      }
      tokens = {want};  // teacher forcing: both continue with the oracle's token
    }
    std::printf("%s prompt %d: greedy continuation matches the oracle for %d of %d steps\n",
                GetParam().c_str(), prompt_index, first_disagreement, kSteps);
  }
  std::vector<double> sorted = rel_oracle;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], worst = sorted.back();
  std::printf(
      "%s: logits rel L2 vs bf16-weight oracle median %.3g worst %.3g; vs fp32 model "
      "worst %.3g; argmax agreement %d/%d\n",
      GetParam().c_str(), median, worst, worst_fp32, agree, total);
  EXPECT_LE(worst, 0.15);
  EXPECT_LE(median, 5e-2);
  EXPECT_GE(agree * 4, total * 3);
}

// The same presets with transformers' own init (weights N(0, 0.02), DummyInit::kHuggingFace):
// a quiet, near-linear model in which rounding does not get amplified, so the GPU must be within
// relative L2 2e-2 of the fp32 CPU model itself at every teacher-forced step.
TEST_P(CudaModelTest, QuietModelMatchesTheFp32Cpu) {
  PresetOptions preset;
  preset.vocab_size = 2048;
  auto config = PresetConfig(GetParam(), preset);
  ASSERT_TRUE(config.ok()) << config.status();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kHuggingFace;
  dummy.seed = 7;
  auto weights = LoadDummyWeights(*config, dummy);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto gpu = CudaModel::Create(*config, *weights, CudaModelOptions{128, 16});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = Model::Create(*config, *std::move(weights));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto pool = PagePool::Create((*cpu)->KvCacheOptions(8, 16));
  ASSERT_TRUE(pool.ok()) << pool.status();
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::uniform_int_distribution<int32_t> any_token(3, static_cast<int32_t>(preset.vocab_size - 1));
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = any_token(rng);
  TokenTable table(pool->get(), "req");
  std::vector<double> rel;
  int agree = 0;
  constexpr int kSteps = 32;
  ASSERT_NO_FATAL_FAILURE(
      gpu_test::TeacherForce(**cpu, &table, gpu->get(), tokens, kSteps, &rel, &agree));
  for (size_t step = 0; step < rel.size(); ++step) EXPECT_LE(rel[step], 2e-2) << "step " << step;
  const double worst = *std::max_element(rel.begin(), rel.end());
  std::printf("%s quiet init: logits rel L2 vs fp32 CPU worst %.3g; argmax agreement %d/%d\n",
              GetParam().c_str(), worst, agree, kSteps);
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaModelTest,
                         ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

}  // namespace
}  // namespace tokenselect::engine
