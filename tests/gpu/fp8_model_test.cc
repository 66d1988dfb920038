// Needs a GPU (label gpu): CudaModel with an FP8 KV cache (CudaModelOptions::kv_dtype,
// docs/fp8_kv.md) against the CPU model's FP8 simulation (ModelOptions::kv_dtype), on the preset
// models, with the tolerances of cuda_model_test.cc's bf16 checks; the scales (GPU == CPU, and a
// tensor-parallel rank's == its slice); K/V host copies of an FP8 cache; the GPU selection
// provider's lists over an FP8 cache == over a bf16 cache of the dequantized keys. Greedy
// continuations with FP8 against bf16 are printed on the random presets (which flip under any
// rounding, so they are not required to agree) and compared on the trained checkpoint of
// tests/data/golden_trained (a model with margins between its top candidates).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

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
#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/fp8.h"
#include "engine/model/kv_scales.h"
#include "engine/model/model.h"
#include "engine/model/model_presets.h"
#include "engine/selection/cuda_selection.h"
#include "engine/selection/selection_options.h"
#include "engine/selection/selection_policy.h"
#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/gpu/cpu_oracle_test_util.h"
#include "tests/gpu/gpu_engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/trained_checkpoint.h"

namespace tokenselect::engine {
namespace {

using gpu_test::DeviceBuffer;

using gpu_test::RoundedToBf16;

CudaModelOptions GpuOptions(int64_t max_tokens, KvCacheDType dtype) {
  CudaModelOptions o;
  o.max_tokens = max_tokens;
  o.page_size = 16;
  o.kv_dtype = dtype;
  return o;
}

// `count` greedy tokens of `model` after `prompt`, from a reset sequence; a failing step fails
// the test and ends the continuation there.
std::vector<int32_t> GreedyContinuation(CudaModel* model, const std::vector<int32_t>& prompt,
                                        int count) {
  std::vector<int32_t> out;
  std::vector<float> unused;
  model->Reset();
  for (int i = 0; i < count; ++i) {
    const absl::Status st =
        model->Forward(i == 0 ? prompt : std::vector<int32_t>{out.back()}, &unused);
    EXPECT_TRUE(st.ok()) << "step " << i << ": " << st;
    if (!st.ok()) break;
    out.push_back(model->GreedyToken().value());
  }
  return out;
}

class Fp8ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  ModelConfig Config() const {
    PresetOptions preset;
    preset.vocab_size = 2048;
    return PresetConfig(GetParam(), preset).value();
  }
};

TEST_P(Fp8ModelTest, ScalesAndMemoryMatchTheCpu) {
  const ModelConfig config = Config();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kScaled;
  const ModelWeights weights = LoadDummyWeights(config, dummy).value();
  auto gpu8 = CudaModel::Create(config, weights, GpuOptions(1000, KvCacheDType::kFP8E4M3));
  ASSERT_TRUE(gpu8.ok()) << gpu8.status();
  auto gpu16 = CudaModel::Create(config, weights, GpuOptions(1000, KvCacheDType::kBF16));
  ASSERT_TRUE(gpu16.ok()) << gpu16.status();
  ModelOptions cpu_options;
  cpu_options.kv_dtype = KvCacheDType::kFP8E4M3;
  auto cpu = Model::Create(config, weights, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*gpu8)->kv_scales(), (*cpu)->kv_scales());
  EXPECT_TRUE((*gpu16)->kv_scales().empty());
  EXPECT_EQ((*gpu8)->kv_element_bytes(), 1);
  EXPECT_EQ((*gpu8)->kv_bytes() * 2, (*gpu16)->kv_bytes());
  EXPECT_EQ((*gpu8)->kv_bytes(), (*gpu8)->num_slots() * 2 * config.num_layers * config.kv_dim());
  EXPECT_EQ((*gpu16)->k_scale(0), nullptr);
  ASSERT_NE((*gpu8)->k_scale(1), nullptr);
  const std::vector<float> layer1 =
      gpu_test::DownloadFrom((*gpu8)->v_scale(1), config.num_kv_heads);
  for (int64_t h = 0; h < config.num_kv_heads; ++h) {
    EXPECT_EQ(layer1[h], (*cpu)->kv_scales()[KvScaleIndex(1, 1, h, config.num_kv_heads)]);
  }
}

// transformers' N(0, 0.02) init: a quiet model, so the GPU must stay within relative L2 2e-2 of
// the CPU's FP8 simulation at every teacher-forced step (the bound of the bf16 quiet test).
TEST_P(Fp8ModelTest, QuietModelMatchesTheCpuFp8Oracle) {
  const ModelConfig config = Config();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kHuggingFace;
  dummy.seed = 7;
  const ModelWeights weights = LoadDummyWeights(config, dummy).value();
  auto gpu = CudaModel::Create(config, weights, GpuOptions(128, KvCacheDType::kFP8E4M3));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ModelOptions cpu_options;
  cpu_options.emulate_bf16 = true;
  cpu_options.kv_dtype = KvCacheDType::kFP8E4M3;
  auto cpu = Model::Create(config, weights, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto pool = PagePool::Create((*cpu)->KvCacheOptions(8, 16)).value();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> any_token(3, 2047);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = any_token(rng);
  TokenTable table(pool.get(), "req");
  std::vector<double> rel;
  int agree = 0;
  constexpr int kSteps = 32;
  ASSERT_NO_FATAL_FAILURE(
      gpu_test::TeacherForce(**cpu, &table, gpu->get(), tokens, kSteps, &rel, &agree));
  for (size_t step = 0; step < rel.size(); ++step) EXPECT_LE(rel[step], 2e-2) << "step " << step;
  const double worst = *std::max_element(rel.begin(), rel.end());
  std::printf("%s FP8 quiet init: logits rel L2 vs CPU FP8 oracle worst %.3g; argmax %d/%d\n",
              GetParam().c_str(), worst, agree, kSteps);
}

// The presets' "trained-looking" weights, teacher-forced as in cuda_model_test.cc, against the
// CPU FP8 oracle on the bf16 weights with bf16 storage points; then free-running greedy
// continuations of the GPU with FP8 against bf16 KV, printed. The bounds are cuda_model_test's
// except the median, 0.1 instead of 5e-2: a last-bit difference between the GPU's and the CPU's
// K (fast sin/cos, accumulation order) now and then lands a value on the other side of an e4m3
// rounding boundary, a 6% step that these chaotic models amplify. Measured (H200, 2026-11-21):
// median / worst 0.024 / 0.055 (llama-gqa), 0.020 / 0.065 (qwen2-bias), 0.064 / 0.121
// (llama3-rope); argmax 123, 119, 118 of 128.
TEST_P(Fp8ModelTest, TracksTheCpuFp8OracleAndReportsGreedyAgainstBf16) {
  const ModelConfig config = Config();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kScaled;
  const ModelWeights weights = LoadDummyWeights(config, dummy).value();
  auto gpu = CudaModel::Create(config, weights, GpuOptions(256, KvCacheDType::kFP8E4M3));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ModelOptions cpu_options;
  cpu_options.emulate_bf16 = true;
  cpu_options.kv_dtype = KvCacheDType::kFP8E4M3;
  auto oracle = Model::Create(config, RoundedToBf16(weights), cpu_options);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  auto pool = PagePool::Create((*oracle)->KvCacheOptions(32, 16)).value();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> any_token(3, 2047);
  constexpr int kPrompts = 4, kSteps = 32;
  std::vector<double> rel;
  int agree = 0, total = 0;
  for (int prompt = 0; prompt < kPrompts; ++prompt) {
    std::vector<int32_t> tokens(static_cast<size_t>(5 + 17 * prompt));
    for (int32_t& t : tokens) t = any_token(rng);
    TokenTable table(pool.get(), "oracle");
    ASSERT_NO_FATAL_FAILURE(
        gpu_test::TeacherForce(**oracle, &table, gpu->get(), tokens, kSteps, &rel, &agree));
    total += kSteps;
  }
  std::sort(rel.begin(), rel.end());
  const double median = rel[rel.size() / 2], worst = rel.back();
  std::printf("%s FP8: logits rel L2 vs CPU FP8 oracle median %.3g worst %.3g; argmax %d/%d\n",
              GetParam().c_str(), median, worst, agree, total);
  EXPECT_LE(worst, 0.15);
  EXPECT_LE(median, 0.1);
  EXPECT_GE(agree * 4, total * 3);

  // Greedy continuations: FP8 against bf16 KV on the GPU, same prompt.
  auto bf16 = CudaModel::Create(config, weights, GpuOptions(256, KvCacheDType::kBF16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  std::vector<int32_t> prompt(60);
  for (int32_t& t : prompt) t = any_token(rng);
  constexpr int kNew = 64;
  const std::vector<int32_t> out8 = GreedyContinuation(gpu->get(), prompt, kNew);
  const std::vector<int32_t> out16 = GreedyContinuation(bf16->get(), prompt, kNew);
  ASSERT_EQ(out8.size(), size_t{kNew});
  ASSERT_EQ(out16.size(), size_t{kNew});
  const int first_diff = static_cast<int>(gpu_test::FirstDifference(out8, out16));
  int same = 0;
  for (int i = 0; i < kNew; ++i) same += out8[i] == out16[i];
  std::printf(
      "%s greedy, FP8 vs bf16 KV: first %d of %d new tokens identical (%d positions "
      "equal overall)\n",
      GetParam().c_str(), first_diff, kNew, same);
}

// FP8 against bf16 KV on the trained checkpoint, over its 40 golden prompts (1-1024 tokens):
// 32-token greedy continuations of each, and each against transformers' (fp32). bf16 must give
// transformers' continuation on >= 95% of the prompts (gpu_hf_parity_test's target); FP8 is
// held to the same 95% against bf16 and against transformers.
TEST(Fp8TrainedTest, GreedyContinuationsOnTheTrainedCheckpoint) {
  auto prompts = gpu_test::TrainedPrompts();
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  auto trained = gpu_test::LoadTrainedCheckpoint();
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto fp8 = CudaModel::Create(trained->config, trained->weights,
                               GpuOptions(1024 + 64, KvCacheDType::kFP8E4M3));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  auto bf16 = CudaModel::Create(trained->config, trained->weights,
                                GpuOptions(1024 + 64, KvCacheDType::kBF16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  int same = 0, fp8_hf = 0, bf16_hf = 0, total = 0;
  for (const gpu_test::TrainedPrompt& p : *prompts) {
    const std::vector<int32_t> a = GreedyContinuation(fp8->get(), p.ids, 32);
    const std::vector<int32_t> b = GreedyContinuation(bf16->get(), p.ids, 32);
    ++total;
    same += a == b;
    fp8_hf += a == p.greedy;
    bf16_hf += b == p.greedy;
    if (a != b) {
      std::printf("  %zu-token prompt: FP8 and bf16 KV part at generated token %zu\n",
                  p.ids.size(), gpu_test::FirstDifference(a, b));
    }
  }
  std::printf("llama-topics (trained) greedy, 40 prompts: FP8 KV == bf16 KV on %d; FP8 == "
              "transformers on %d; bf16 == transformers on %d of %d\n",
              same, fp8_hf, bf16_hf, total);
  EXPECT_EQ(total, 40);
  EXPECT_GE(bf16_hf * 100, total * 95);
  EXPECT_GE(same * 100, total * 95);
  EXPECT_GE(fp8_hf * 100, total * 95);
}

// ReadKv of an FP8 cache gives its e4m3 bytes (one per element); WriteKv of them into another
// sequence makes a sequence that continues exactly like the original.
TEST_P(Fp8ModelTest, HostKvCopiesMoveFp8Bytes) {
  const ModelConfig config = Config();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kScaled;
  const ModelWeights weights = LoadDummyWeights(config, dummy).value();
  auto gpu = CudaModel::Create(config, weights, GpuOptions(512, KvCacheDType::kFP8E4M3));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CudaModel& m = **gpu;
  auto a = m.NewSequence(100).value();
  auto b = m.NewSequence(100).value();
  std::vector<int32_t> prompt(50);
  for (int i = 0; i < 50; ++i) prompt[i] = 3 + (i * 97) % 2000;
  ASSERT_TRUE(m.Forward(a.get(), prompt, nullptr, nullptr).ok());
  const int64_t bytes = config.num_layers * 2 * 50 * config.kv_dim();  // 1 byte per element
  std::vector<uint8_t> host(static_cast<size_t>(bytes) + 16, 0xab);
  ASSERT_TRUE(m.ReadKv(*a, 0, config.num_layers, 0, 50, host.data()).ok());
  for (int i = 0; i < 16; ++i) ASSERT_EQ(host[bytes + i], 0xab) << "wrote past the payload";
  // Every byte is a finite e4m3 code and the keys are on their heads' grids.
  for (int64_t i = 0; i < bytes; ++i) ASSERT_NE(host[i] & 0x7f, 0x7f) << "NaN code at " << i;
  ASSERT_TRUE(m.WriteKv(b.get(), 0, config.num_layers, 0, 50, host.data()).ok());
  ASSERT_TRUE(m.SetLength(b.get(), 50).ok());
  std::vector<float> la, lb;
  const std::vector<int32_t> next = {77};
  ASSERT_TRUE(m.Forward(a.get(), next, nullptr, &la).ok());
  ASSERT_TRUE(m.Forward(b.get(), next, nullptr, &lb).ok());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, Fp8ModelTest,
                         ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

// A one-GPU stand-in for a tensor-parallel group: construction runs no collective, so the
// shards' scales can be checked on one device.
class FakeGroup : public CudaTensorParallel {
 public:
  FakeGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float*, int64_t, cudaStream_t) override {
    return absl::UnimplementedError("FakeGroup runs no collective");
  }
  absl::Status AllReduceSum(double*, int64_t, cudaStream_t) override {
    return absl::UnimplementedError("FakeGroup runs no collective");
  }

 private:
  int rank_, size_;
};

TEST(Fp8TensorParallelTest, ARanksScalesAreItsSliceOfTheWholeModels) {
  PresetOptions preset;
  preset.vocab_size = 512;
  for (const char* name : {"llama-gqa", "qwen2-bias"}) {
    const ModelConfig config = PresetConfig(name, preset).value();
    const ModelWeights weights = LoadDummyWeights(config, 3).value();
    auto whole = CudaModel::Create(config, weights, GpuOptions(64, KvCacheDType::kFP8E4M3));
    ASSERT_TRUE(whole.ok()) << whole.status();
    const int64_t hkv = config.num_kv_heads;
    for (int size : {2}) {
      for (int rank = 0; rank < size; ++rank) {
        FakeGroup group(rank, size);
        CudaModelOptions o = GpuOptions(64, KvCacheDType::kFP8E4M3);
        o.tp = &group;
        auto shard = CudaModel::Create(config, weights, o);
        ASSERT_TRUE(shard.ok()) << shard.status();
        const int64_t per = hkv / size;
        for (int64_t l = 0; l < config.num_layers; ++l) {
          for (int v = 0; v < 2; ++v) {
            for (int64_t h = 0; h < per; ++h) {
              EXPECT_EQ((*shard)->kv_scales()[KvScaleIndex(l, v, h, per)],
                        (*whole)->kv_scales()[KvScaleIndex(l, v, rank * per + h, hkv)])
                  << name << " rank " << rank << " layer " << l << " v " << v << " head " << h;
            }
          }
        }
      }
    }
  }
}

// The GPU selection provider over an FP8 cache against the same provider over a bf16 cache of
// the dequantized keys: the lists must be identical (the scoring kernels dequantize exactly).
TEST(Fp8SelectionProviderTest, ListsEqualThoseOverTheDequantizedCache) {
  ModelConfig config;
  config.num_layers = 2;
  config.num_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.hidden_size = 4096;
  const int64_t total = 3000, num_slots = total + 64, kv_dim = 8 * 128;
  std::mt19937 rng(9);
  std::vector<int32_t> perm(num_slots);
  for (int64_t i = 0; i < num_slots; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(perm.begin(), perm.begin() + total);
  std::vector<float> scales = {0.0625f,   0.03125f, 0.125f, 0.0625f,
                               0.015625f, 0.0625f,  0.25f,  0.0625f};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> k8(static_cast<size_t>(num_slots * kv_dim));
  std::vector<uint16_t> k16(k8.size());
  for (size_t i = 0; i < k8.size(); ++i) {
    const float s = scales[(i / 128) % 8];
    k8[i] = FloatToE4m3(2.0f * normal(rng) / s);
    k16[i] = gpu_test::FloatToBf16Bits(E4m3ToFloat(k8[i]) * s);
  }
  std::vector<int32_t> iota(total + 2);
  for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int32_t>(i);
  kernels::RopeParams rope;
  rope.head_dim = 128;
  DeviceBuffer<uint8_t> d_k8(k8);
  DeviceBuffer<uint16_t> d_k16(k16);
  DeviceBuffer<float> d_scales(scales);
  DeviceBuffer<int32_t> d_slots(slots), d_iota(iota);
  DeviceBuffer<float> d_inv_freq(kernels::RopeInverseFrequencies(rope));
  // tokenselect_span's first step finds 2000 tokens its index never saw (one span without
  // index vectors); its chunk map and spans come from the chunk of 64, and at 2500 (after a gap)
  // those spans are candidates, scored from their FP8 index vectors.
  for (SelectionPolicyKind policy :
       {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK, SelectionPolicyKind::kQuest,
        SelectionPolicyKind::kTokenSelectSpan, SelectionPolicyKind::kCascade,
        SelectionPolicyKind::kHeadVote}) {
    SelectionOptions opt;
    opt.policy = policy;
    opt.n_init = 16;
    opt.k = 256;
    opt.n_local = 64;
    auto p8 = CudaSelectionAttention::Create(opt, config, total, 64);
    auto p16 = CudaSelectionAttention::Create(opt, config, total, 64);
    ASSERT_TRUE(p8.ok() && p16.ok());
    // A prefill chunk of 64 after 2000 cached tokens, then decode steps.
    for (const auto& [cached, num_new] :
         std::vector<std::pair<int64_t, int64_t>>{{2000, 64}, {2064, 1}, {2065, 1}, {2500, 1}}) {
      std::vector<uint16_t> q(static_cast<size_t>(num_new * 32 * 128));
      for (uint16_t& x : q) x = gpu_test::FloatToBf16Bits(normal(rng));
      DeviceBuffer<uint16_t> d_q(q);
      std::vector<int32_t> lists[2][4];
      for (int fp8 = 0; fp8 < 2; ++fp8) {
        for (int64_t layer = 0; layer < 2; ++layer) {
          CudaAttentionQuery query;
          query.layer = layer;
          query.cache_length = cached;
          query.num_new = num_new;
          query.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
          query.q_row_stride = 32 * 128;
          query.k_cache = fp8 ? static_cast<const void*>(d_k8.get()) : d_k16.get();
          query.kv_dtype = fp8 ? KvCacheDType::kFP8E4M3 : KvCacheDType::kBF16;
          query.k_scale = fp8 ? d_scales.get() : nullptr;
          query.token_slots = d_slots.get();
          query.iota = d_iota.get();
          query.inv_freq = d_inv_freq.get();
          query.config = &config;
          CudaAttentionList list;
          const absl::Status st = (fp8 ? *p8 : *p16)->Select(query, &list);
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const int32_t len = gpu_test::DownloadFrom(list.kv_indptr, 2)[1];
          if (layer == 1) {
            lists[fp8][0] = gpu_test::DownloadFrom(list.kv_indices, len);
            lists[fp8][1] = gpu_test::DownloadFrom(list.kv_positions, len);
            lists[fp8][2] = gpu_test::DownloadFrom(list.q_positions, num_new);
            lists[fp8][3] = gpu_test::DownloadFrom(list.visible, num_new);
          }
        }
      }
      for (int part = 0; part < 4; ++part) {
        EXPECT_EQ(lists[1][part], lists[0][part])
            << PolicyName(policy) << " after " << cached << " tokens, part " << part;
      }
      EXPECT_LT(lists[1][0].size(), static_cast<size_t>(cached));  // really a selection
    }
  }
}

}  // namespace
}  // namespace tokenselect::engine
