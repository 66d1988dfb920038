// CudaSelectionAttention (engine/selection/cuda_selection.h) against its CPU oracle: the same
// selection query (selection_query.h), policy (selection_policy.h), selection cache
// (selection_cache.h) and attention list (attention_list.h) run on the same bf16-rounded keys
// and queries. The lists must be equal entry for entry (slots, compact positions, query
// positions, visibility); random fp32 data has no exact vote ties, and a near-tie that the two
// selection queries' last-bit differences could flip is reported and tolerated once per case.
#include "engine/selection/cuda_selection.h"

#include "tests/gpu/cuda_selection_fixture.h"

namespace tokenselect::engine {
namespace {

using gpu_selection_test::CudaSelectionTest;
using gpu_selection_test::ExpectStateCarriesOver;
using gpu_selection_test::ObserveOnCpu;
using gpu_selection_test::RoundBf16;
using gpu_selection_test::RunStatefulSteps;
using gpu_selection_test::Shape;
using gpu_selection_test::StatefulRun;
using gpu_selection_test::TestOptions;
using gpu_selection_test::WorstReceived;

TEST_P(CudaSelectionTest, PrefillChunkListsMatchTheCpuPolicy) {
  std::mt19937 rng(20261121);
  const int64_t chunk = 37;
  SetUpCache(5000 + chunk, &rng);
  // k = 1500: lists longer than one block of the list kernel (kernels/cuda/selection_list.cu).
  // bound 1: TokenSelect by the bound-vote selection (BoundVoteSelect) at every length, where
  // the shape allows it (head_dim 128, groups of 4), else the plain chain again.
  using Case = std::tuple<SelectionPolicyKind, int64_t, int64_t>;
  for (const auto& [kind, k, bound] :
       std::vector<Case>{{SelectionPolicyKind::kTokenSelect, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kTopK, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kHeadVote, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kHeadVote, 1500, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kQuest, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kStreaming, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kDense, 300, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kTokenSelect, 1500, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kStreaming, 1500, kBoundVoteMinCandidates},
                         {SelectionPolicyKind::kTokenSelect, 300, 1},
                         {SelectionPolicyKind::kTokenSelect, 1500, 1}}) {
    const SelectionOptions opt = TestOptions(kind, 16, k, 64, chunk);
    auto provider =
        CudaSelectionAttention::Create(opt, config_, 5000 + chunk, chunk, 1, 0, bound);
    ASSERT_TRUE(provider.ok()) << provider.status();
    auto policy = CreateSelectionPolicy(opt);
    ASSERT_TRUE(policy.ok());
    int64_t flips = 0;
    const int64_t budget = opt.n_init + k + opt.n_local;
    for (int64_t cached : {int64_t{0}, k, budget, budget + 1, int64_t{2999}, int64_t{5000}}) {
      const std::vector<float> q = RandomQ(chunk, &rng);
      const AttentionList gpu = RunGpu(provider->get(), 0, cached, q, chunk);
      std::vector<float> sel(static_cast<size_t>(config_.num_heads * config_.head_dim));
      ASSERT_TRUE(BuildSelectionQuery(q.data(), chunk, config_.num_heads, config_.head_dim,
                                      opt.n_local, inv_freq_.data(), sel.data())
                      .ok());
      SelectionResult result;
      SelectionScratch scratch;
      ASSERT_TRUE((*policy)->Select(CpuInput(sel, cached), &result, &scratch).ok());
      AttentionList cpu;
      ASSERT_TRUE(BuildAttentionList(result.tokens, slots_, cached, chunk, &cpu).ok());
      const int64_t mismatches = Mismatches(gpu, cpu);
      // A near-tie flips one pick (two entries), or for Quest one page (two pages' tokens).
      const int64_t tolerance = kind == SelectionPolicyKind::kQuest
                                    ? 2 * opt.baselines.quest_page_size
                                    : 2;
      EXPECT_LE(mismatches, tolerance)
          << PolicyName(kind) << " k=" << k << " bound=" << bound << " cached=" << cached;
      flips += mismatches > 0;
    }
    EXPECT_LE(flips, 1) << PolicyName(kind) << " k=" << k << " bound=" << bound;
  }
}

// Quest over decode steps: the GPU keeps each layer's page bounds and rebuilds only the pages not
// yet complete; the lists must equal the CPU policy's, which recomputes every bound each call.
TEST_P(CudaSelectionTest, QuestDecodeStepsMatchTheCpu) {
  std::mt19937 rng(11);
  const int64_t first = 2000, steps = 40;
  SetUpCache(first + steps, &rng);
  SelectionOptions opt;
  opt.policy = SelectionPolicyKind::kQuest;
  opt.n_init = 8;
  opt.k = 160;
  opt.n_local = 32;
  auto provider = CudaSelectionAttention::Create(opt, config_, first + steps, 16);
  ASSERT_TRUE(provider.ok()) << provider.status();
  auto policy = CreateSelectionPolicy(opt);
  ASSERT_TRUE(policy.ok());
  int64_t flips = 0;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t cached = first + t;
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<float> q = RandomQ(1, &rng);
      const AttentionList gpu = RunGpu(provider->get(), layer, cached, q, 1);
      std::vector<float> sel(static_cast<size_t>(config_.num_heads * config_.head_dim));
      ASSERT_TRUE(BuildSelectionQuery(q.data(), 1, config_.num_heads, config_.head_dim,
                                      opt.n_local, inv_freq_.data(), sel.data())
                      .ok());
      SelectionResult result;
      SelectionScratch scratch;
      ASSERT_TRUE((*policy)->Select(CpuInput(sel, cached), &result, &scratch).ok());
      AttentionList cpu;
      ASSERT_TRUE(BuildAttentionList(result.tokens, slots_, cached, 1, &cpu).ok());
      const int64_t mismatches = Mismatches(gpu, cpu);
      EXPECT_LE(mismatches, 2 * opt.baselines.quest_page_size) << "step " << t;
      flips += mismatches > 0;
    }
  }
  EXPECT_LE(flips, 1);
}

// The GPU's selection-cache counters equal the CPU SelectionCache's, and show what theta implies
// for decode queries that drift: -1 misses only each layer's first lookup, above 1 never hits,
// 0.9 both hits and misses.
void ExpectCacheCountersMatch(const SelectionCacheCounters& gpu, const SelectionCacheCounters& cpu,
                              double theta, int64_t num_layers) {
  std::printf("theta %.2f: %lld hits, %lld misses (CPU %lld/%lld)\n", theta,
              static_cast<long long>(gpu.hits), static_cast<long long>(gpu.misses),
              static_cast<long long>(cpu.hits), static_cast<long long>(cpu.misses));
  EXPECT_EQ(gpu.hits, cpu.hits) << "theta=" << theta;
  EXPECT_EQ(gpu.misses, cpu.misses) << "theta=" << theta;
  if (theta == -1.0) {
    EXPECT_EQ(cpu.misses, num_layers);
  }
  if (theta > 1.0) {
    EXPECT_EQ(cpu.hits, 0);
  }
  if (theta == 0.9) {
    EXPECT_GT(cpu.hits, 0);
    EXPECT_GT(cpu.misses, num_layers);
  }
}

// Decode steps through the selection cache: the GPU's hit decisions, counters and lists equal
// the CPU SelectionCache's, for queries that drift slowly (hits at theta 0.9 happen) and for the
// theta extremes; by the plain chain and by the bound-vote selection (bound 1, where the shape
// allows it: a hit's skip flag must leave the cached picks as they are); and the head vote
// through the cache (a hit skips its per-head top-k's too).
TEST_P(CudaSelectionTest, DecodeStepsThroughTheCacheMatchTheCpu) {
  std::mt19937 rng(7);
  const int64_t first = 3000, steps = 40;
  SetUpCache(first + steps, &rng);
  using Case = std::tuple<double, int64_t, SelectionPolicyKind>;
  const SelectionPolicyKind ts = SelectionPolicyKind::kTokenSelect;
  for (const auto& [theta, bound, kind] :
       std::vector<Case>{{0.9, kBoundVoteMinCandidates, ts},
                         {-1.0, kBoundVoteMinCandidates, ts},
                         {1.01, kBoundVoteMinCandidates, ts},
                         {0.9, 1, ts},
                         {1.01, 1, ts},
                         {0.9, kBoundVoteMinCandidates, SelectionPolicyKind::kHeadVote}}) {
    SelectionOptions opt;
    opt.policy = kind;
    opt.n_init = 8;
    opt.k = 200;
    opt.n_local = 32;
    opt.theta = theta;
    auto provider = CudaSelectionAttention::Create(opt, config_, first + steps, 16, 1, 0, bound);
    ASSERT_TRUE(provider.ok()) << provider.status();
    auto policy = CreateSelectionPolicy(opt);
    ASSERT_TRUE(policy.ok());
    SelectionCache cache(config_.num_layers, theta);
    std::vector<float> q = RandomQ(1, &rng);
    std::normal_distribution<float> drift(0.0f, 0.15f);
    int64_t flips = 0;
    for (int64_t t = 0; t < steps; ++t) {
      for (float& x : q) x = RoundBf16(x + (t % 5 == 4 ? 6.0f : 1.0f) * drift(rng));
      const int64_t cached = first + t;
      for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
        const AttentionList gpu = RunGpu(provider->get(), layer, cached, q, 1);
        std::vector<float> sel(static_cast<size_t>(config_.num_heads * config_.head_dim));
        ASSERT_TRUE(BuildSelectionQuery(q.data(), 1, config_.num_heads, config_.head_dim,
                                        opt.n_local, inv_freq_.data(), sel.data())
                        .ok());
        SelectionResult result;
        SelectionScratch scratch;
        ASSERT_TRUE(cache.Select(layer, **policy, CpuInput(sel, cached), &result, &scratch).ok());
        AttentionList cpu;
        ASSERT_TRUE(BuildAttentionList(result.tokens, slots_, cached, 1, &cpu).ok());
        const int64_t mismatches = Mismatches(gpu, cpu);
        EXPECT_LE(mismatches, 2) << "theta=" << theta << " bound=" << bound << " step " << t
                                 << " layer " << layer;
        flips += mismatches > 0;
      }
    }
    EXPECT_LE(flips, 1) << "theta=" << theta << " bound=" << bound;
    auto counters = (*provider)->CacheCounters(nullptr);
    ASSERT_TRUE(counters.ok());
    ExpectCacheCountersMatch(*counters, cache.total_counters(), theta, config_.num_layers);
  }
}

// InfLLM: every step's received attention goes into the layer state on both sides (the GPU's
// ChunkReceivedAttention, the CPU policy's ObserveChunk); each step's list must equal the CPU
// policy's, up to one block flipped by a near-tie once per case. The GPU's exported state then
// equals the CPU's within rounding, and carries over to a second provider.
TEST_P(CudaSelectionTest, InfLlmStepsMatchTheCpuAndItsStateCarriesOver) {
  std::mt19937 rng(29);
  const int64_t chunk = 37, prompt = 30 * chunk, steps = 12;
  const int64_t total = prompt + steps + 1;
  SetUpCache(total, &rng);
  SelectionOptions opt = TestOptions(SelectionPolicyKind::kInfLlm, 8, 96, 32, chunk);
  opt.baselines.infllm_block_size = 16;
  opt.baselines.infllm_representatives = 3;
  StatefulRun run = RunStatefulSteps(this, opt, chunk, prompt, steps, total,
                                     2 * opt.baselines.infllm_block_size, &rng);
  ASSERT_NE(run.provider, nullptr);
  EXPECT_LE(run.flips, 1);
  EXPECT_GT(run.selecting, 20);
  auto exported = run.provider->ExportLayerStates(nullptr);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), static_cast<size_t>(config_.num_layers));
  const double worst = WorstReceived(*exported, run.cpu_state, prompt + steps);
  std::printf(
      "infllm: %lld of %lld selecting layer steps differ from the CPU; received "
      "attention worst |gpu - cpu| / (1 + cpu) %.3g\n",
      static_cast<long long>(run.flips), static_cast<long long>(run.selecting), worst);
  EXPECT_LT(worst, 1e-4);
  ExpectStateCarriesOver(this, opt, run.provider.get(), total, chunk, prompt + steps, &rng);
  // Bad states: a wrong layer count, more tokens than the provider holds; and a state given to
  // a policy that keeps none.
  auto second = CudaSelectionAttention::Create(opt, config_, total, chunk);
  ASSERT_TRUE(second.ok());
  std::vector<SelectionLayerState> one(1);
  EXPECT_EQ((*second)->ImportLayerStates(one, nullptr).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SelectionLayerState> big(static_cast<size_t>(config_.num_layers));
  big[1].received.assign(static_cast<size_t>(total + 1), 1.0f);
  EXPECT_EQ((*second)->ImportLayerStates(big, nullptr).code(), absl::StatusCode::kInvalidArgument);
  SelectionOptions ts = opt;
  ts.policy = SelectionPolicyKind::kTokenSelect;
  auto stateless = CudaSelectionAttention::Create(ts, config_, total, chunk);
  ASSERT_TRUE(stateless.ok());
  auto none = (*stateless)->ExportLayerStates(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ((*stateless)->ImportLayerStates(*exported, nullptr).code(),
            absl::StatusCode::kUnimplemented);
}

// Whether two span indexes hold the same spans and index tokens, with scores within rounding of
// each other (the GPU's map, and so each span's triangle score, is within ~1e-6 of the CPU's).
bool SameSpans(const SpanIndex& a, const SpanIndex& b) {
  if (a.spans().size() != b.spans().size() || a.covered_end() != b.covered_end()) return false;
  for (size_t i = 0; i < a.spans().size(); ++i) {
    const IndexedSpan &x = a.spans()[i], &y = b.spans()[i];
    if (x.begin != y.begin || x.end != y.end || x.num_vectors != y.num_vectors) return false;
    const absl::Span<const int32_t> vx = a.vectors(x), vy = b.vectors(y);
    if (!std::equal(vx.begin(), vx.end(), vy.begin(), vy.end())) return false;
    if (std::fabs(x.score - y.score) > 1e-4 * (1.0 + std::fabs(y.score))) return false;
  }
  return true;
}

// tokenselect_span: every step's spans go into the layer's span index on both sides (the GPU's
// ChunkAttentionMap + DetectChunkSpans, the CPU policy's ChunkAttentionMap + DetectSpans); the
// token budget (4 k = 384 of ~1100 candidates) keeps the span filter active. Each step's list
// must equal the CPU policy's up to a near-tie flip of the soft vote; the exported indexes must
// equal the CPU's (SameSpans: the GPU's map is within ~1e-6 of the CPU's, which moves no span
// here, only the scores' last bits), and the
// state carries over to a second provider. Then a rollback (a step that starts before the
// index's end) and a gap (tokens never observed) take the CPU's paths too.
TEST_P(CudaSelectionTest, SpanIndexStepsMatchTheCpuAndItsStateCarriesOver) {
  std::mt19937 rng(31);
  const int64_t chunk = 37, prompt = 30 * chunk, steps = 12;
  const int64_t total = prompt + steps + 2 * chunk;
  SetUpCache(total, &rng);
  const SelectionOptions opt = TestOptions(SelectionPolicyKind::kTokenSelectSpan, 8, 96, 32, chunk);
  StatefulRun run = RunStatefulSteps(this, opt, chunk, prompt, steps, total, 2, &rng);
  ASSERT_NE(run.provider, nullptr);
  EXPECT_LE(run.flips, 2);
  EXPECT_GT(run.selecting, 20);
  auto exported = run.provider->ExportLayerStates(nullptr);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), static_cast<size_t>(config_.num_layers));
  const double worst = WorstReceived(*exported, run.cpu_state, prompt + steps);
  int64_t spans = 0, differing = 0;
  for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
    const SpanIndex& got = (*exported)[static_cast<size_t>(layer)].spans;
    const SpanIndex& want = run.cpu_state[static_cast<size_t>(layer)].spans;
    spans += static_cast<int64_t>(got.spans().size());
    differing += SameSpans(got, want) ? 0 : 1;
  }
  std::printf(
      "tokenselect_span: %lld of %lld selecting layer steps differ from the CPU; %lld spans, "
      "%lld of %lld layers' indexes differ; received attention worst %.3g\n",
      static_cast<long long>(run.flips), static_cast<long long>(run.selecting),
      static_cast<long long>(spans), static_cast<long long>(differing),
      static_cast<long long>(config_.num_layers), worst);
  EXPECT_EQ(differing, 0);
  EXPECT_GT(spans, 30 * config_.num_layers);
  EXPECT_LT(worst, 1e-4);
  ExpectStateCarriesOver(this, opt, run.provider.get(), total, chunk, prompt + steps, &rng);

  // A rollback to the middle of the prompt, then a chunk after a gap of unobserved tokens: the
  // same indexes as the CPU policy given the same steps.
  auto cpu_policy = CreateSelectionPolicy(opt);
  ASSERT_TRUE(cpu_policy.ok());
  for (const auto& [cached, m] : std::vector<std::pair<int64_t, int64_t>>{
           {prompt / 2 + 5, chunk}, {prompt + steps + chunk / 2, chunk}}) {
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<float> q = RandomQ(m, &rng);
      RunGpu(run.provider.get(), layer, cached, q, m);
      ASSERT_TRUE(
          ObserveOnCpu(**cpu_policy, *this, layer, cached, q, m, &run.cpu_state[layer]).ok());
    }
    auto now = run.provider->ExportLayerStates(nullptr);
    ASSERT_TRUE(now.ok());
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      EXPECT_TRUE(SameSpans((*now)[layer].spans, run.cpu_state[layer].spans))
          << "after the step at " << cached << ", layer " << layer;
      EXPECT_EQ((*now)[layer].spans.covered_end(), cached + m);
    }
  }
  // The device index after the rollback and the gap: the next decode step selects as a fresh
  // provider that imports the host state.
  ExpectStateCarriesOver(this, opt, run.provider.get(), total, chunk,
                         prompt + steps + chunk / 2 + chunk, &rng);
}

// tokenselect_span's decode steps go through the selection cache as on the CPU: with decode
// queries that drift, the GPU's hits and misses equal the CPU SelectionCache's (theta 0.9: both;
// -1: a hit after each layer's first lookup; 1.01: never), and each step's list equals the CPU
// policy's (a hit reuses the stored picks around the current windows).
TEST_P(CudaSelectionTest, SpanDecodeStepsThroughTheCacheMatchTheCpu) {
  const int64_t chunk = 37, prompt = 20 * chunk, steps = 30;
  const int64_t total = prompt + steps;
  for (const double theta : {0.9, -1.0, 1.01}) {
    std::mt19937 rng(43);
    SetUpCache(total, &rng);
    SelectionOptions opt = TestOptions(SelectionPolicyKind::kTokenSelectSpan, 8, 64, 32, chunk);
    opt.theta = theta;
    StatefulRun run = RunStatefulSteps(this, opt, chunk, prompt, steps, total, 2, &rng, 0.15f);
    ASSERT_NE(run.provider, nullptr);
    EXPECT_LE(run.flips, 2) << "theta " << theta;
    auto gpu = run.provider->CacheCounters(nullptr);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    std::printf("tokenselect_span: %lld of %lld selecting layer steps differ; ",
                static_cast<long long>(run.flips), static_cast<long long>(run.selecting));
    ExpectCacheCountersMatch(*gpu, run.cpu_cache, theta, config_.num_layers);
    EXPECT_EQ(run.cpu_cache.lookups(), steps * config_.num_layers);
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      auto picks = run.provider->LayerPicks(layer, nullptr);
      ASSERT_TRUE(picks.ok()) << picks.status();
      EXPECT_LE(static_cast<int64_t>(picks->size()), opt.k);
      EXPECT_TRUE(std::is_sorted(picks->begin(), picks->end()));
    }
  }
}

TEST_P(CudaSelectionTest, RefusesPoliciesWithoutGpuKernelsAndBadSteps) {
  std::mt19937 rng(1);
  SetUpCache(100, &rng);
  SelectionOptions opt;
  // A scoring policy on a head_dim the scoring kernels do not take.
  opt.policy = SelectionPolicyKind::kHeadVote;
  ModelConfig odd = config_;
  odd.head_dim = 96;
  auto refused = CudaSelectionAttention::Create(opt, odd, 100, 8);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("head_dim"), std::string::npos);
  opt.policy = SelectionPolicyKind::kTokenSelect;
  opt.k = -1;
  auto invalid = CudaSelectionAttention::Create(opt, config_, 100, 8);
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.status().message().find("selection.k"), std::string::npos);
  opt.k = 16;
  auto provider = CudaSelectionAttention::Create(opt, config_, 100, 8);
  ASSERT_TRUE(provider.ok());
  CudaAttentionQuery query;
  query.config = &config_;
  query.num_new = 9;  // more than max_new
  CudaAttentionList list;
  EXPECT_EQ((*provider)->Select(query, &list).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSelectionTest,
                         ::testing::Values(Shape{8, 8, 64}, Shape{8, 2, 128}, Shape{32, 8, 128},
                                           Shape{4, 1, 64}));

}  // namespace
}  // namespace tokenselect::engine
