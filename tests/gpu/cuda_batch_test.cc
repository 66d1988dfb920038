// Several sequences in one CudaModel: the shared page pool (reservation, exhaustion, return of
// pages) and DecodeBatch, whose rows must match running each sequence on its own (Forward of
// one token), teacher-forced with the same tokens, for dense attention and for TokenSelect with
// one GPU selection provider per sequence. The two paths differ only in the GEMMs' row count
// (cuBLASLt may pick other kernels), so logits agree to rounding, not bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_presets.h"
#include "engine/selection/cuda_selection.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::engine {
namespace {

int32_t Argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

class CudaBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PresetOptions preset;
    preset.vocab_size = 2048;
    auto config = PresetConfig("llama3-rope", preset);  // head_dim 64: GPU TokenSelect runs
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    DummyWeightOptions dummy;
    dummy.init = DummyInit::kHuggingFace;
    dummy.seed = 3;
    CudaModelOptions options;
    options.max_tokens = 4096;
    options.page_size = 16;
    options.max_chunk = 128;
    options.max_batch = 8;
    auto model = CudaModel::CreateDummy(config_, dummy, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  std::vector<int32_t> Prompt(int64_t n, int64_t salt) const {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>(3 + (i * 7919 + salt * 104729) % (config_.vocab_size - 3));
    }
    return ids;
  }

  ModelConfig config_;
  std::unique_ptr<CudaModel> model_;
};

TEST_F(CudaBatchTest, SequencesShareThePagePool) {
  const int64_t total = model_->num_pages();
  EXPECT_EQ(model_->free_pages(), total);
  {
    auto a = model_->NewSequence(1000);  // 63 pages of 16
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(model_->free_pages(), total - 63);
    auto too_big = model_->NewSequence(4096);
    ASSERT_FALSE(too_big.ok());
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(too_big.status().message().find("free"), std::string::npos);
    auto b = model_->NewSequence(4096 - 63 * 16);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(model_->free_pages(), 0);
    // A sequence refuses tokens past its capacity and appends nothing.
    std::vector<float> logits;
    const std::vector<int32_t> prompt = Prompt(1001, 1);
    EXPECT_EQ(model_->Forward(a->get(), prompt, nullptr, &logits).code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ((*a)->length(), 0);
    EXPECT_EQ(model_->NewSequence(0).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(model_->free_pages(), total);  // both sequences returned their pages
}

TEST_F(CudaBatchTest, DecodeBatchMatchesOneSequenceAtATime) {
  for (const bool tokenselect : {false, true}) {
    constexpr int kBatch = 3, kSteps = 12;
    SelectionOptions sel;
    sel.policy = tokenselect ? SelectionPolicyKind::kTokenSelect : SelectionPolicyKind::kDense;
    sel.n_init = 8;
    sel.k = 64;
    sel.n_local = 32;
    sel.chunk_size = 128;
    std::vector<std::unique_ptr<CudaSequence>> batched, single;
    std::vector<std::unique_ptr<CudaSelectionAttention>> batched_sel, single_sel;
    std::vector<int32_t> next(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      for (auto* set : {&batched, &single}) {
        auto seq = model_->NewSequence(600);
        ASSERT_TRUE(seq.ok()) << seq.status();
        set->push_back(std::move(*seq));
      }
      for (auto* set : {&batched_sel, &single_sel}) {
        auto provider = CudaSelectionAttention::Create(sel, config_, 600, 128);
        ASSERT_TRUE(provider.ok()) << provider.status();
        set->push_back(std::move(*provider));
      }
      const std::vector<int32_t> prompt = Prompt(150 + 97 * b, b);  // past the budget of 104
      std::vector<float> logits;
      for (int64_t begin = 0; begin < static_cast<int64_t>(prompt.size()); begin += 128) {
        const auto piece = absl::MakeConstSpan(prompt).subspan(
            begin, std::min<int64_t>(128, static_cast<int64_t>(prompt.size()) - begin));
        ASSERT_TRUE(model_->Forward(batched[b].get(), piece, batched_sel[b].get(), nullptr).ok());
        ASSERT_TRUE(model_->Forward(single[b].get(), piece, single_sel[b].get(), &logits).ok());
      }
      next[b] = Argmax(logits.data(), config_.vocab_size);
    }
    double worst = 0;
    int agree = 0;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<CudaSequence*> seqs;
      std::vector<CudaAttentionProvider*> providers;
      for (int b = 0; b < kBatch; ++b) {
        seqs.push_back(batched[b].get());
        providers.push_back(batched_sel[b].get());
      }
      std::vector<float> batch_logits;
      ASSERT_TRUE(model_->DecodeBatch(seqs, next, providers, &batch_logits).ok());
      auto greedy = model_->GreedyTokens();
      ASSERT_TRUE(greedy.ok());
      ASSERT_EQ(greedy->size(), static_cast<size_t>(kBatch));
      for (int b = 0; b < kBatch; ++b) {
        std::vector<float> logits;
        ASSERT_TRUE(model_->Forward(single[b].get(), absl::MakeConstSpan(&next[b], 1),
                                    single_sel[b].get(), &logits)
                        .ok());
        const float* row = batch_logits.data() + b * config_.vocab_size;
        const double rel = gpu_test::RelativeL2(row, logits.data(), config_.vocab_size);
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 1e-2) << "step " << step << " row " << b;
        EXPECT_EQ((*greedy)[b], Argmax(row, config_.vocab_size));
        agree += Argmax(row, config_.vocab_size) == Argmax(logits.data(), config_.vocab_size);
        next[b] = Argmax(logits.data(), config_.vocab_size);  // teacher-forced: both paths
      }
      for (int b = 0; b < kBatch; ++b) {
        EXPECT_EQ(batched[b]->length(), single[b]->length());
      }
    }
    std::printf("%s: DecodeBatch vs one sequence at a time: logits rel L2 worst %.3g, argmax "
                "agreement %d/%d\n",
                tokenselect ? "tokenselect" : "dense", worst, agree, kBatch * kSteps);
    EXPECT_GE(agree * 10, kBatch * kSteps * 9);
  }
}

TEST_F(CudaBatchTest, DecodeBatchRejectsBadBatches) {
  auto a = model_->NewSequence(16);
  auto b = model_->NewSequence(16);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> logits;
  const std::vector<CudaAttentionProvider*> none2 = {nullptr, nullptr};
  const std::vector<int32_t> two = {5, 6};
  EXPECT_EQ(model_->DecodeBatch({}, {}, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  std::vector<CudaSequence*> dup = {a->get(), a->get()};
  EXPECT_EQ(model_->DecodeBatch(dup, two, none2, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<CudaSequence*> pair = {a->get(), b->get()};
  EXPECT_EQ(model_->DecodeBatch(pair, {5}, none2, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->DecodeBatch(pair, {5, -2}, none2, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<CudaSequence*> nine(9, a->get());
  EXPECT_EQ(model_->DecodeBatch(nine, std::vector<int32_t>(9, 5),
                                std::vector<CudaAttentionProvider*>(9, nullptr), &logits)
                .code(),
            absl::StatusCode::kInvalidArgument);  // over max_batch 8
  // Fill b, then a batch including it is refused before anything runs.
  ASSERT_TRUE(model_->Forward(b->get(), std::vector<int32_t>(16, 7), nullptr, nullptr).ok());
  EXPECT_EQ(model_->DecodeBatch(pair, two, none2, &logits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*a)->length(), 0);
  // A valid batch runs; both rows get logits.
  (*b)->Reset();
  ASSERT_TRUE(model_->DecodeBatch(pair, two, none2, &logits).ok());
  EXPECT_EQ(logits.size(), static_cast<size_t>(2 * config_.vocab_size));
  EXPECT_EQ((*a)->length(), 1);
  EXPECT_EQ((*b)->length(), 1);
}

}  // namespace
}  // namespace tokenselect::engine
