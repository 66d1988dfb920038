// Tests of the fidelity harness (bench/fidelity/fidelity.h) on a tiny random model.
#include "bench/fidelity/fidelity.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/fidelity/report.h"
#include "bench/fidelity/synthetic_prompt.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/model_presets.h"
#include "engine/selection/selection_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::bench {
namespace {

using ::testing::IsSupersetOf;

// llama-gqa preset (4 layers, 8 heads over 2 KV heads, head_dim 32), "trained-looking" weights.
std::unique_ptr<engine::Model> TinyModel() {
  engine::PresetOptions preset;
  preset.vocab_size = 512;
  absl::StatusOr<engine::ModelConfig> config = engine::PresetConfig("llama-gqa", preset);
  EXPECT_TRUE(config.ok()) << config.status();
  engine::DummyWeightOptions options;
  options.seed = 3;
  options.init = engine::DummyInit::kScaled;
  absl::StatusOr<engine::ModelWeights> weights = engine::LoadDummyWeights(*config, options);
  EXPECT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<engine::Model>> model =
      engine::Model::Create(*config, std::move(*weights));
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

void ExpectFinite(const LayerFidelity& l) {
  EXPECT_TRUE(std::isfinite(l.error_mean));
  EXPECT_TRUE(std::isfinite(l.error_max));
  EXPECT_TRUE(std::isfinite(l.error_true_mean));
  EXPECT_GE(l.coverage_min, 0.0);
  EXPECT_LE(l.coverage_mean, 1.0 + 1e-12);
}

// Policies added to the engine later must show up without changes here.
TEST(FidelityTest, AllPolicyNamesListsTheEnginePolicies) {
  const std::vector<std::string> names = AllPolicyNames();
  EXPECT_THAT(names, IsSupersetOf({"tokenselect", "topk", "head_vote", "dense", "streaming"}));
  for (size_t i = 0; i < names.size(); ++i) {
    const absl::StatusOr<engine::SelectionPolicyKind> kind = engine::ParsePolicy(names[i]);
    ASSERT_TRUE(kind.ok()) << names[i];
    EXPECT_EQ(engine::PolicyName(*kind), names[i]);
    EXPECT_EQ(static_cast<size_t>(*kind), i);
  }
}

TEST(FidelityTest, BudgetCoveringTheCacheIsExactlyDense) {
  const std::unique_ptr<engine::Model> model = TinyModel();
  const std::vector<int32_t> prompt = SyntheticPromptIds(512, 40, /*seed=*/5);
  FidelityOptions options;
  options.selection.n_init = 4;
  options.selection.k = 1024;
  options.selection.n_local = 16;
  options.selection.chunk_size = 16;  // three prefill chunks
  options.policies = AllPolicyNames();
  options.decode_steps = 3;
  options.continuation_tokens = 6;
  absl::StatusOr<FidelityReport> report = RunFidelity(*model, prompt, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->policies.size(), options.policies.size());
  EXPECT_EQ(report->dense_tokens.size(), 6u);
  for (const PolicyFidelity& p : report->policies) {
    SCOPED_TRACE(p.policy);
    ASSERT_EQ(p.decode_layers.size(), 4u);
    ASSERT_EQ(p.prefill_layers.size(), 4u);
    for (const auto* layers : {&p.decode_layers, &p.prefill_layers}) {
      for (const LayerFidelity& l : *layers) {
        EXPECT_GT(l.samples, 0);
        EXPECT_EQ(l.error_max, 0.0);
        EXPECT_EQ(l.error_true_mean, 0.0);
        EXPECT_DOUBLE_EQ(l.coverage_mean, 1.0);
        EXPECT_DOUBLE_EQ(l.coverage_min, 1.0);
        EXPECT_DOUBLE_EQ(l.attended_mean, l.cached_tokens_mean);
      }
    }
    ASSERT_EQ(p.kl.size(), 6u);
    for (double kl : p.kl) EXPECT_EQ(kl, 0.0);
    EXPECT_EQ(p.agreement, 1.0);
    EXPECT_EQ(p.first_divergence, -1);
    EXPECT_EQ(p.tokens, report->dense_tokens);
  }
  EXPECT_NE(FormatReport(*report).find("== tokenselect =="), std::string::npos);
  EXPECT_NE(ReportToJson(*report).find("\"coverage_mean\""), std::string::npos);
}

TEST(FidelityTest, TinyBudgetTokenSelectCoversMoreMassThanStreaming) {
  const std::unique_ptr<engine::Model> model = TinyModel();
  const std::vector<int32_t> prompt = SyntheticPromptIds(512, 512, /*seed=*/5);
  FidelityOptions options;
  options.selection.n_init = 4;
  options.selection.k = 16;
  options.selection.n_local = 16;
  options.selection.chunk_size = 128;
  options.policies = {"tokenselect", "streaming"};
  options.decode_steps = 4;
  options.continuation_tokens = 4;
  absl::StatusOr<FidelityReport> report = RunFidelity(*model, prompt, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->policies.size(), 2u);
  for (const PolicyFidelity& p : report->policies) {
    SCOPED_TRACE(p.policy);
    for (const auto* layers : {&p.decode_layers, &p.prefill_layers}) {
      for (const LayerFidelity& l : *layers) {
        ExpectFinite(l);
        EXPECT_GT(l.error_mean, 0.0);  // a real selection: 36 of 512+ tokens
        EXPECT_LT(l.coverage_mean, 1.0);
      }
    }
    // Every policy attends the same number of cached tokens at equal budget.
    EXPECT_DOUBLE_EQ(MeanOverLayers(p.decode_layers).attended_mean, 36.0);
    for (double kl : p.kl) {
      EXPECT_TRUE(std::isfinite(kl));
      EXPECT_GE(kl, -1e-9);
    }
    EXPECT_GE(p.agreement, 0.0);
    EXPECT_LE(p.agreement, 1.0);
  }
  const PolicyFidelity& tokenselect = report->policies[0];
  const PolicyFidelity& streaming = report->policies[1];
  EXPECT_GE(MeanOverLayers(tokenselect.decode_layers).coverage_mean,
            MeanOverLayers(streaming.decode_layers).coverage_mean);
  EXPECT_GE(MeanOverLayers(tokenselect.prefill_layers).coverage_mean,
            MeanOverLayers(streaming.prefill_layers).coverage_mean);
}

// --kv_dtype fp8: with a budget covering the cache, "dense" (every token) differs from the
// reference by the FP8 cache alone; the probe's error is the quantization's, small but not 0.
TEST(FidelityTest, Fp8CacheAloneIsMeasuredAgainstTheExactDense) {
  const std::unique_ptr<engine::Model> model = TinyModel();
  const std::vector<int32_t> prompt = SyntheticPromptIds(512, 40, /*seed=*/5);
  FidelityOptions options;
  options.selection.n_init = 4;
  options.selection.k = 1024;
  options.selection.n_local = 16;
  options.selection.chunk_size = 16;
  options.policies = {"dense", "tokenselect"};
  options.decode_steps = 3;
  options.continuation_tokens = 6;
  options.kv_dtype = engine::KvCacheDType::kFP8E4M3;
  absl::StatusOr<FidelityReport> report = RunFidelity(*model, prompt, options);
  ASSERT_TRUE(report.ok()) << report.status();
  for (const PolicyFidelity& p : report->policies) {
    SCOPED_TRACE(p.policy);
    for (const auto* layers : {&p.decode_layers, &p.prefill_layers}) {
      for (const LayerFidelity& l : *layers) {
        EXPECT_GT(l.error_mean, 0.0);   // quantized K/V
        EXPECT_LT(l.error_max, 0.25);   // e4m3: a few percent per value
        EXPECT_DOUBLE_EQ(l.coverage_mean, 1.0);  // every token is still attended
      }
    }
    EXPECT_GT(p.kl_max, 0.0);
    for (double kl : p.kl) EXPECT_TRUE(std::isfinite(kl));
  }
  // Same budget covering everything: both policies are the same FP8 dense run.
  EXPECT_EQ(report->policies[0].kl, report->policies[1].kl);
  EXPECT_NE(FormatReport(*report).find("KV cache fp8"), std::string::npos);
  EXPECT_NE(ReportToJson(*report).find("\"kv_dtype\": \"fp8\""), std::string::npos);
}

TEST(FidelityTest, RejectsBadInput) {
  const std::unique_ptr<engine::Model> model = TinyModel();
  const std::vector<int32_t> prompt = SyntheticPromptIds(512, 8, 1);
  FidelityOptions options;
  options.policies = {"no_such_policy"};
  EXPECT_EQ(RunFidelity(*model, prompt, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.policies = {"tokenselect"};
  EXPECT_EQ(RunFidelity(*model, {}, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.continuation_tokens = 0;
  EXPECT_EQ(RunFidelity(*model, prompt, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FidelityTest, SyntheticPromptsAreDeterministicAndInRange) {
  const std::vector<int32_t> a = SyntheticPromptIds(100, 300, 9);
  EXPECT_EQ(a, SyntheticPromptIds(100, 300, 9));
  EXPECT_NE(a, SyntheticPromptIds(100, 300, 10));
  ASSERT_EQ(a.size(), 300u);
  for (int32_t id : a) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 100);
  }
  EXPECT_EQ(SyntheticText(20, 4), SyntheticText(20, 4));
}

}  // namespace
}  // namespace tokenselect::bench
