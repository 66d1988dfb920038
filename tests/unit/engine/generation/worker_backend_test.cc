// The workers' backend choice and GPU memory planning (engine/generation/worker_backend.h):
// flag validation, the plan's arithmetic and refusals, the CPU backend a worker loads, and
// --device cuda on a machine without a usable GPU (CI) refused cleanly before any weight is read.
#include "engine/generation/worker_backend.h"

#include <string>

#include "engine/generation/demo_checkpoint.h"
#include "engine/model/model_presets.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

void ExpectInvalid(WorkerBackendOptions o, const std::string& flag) {
  const absl::Status s = ValidateWorkerBackendOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
  EXPECT_NE(s.message().find(flag), std::string::npos) << s;
}

TEST(WorkerBackendOptionsTest, NamesTheBadFlag) {
  WorkerBackendOptions ok;
  EXPECT_TRUE(ValidateWorkerBackendOptions(ok).ok());
  WorkerBackendOptions o;
  o.device = "tpu";
  ExpectInvalid(o, "--device");
  o = {};
  o.gpu = -1;
  ExpectInvalid(o, "--gpu");
  o = {};
  o.kv_pages = 0;  // planning is for GPUs only
  ExpectInvalid(o, "--kv_pages");
  o.device = "cuda";
  EXPECT_TRUE(ValidateWorkerBackendOptions(o).ok());
  o = {};
  o.page_size = 0;
  ExpectInvalid(o, "--page_size");
  o = {};
  o.max_chunk = 0;
  ExpectInvalid(o, "--max_chunk");
  o = {};
  o.max_batch = 0;
  ExpectInvalid(o, "--max_batch");
  o = {};
  o.gpu_memory_fraction = 1.5;
  ExpectInvalid(o, "--gpu_memory_fraction");
  o = {};
  o.tp = 0;
  ExpectInvalid(o, "--tp");
  o.tp = 2;  // tensor parallelism shards a GPU model
  ExpectInvalid(o, "--tp");
  o.device = "cuda";
  EXPECT_TRUE(ValidateWorkerBackendOptions(o).ok());
  o.tp_invariant = 3;  // not a supported tree
  ExpectInvalid(o, "--tp_invariant");
  o.tp_invariant = 1;  // not a multiple of --tp 2
  ExpectInvalid(o, "--tp_invariant");
  o.tp_invariant = 4;
  EXPECT_TRUE(ValidateWorkerBackendOptions(o).ok());
  o.device = "cpu";
  o.tp = 1;
  ExpectInvalid(o, "--tp_invariant");  // a GPU option
}

// With --tp the workers plan one rank's shard per GPU: at TP=2 on two H200s the KV slots per
// GPU hold half the heads, so about twice the tokens fit (1M tokens of Llama-3-8B on two).
TEST(PlanKvTokensTest, Llama3_8BShardedOverTwoH200s) {
  const ModelConfig c = Llama3_8BConfig();
  ModelConfig shard = c;  // CudaModel::ShardConfig(c, 2)
  shard.num_heads /= 2;
  shard.num_kv_heads /= 2;
  shard.intermediate_size /= 2;
  auto one = PlanKvTokens(c, 126 * kGiB, 16, 512, 64);
  auto two = PlanKvTokens(shard, 126 * kGiB, 16, 512, 64);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_GT(*two, 1048576 + 4096);
  EXPECT_GT(static_cast<double>(*two) / static_cast<double>(*one), 1.9);
}

TEST(PlanKvTokensTest, Llama3_8BOnAnH200) {
  const ModelConfig c = Llama3_8BConfig();
  // bf16 weights: 8.03B parameters, lm_head held apart from the embedding.
  EXPECT_NEAR(static_cast<double>(GpuWeightBytes(c)) / 1e9, 16.06, 0.05);
  // 90% of 140 GiB: 126 GiB - 15 GiB of weights - ~2.1 GiB of activations and margin leaves
  // ~109 GiB; at 128 KiB of K/V (+ selection scratch) per token that is ~0.85M tokens.
  auto tokens = PlanKvTokens(c, 126 * kGiB, 16, 512, 64);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens % 16, 0);
  EXPECT_GT(*tokens, 800000);
  EXPECT_LT(*tokens, 900000);
  const int64_t kv_bytes = *tokens * c.num_layers * 2 * c.num_kv_heads * c.head_dim * 2;
  EXPECT_LE(GpuWeightBytes(c) + kv_bytes, 126 * kGiB);  // never plans past the budget
  // Twice the budget past the weights holds about twice the tokens.
  auto more = PlanKvTokens(c, 126 * kGiB + 109 * kGiB, 16, 512, 64);
  ASSERT_TRUE(more.ok());
  EXPECT_NEAR(static_cast<double>(*more) / static_cast<double>(*tokens), 2.0, 0.05);
}

TEST(PlanKvTokensTest, RefusesABudgetThatHoldsNoKv) {
  const absl::StatusOr<int64_t> none = PlanKvTokens(Llama3_8BConfig(), 16 * kGiB, 16, 512, 64);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("weights"), std::string::npos) << none.status();
}

class WorkerBackendLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/worker_backend_model";
    ASSERT_TRUE(WriteDemoCheckpoint(dir_, DemoCheckpointOptions{}).ok());
  }
  std::string dir_;
};

TEST_F(WorkerBackendLoadTest, CpuBackendHasThePoolItWasAskedFor) {
  WorkerBackendOptions o;
  o.kv_pages = 32;
  o.page_size = 8;
  auto w = LoadWorkerBackend(dir_, LoadFormat::kSafetensors, o);
  ASSERT_TRUE(w.ok()) << w.status();
  const KvCapacity kv = (*w)->backend()->kv_capacity();
  EXPECT_EQ(kv.total_pages, 32);
  EXPECT_EQ(kv.free_pages, 32);
  EXPECT_EQ(kv.num_slots(), 256);
  EXPECT_EQ((*w)->backend()->kv_layout().dtype, KvDType::kF32);
  EXPECT_FALSE((*w)->backend()->device_cache().has_value());
  ASSERT_NE((*w)->cpu_pool(), nullptr);
  ASSERT_NE((*w)->tokenizer(), nullptr);
  EXPECT_NE((*w)->Describe().find("cpu, 32 KV pages"), std::string::npos) << (*w)->Describe();
  // A request that cannot have its pages now is RESOURCE_EXHAUSTED, and nothing leaks.
  auto big = (*w)->backend()->Start(257, SelectionOptions{});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->backend()->kv_capacity().free_pages, 32);
}

// In CI there is no GPU (or no CUDA backend in the build): --device cuda must be refused with a
// clear status, never a crash.
TEST_F(WorkerBackendLoadTest, CudaWithoutAUsableGpuIsRefused) {
  WorkerBackendOptions o;
  o.device = "cuda";
  auto w = LoadWorkerBackend(dir_, LoadFormat::kSafetensors, o);
  if (w.ok()) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_TRUE(w.status().code() == absl::StatusCode::kFailedPrecondition ||
              w.status().code() == absl::StatusCode::kUnimplemented)
      << w.status();
}

}  // namespace
}  // namespace tokenselect::engine
