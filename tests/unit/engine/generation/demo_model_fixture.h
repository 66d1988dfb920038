// A test fixture over the generated demo checkpoint (engine/generation/demo_checkpoint.h),
// written and loaded once per test suite, with a fresh 256-page KV pool per test that must be
// empty again at the end (no leaked pages). Used by the generator and policy forward tests.
#ifndef TOKENSELECT_TESTS_UNIT_ENGINE_GENERATION_DEMO_MODEL_FIXTURE_H_
#define TOKENSELECT_TESTS_UNIT_ENGINE_GENERATION_DEMO_MODEL_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/generator.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {

class DemoModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = ::testing::TempDir() + "/demo_model_" +
                            ::testing::UnitTest::GetInstance()->current_test_suite()->name();
    ASSERT_TRUE(WriteDemoCheckpoint(dir, DemoCheckpointOptions{}).ok());
    auto loaded = LoadModelDirectory(dir, LoadFormat::kSafetensors);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    loaded_ = new LoadedModel(std::move(*loaded));
  }
  static void TearDownTestSuite() {
    delete loaded_;
    loaded_ = nullptr;
  }
  void SetUp() override {
    auto pool = PagePool::Create(loaded_->model->KvCacheOptions(/*num_pages=*/256, 16));
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }
  void TearDown() override { EXPECT_TRUE(pool_->CheckNoLeaks().ok()); }

  // A deterministic prompt of n ids (no special tokens).
  static std::vector<int32_t> Prompt(int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 7919 + 13) % 2000);
    return ids;
  }
  static GenerationOptions Greedy(int max_new_tokens) {
    GenerationOptions o;
    o.sampling.temperature = 0;
    o.sampling.max_new_tokens = max_new_tokens;
    o.sampling.ignore_eos = true;
    return o;
  }

  inline static LoadedModel* loaded_ = nullptr;
  std::unique_ptr<PagePool> pool_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_TESTS_UNIT_ENGINE_GENERATION_DEMO_MODEL_FIXTURE_H_
