// Needs a GPU (label gpu; the TP=2 cases two): whole decode steps replayed as one CUDA graph
// (engine/model/cuda_model_step_graph.cc) against the same steps run without graphs, on the
// generated llama3-rope preset (head_dim 64: the GPU scoring kernels run) with a small selection
// budget, for every policy with a GPU provider. A small step_graph_bucket (24) makes the decode
// cross several buckets: the graph is captured again at each, and the lengths of the steps in
// between come from the device. tokenselect also with capture_on_first_sight (every selecting
// step replays, the first of a bucket right after its capture).
//   - logits of every decode step bit for bit equal (graphs and eager launch the same kernels
//     with the same grids; with 2 ranks the NCCL sums are exact either way);
//   - the providers' host statistics and the selection cache's device counters equal (the host
//     bookkeeping of replayed steps, AccountReplay);
//   - quest (host state per layer) never takes the graph path and still agrees;
//   - with capture_on_first_sight the end of a prompt already captures the first decode step;
//   - a prompt's full chunks replayed as segment graphs give the eager prompt's logits;
//   - a workspace grown after a capture drops the captured step;
//   - a prompt's full chunks past the budget replayed as whole-chunk graphs (captured on the
//     second chunk of a bucket, the graph updated in place at the next bucket) give the eager
//     prompt's logits, statistics and decode steps bit for bit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_presets.h"
#include "engine/parallel/tp_cuda_model.h"
#include "engine/selection/cuda_selection.h"
#include "tests/gpu/gpu_engine_test_util.h"

namespace tokenselect::engine {
namespace {

const bool kEagerLoading = [] {
  TpCudaModel::RequestEagerLoading(/*tp_size=*/2);
  return true;
}();

constexpr int64_t kMaxTokens = 512;
constexpr int64_t kChunk = 64;

struct Case {
  int tp;
  SelectionPolicyKind policy;
  bool first_sight = false;  // CudaModelOptions::capture_on_first_sight
};

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return std::string(PolicyName(info.param.policy)) + "_tp" + std::to_string(info.param.tp) +
         (info.param.first_sight ? "_first_sight" : "");
}

class StepGraphTest : public testing::TestWithParam<Case> {};

// One provider per rank, made on the rank's device.
struct Providers {
  Providers(TpCudaModel* model, const SelectionOptions& options) : model(model) {
    owned.resize(static_cast<size_t>(model->size()));
    const absl::Status made = model->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
      auto p = CudaSelectionAttention::Create(options, shard->config(), kMaxTokens, kChunk,
                                              model->size());
      if (!p.ok()) return p.status();
      owned[rank] = *std::move(p);
      return absl::OkStatus();
    });
    EXPECT_TRUE(made.ok()) << made;
    for (auto& p : owned) ptrs.push_back(p.get());
  }
  ~Providers() {
    model
        ->RunOnRanks([&](int rank, CudaModel*) {
          owned[rank].reset();
          return absl::OkStatus();
        })
        .IgnoreError();
  }
  SelectionCacheCounters Counters(int rank) {
    SelectionCacheCounters c;
    const absl::Status read = model->RunOnRanks([&](int r, CudaModel* shard) -> absl::Status {
      if (r != rank) return absl::OkStatus();
      auto got = owned[r]->CacheCounters(shard->stream());
      if (!got.ok()) return got.status();
      c = *got;
      return absl::OkStatus();
    });
    EXPECT_TRUE(read.ok()) << read;
    return c;
  }
  TpCudaModel* model;
  std::vector<std::unique_ptr<CudaSelectionAttention>> owned;
  std::vector<CudaAttentionProvider*> ptrs;
};

// A model replaying whole-step graphs (index 0) and an eager one (1) of the generated
// llama3-rope preset (vocab 2048), each with its providers and one sequence.
struct GraphAndEager {
  // Makes everything; false, with a test failure recorded, when something could not be made.
  bool Make(int tp, uint64_t seed, int64_t bucket, bool first_sight, SelectionPolicyKind policy) {
    PresetOptions preset;
    preset.vocab_size = 2048;
    auto made_config = PresetConfig("llama3-rope", preset);
    if (!made_config.ok()) return Fail(made_config.status());
    config = *made_config;
    DummyWeightOptions dummy;
    dummy.init = DummyInit::kHuggingFace;
    dummy.seed = seed;
    auto loaded = LoadDummyWeights(config, dummy);
    if (!loaded.ok()) return Fail(loaded.status());
    weights = std::make_unique<ModelWeights>(*std::move(loaded));
    for (int eager = 0; eager < 2; ++eager) {
      TpCudaModelOptions options;
      options.tp_size = tp;
      options.model.max_tokens = kMaxTokens;
      options.model.max_chunk = kChunk;
      options.model.max_batch = 4;
      options.model.use_graphs = eager == 0;
      options.model.step_graph_bucket = bucket;
      options.model.capture_on_first_sight = first_sight && eager == 0;
      auto m = TpCudaModel::Create(config, *weights, options);
      if (!m.ok()) return Fail(m.status());
      models[eager] = *std::move(m);
    }
    const SelectionOptions sel = gpu_test::SmallBudget(policy);  // budget 8 + 64 + 32
    for (int i = 0; i < 2; ++i) {
      providers[i] = std::make_unique<Providers>(models[i].get(), sel);
      auto s = models[i]->NewSequence(kMaxTokens);
      if (!s.ok()) return Fail(s.status());
      seqs[i] = *std::move(s);
    }
    return true;
  }
  bool Fail(const absl::Status& status) {
    ADD_FAILURE() << status;
    return false;
  }
  // One decode step of the eager model's greedy pick on both models; logits[i] gets model i's,
  // `identical` counts the steps whose logits are the same bits.
  void DecodeStep(int step, std::vector<float> logits[2], int* identical) {
    auto next = models[1]->GreedyToken();
    ASSERT_TRUE(next.ok()) << next.status();
    const int32_t token = *next;
    for (int i = 0; i < 2; ++i) {
      const absl::Status st = models[i]->Forward(seqs[i].get(), absl::MakeConstSpan(&token, 1),
                                                 providers[i]->ptrs, &logits[i]);
      ASSERT_TRUE(st.ok()) << "step " << step << ": " << st;
    }
    *identical += logits[0] == logits[1] ? 1 : 0;
  }
  // The graph model's providers kept the eager one's host statistics (AccountReplay).
  void ExpectSameStatistics(int tp) {
    for (int r = 0; r < tp; ++r) {
      const SelectionStats& a = providers[0]->owned[r]->stats();
      const SelectionStats& b = providers[1]->owned[r]->stats();
      EXPECT_EQ(a.layer_steps, b.layer_steps) << "rank " << r;
      EXPECT_EQ(a.decode_layer_steps, b.decode_layer_steps) << "rank " << r;
      EXPECT_EQ(a.full_attention_steps, b.full_attention_steps) << "rank " << r;
      EXPECT_EQ(a.attended_tokens, b.attended_tokens) << "rank " << r;
      EXPECT_EQ(a.decode_attended_tokens, b.decode_attended_tokens) << "rank " << r;
      EXPECT_EQ(a.candidates_scored, b.candidates_scored) << "rank " << r;
    }
  }
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<TpCudaModel> models[2];
  std::unique_ptr<Providers> providers[2];
  std::unique_ptr<TpSequence> seqs[2];
};

TEST_P(StepGraphTest, ReplayedStepsEqualEagerOnes) {
  const Case c = GetParam();
  if (gpu_test::DeviceCount() < c.tp) GTEST_SKIP() << "needs " << c.tp << " GPUs";
  GraphAndEager m;
  ASSERT_TRUE(m.Make(c.tp, /*seed=*/11, /*bucket=*/24, c.first_sight, c.policy));
  auto& models = m.models;
  auto& seqs = m.seqs;
  Providers* providers[2] = {m.providers[0].get(), m.providers[1].get()};
  // A prompt just under the budget, so that the first decode steps attend everything (no
  // device lengths for the selecting policies) and the later ones select.
  const std::vector<int32_t> prompt = gpu_test::Prompt(96, 7, m.config.vocab_size);
  // The first chunk without logits: the graph model replays its segments as prefill-chunk
  // graphs (CudaModelOptions::graph_prefill_chunks), the eager one launches them.
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
      const size_t len = std::min<size_t>(kChunk, prompt.size() - begin);
      const bool last = begin + len == prompt.size();
      const absl::Status st = models[i]->Forward(
          seqs[i].get(), absl::MakeConstSpan(prompt).subspan(begin, len), providers[i]->ptrs,
          last ? &logits[i] : nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
  }
  ASSERT_EQ(logits[0], logits[1]);
  int identical = 0;
  const int steps = 120;  // lengths 96 .. 215: buckets of 24 crossed 5 times
  for (int step = 0; step < steps; ++step) {
    ASSERT_NO_FATAL_FAILURE(m.DecodeStep(step, logits, &identical));
  }
  EXPECT_EQ(identical, steps);
  const CudaModel::StepGraphCounts graphs = models[0]->shard(0)->step_graph_counts();
  const CudaModel::StepGraphCounts none = models[1]->shard(0)->step_graph_counts();
  EXPECT_EQ(none.captures + none.replays, 0);
  if (c.policy == SelectionPolicyKind::kQuest) {
    EXPECT_EQ(graphs.replays, 0);  // host state per layer: always by segments
  } else if (c.first_sight) {
    // Selecting from length 105 (the budget covers lengths 96 .. 104): from there on every step
    // replays a graph, the first of each bucket right after capturing it.
    EXPECT_GE(graphs.captures, 4);
    EXPECT_EQ(graphs.replays, steps - 9);
  } else {
    // Selecting from length 105 (dense and streaming from the start): a capture per bucket of
    // 24 lengths on its second step, replays on the rest.
    EXPECT_GE(graphs.captures, 4);
    EXPECT_GE(graphs.replays, steps / 2);
  }
  m.ExpectSameStatistics(c.tp);
  for (int r = 0; r < c.tp; ++r) {
    const SelectionStats& a = providers[0]->owned[r]->stats();
    const SelectionCacheCounters ca = providers[0]->Counters(r), cb = providers[1]->Counters(r);
    EXPECT_EQ(ca.hits, cb.hits) << "rank " << r;
    EXPECT_EQ(ca.misses, cb.misses) << "rank " << r;
    if (r == 0) {
      std::printf("%s TP=%d: %d of %d decode steps bit-identical with whole-step graphs "
                  "(%lld captures, %lld replays); attended %lld, cache %lld hits / %lld misses\n",
                  std::string(PolicyName(c.policy)).c_str(), c.tp, identical, steps,
                  static_cast<long long>(graphs.captures), static_cast<long long>(graphs.replays),
                  static_cast<long long>(a.decode_attended_tokens),
                  static_cast<long long>(ca.hits), static_cast<long long>(ca.misses));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, StepGraphTest,
    testing::Values(Case{1, SelectionPolicyKind::kTokenSelect}, Case{1, SelectionPolicyKind::kTopK},
                    Case{1, SelectionPolicyKind::kStreaming}, Case{1, SelectionPolicyKind::kDense},
                    Case{1, SelectionPolicyKind::kQuest}, Case{2, SelectionPolicyKind::kTokenSelect},
                    Case{2, SelectionPolicyKind::kDense},
                    Case{1, SelectionPolicyKind::kTokenSelect, true},
                    Case{2, SelectionPolicyKind::kTokenSelect, true}),
    CaseName);

// With capture_on_first_sight the end of a prompt captures the first decode step's graph
// (CudaModel::CaptureNextStep, while the GPU still runs the last chunk): after the prompt one
// capture and no replay, then every decode step replays it - the first one included - with the
// eager model's logits bit for bit and its greedy picks. The graph model's prompt ends through
// ForwardGreedy (as `tokenselect generate` does), the eager one's through Forward.
class PromptEndCaptureTest : public testing::TestWithParam<int> {};

TEST_P(PromptEndCaptureTest, FirstDecodeStepReplaysTheGraphCapturedAtThePromptsEnd) {
  const int tp = GetParam();
  if (gpu_test::DeviceCount() < tp) GTEST_SKIP() << "needs " << tp << " GPUs";
  GraphAndEager m;
  // One bound for the whole sequence: a single capture.
  ASSERT_TRUE(m.Make(tp, /*seed=*/12, /*bucket=*/4096, /*first_sight=*/true,
                     SelectionPolicyKind::kTokenSelect));
  auto& models = m.models;
  auto& seqs = m.seqs;
  Providers* providers[2] = {m.providers[0].get(), m.providers[1].get()};
  // 160 tokens: past the budget (8 + 64 + 32), so the first decode step selects.
  const std::vector<int32_t> prompt = gpu_test::Prompt(160, 9, m.config.vocab_size);
  const absl::Span<const int32_t> head = absl::MakeConstSpan(prompt).first(128);
  const absl::Span<const int32_t> tail = absl::MakeConstSpan(prompt).subspan(128);
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    const absl::Status st = models[i]->Forward(seqs[i].get(), head, providers[i]->ptrs, nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }
  auto picked = models[0]->ForwardGreedy(seqs[0].get(), tail, providers[0]->ptrs);
  ASSERT_TRUE(picked.ok()) << picked.status();
  ASSERT_TRUE(models[1]->Forward(seqs[1].get(), tail, providers[1]->ptrs, &logits[1]).ok());
  CudaModel::StepGraphCounts graphs = models[0]->shard(0)->step_graph_counts();
  EXPECT_EQ(graphs.captures, 1);
  EXPECT_EQ(graphs.replays, 0);
  auto want = models[1]->GreedyToken();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(*picked, *want);
  int identical = 0;
  const int steps = 24;
  for (int step = 0; step < steps; ++step) {
    const int32_t token = *want;
    picked = models[0]->ForwardGreedy(seqs[0].get(), absl::MakeConstSpan(&token, 1),
                                      providers[0]->ptrs);
    ASSERT_TRUE(picked.ok()) << "step " << step << ": " << picked.status();
    ASSERT_TRUE(models[0]->CopyLastLogits(&logits[0]).ok());
    const absl::Status st = models[1]->Forward(seqs[1].get(), absl::MakeConstSpan(&token, 1),
                                               providers[1]->ptrs, &logits[1]);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st;
    identical += logits[0] == logits[1] ? 1 : 0;
    want = models[1]->GreedyToken();
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(*picked, *want) << "step " << step;
  }
  EXPECT_EQ(identical, steps);
  graphs = models[0]->shard(0)->step_graph_counts();
  EXPECT_EQ(graphs.captures, 1);
  EXPECT_EQ(graphs.replays, steps);
  std::printf("TP=%d: prompt-end capture, %lld captures, %lld replays, %d of %d steps "
              "bit-identical\n",
              tp, static_cast<long long>(graphs.captures), static_cast<long long>(graphs.replays),
              identical, steps);
}

INSTANTIATE_TEST_SUITE_P(Ranks, PromptEndCaptureTest, testing::Values(1, 2));

// One GPU reserves the attention workspace as steps need it. A chunk whose list is gathered
// (kernels/cuda/prefill_attention.h) after decode steps needs more than they reserved; the
// captured step graph holds the old workspace's address, so growing it must drop the graph,
// and the next decode step captures again and still equals the eager model bit for bit.
TEST(StepGraphWorkspaceTest, GrowingTheWorkspaceDropsTheCapturedStep) {
  GraphAndEager m;
  ASSERT_TRUE(m.Make(1, /*seed=*/13, /*bucket=*/4096, /*first_sight=*/true,
                     SelectionPolicyKind::kDense));
  auto& models = m.models;
  auto& seqs = m.seqs;
  Providers* providers[2] = {m.providers[0].get(), m.providers[1].get()};
  const std::vector<int32_t> prompt = gpu_test::Prompt(16 + kChunk, 5, m.config.vocab_size);
  std::vector<float> logits[2];
  int identical = 0, steps = 0;
  auto decode = [&](int n) {
    for (int step = 0; step < n; ++step, ++steps) {
      ASSERT_NO_FATAL_FAILURE(m.DecodeStep(steps, logits, &identical));
    }
  };
  // 16 tokens (4 query heads per KV head: 64 rows, one query tile, not gathered), decode steps
  // (captured), then a full chunk of kChunk tokens (256 rows: gathered), then decode again.
  for (const auto& part : {absl::MakeConstSpan(prompt).first(16),
                           absl::MakeConstSpan(prompt).subspan(16)}) {
    for (int i = 0; i < 2; ++i) {
      const absl::Status st = models[i]->Forward(seqs[i].get(), part, providers[i]->ptrs,
                                                 &logits[i]);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_EQ(logits[0], logits[1]);
    ASSERT_NO_FATAL_FAILURE(decode(4));
  }
  EXPECT_EQ(identical, steps);
  const CudaModel::StepGraphCounts graphs = models[0]->shard(0)->step_graph_counts();
  EXPECT_EQ(graphs.captures, 2) << "the chunk's larger workspace must force a new capture";
  EXPECT_EQ(graphs.replays, 8);
}

// A prompt of 7 full chunks of 64 (the last with logits) with a bucket of 128: chunks at
// lengths 0 and 64 attend everything (budget 8 + 64 + 32), those at 128 .. 320 select on device
// lengths with bounds 256, 256, 384, 384. The first chunk of each bound runs by segments, the
// second captures (the first time) or updates the graph held (the second) and replays; the last
// chunk has logits and runs by segments. Everything the eager model does, bit for bit: the
// prompt's logits, the providers' statistics, then decode steps on the cache both wrote.
struct ChunkCase {
  int tp;
  SelectionPolicyKind policy;
};

std::string ChunkCaseName(const testing::TestParamInfo<ChunkCase>& info) {
  return std::string(PolicyName(info.param.policy)) + "_tp" + std::to_string(info.param.tp);
}

class ChunkGraphTest : public testing::TestWithParam<ChunkCase> {};

TEST_P(ChunkGraphTest, ReplayedChunksEqualEagerOnes) {
  const ChunkCase c = GetParam();
  if (gpu_test::DeviceCount() < c.tp) GTEST_SKIP() << "needs " << c.tp << " GPUs";
  GraphAndEager m;
  ASSERT_TRUE(m.Make(c.tp, /*seed=*/14, /*bucket=*/128, /*first_sight=*/false, c.policy));
  auto& models = m.models;
  auto& seqs = m.seqs;
  Providers* providers[2] = {m.providers[0].get(), m.providers[1].get()};
  const std::vector<int32_t> prompt = gpu_test::Prompt(7 * kChunk, 3, m.config.vocab_size);
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
      const bool last = begin + kChunk == prompt.size();
      const absl::Status st = models[i]->Forward(
          seqs[i].get(), absl::MakeConstSpan(prompt).subspan(begin, kChunk), providers[i]->ptrs,
          last ? &logits[i] : nullptr);
      ASSERT_TRUE(st.ok()) << "chunk at " << begin << ": " << st;
    }
  }
  EXPECT_EQ(logits[0], logits[1]) << "the prompt's logits differ";
  const CudaModel::StepGraphCounts graphs = models[0]->shard(0)->step_graph_counts();
  const CudaModel::StepGraphCounts none = models[1]->shard(0)->step_graph_counts();
  EXPECT_EQ(none.chunk_captures + none.chunk_updates + none.chunk_replays, 0);
  EXPECT_EQ(graphs.chunk_captures, 1);
  EXPECT_EQ(graphs.chunk_updates, 1) << "the second bound's capture should update the graph";
  EXPECT_EQ(graphs.chunk_replays, 2);
  m.ExpectSameStatistics(c.tp);
  int identical = 0;
  const int steps = 8;
  for (int step = 0; step < steps; ++step) {
    ASSERT_NO_FATAL_FAILURE(m.DecodeStep(step, logits, &identical));
  }
  EXPECT_EQ(identical, steps);
  std::printf("%s TP=%d: prompt logits %s, chunk graphs %lld captured, %lld updated, %lld "
              "replayed; %d of %d decode steps bit-identical\n",
              std::string(PolicyName(c.policy)).c_str(), c.tp,
              logits[0] == logits[1] ? "identical" : "DIFFERENT",
              static_cast<long long>(graphs.chunk_captures),
              static_cast<long long>(graphs.chunk_updates),
              static_cast<long long>(graphs.chunk_replays), identical, steps);
}

INSTANTIATE_TEST_SUITE_P(Policies, ChunkGraphTest,
                         testing::Values(ChunkCase{1, SelectionPolicyKind::kTokenSelect},
                                         ChunkCase{1, SelectionPolicyKind::kTopK},
                                         ChunkCase{1, SelectionPolicyKind::kStreaming},
                                         ChunkCase{2, SelectionPolicyKind::kTokenSelect}),
                         ChunkCaseName);

}  // namespace
}  // namespace tokenselect::engine
