// The cascade policy on the GPU (engine/selection/cuda_cascade.h, kernels/cuda/cascade.h)
// against its CPU oracle:
//   - the device cache against CascadeCache (cascade_cache.h) fed the same votes: the same step
//     lists, selected sets and exported state, bit for bit (EMA scores included), over
//     sub-cache layouts with empty sub-caches, one sub-cache, many, and one too large for the
//     kernel's shared-memory staging, through a rollback;
//   - the provider (CudaSelectionAttention) against CascadePolicy on random keys and queries:
//     equal lists step for step (up to a near-tie flip of a boundary comparison), the same held
//     tokens with scores within rounding, a state that carries over to a second provider, and
//     the refusal of states no sequence of pushes could build.
#include "engine/selection/cuda_cascade.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/selection/cascade_cache.h"
#include "engine/selection/selected_set.h"
#include "tests/gpu/cuda_selection_fixture.h"

namespace tokenselect::engine {
namespace {

using gpu_selection_test::CascadeDifference;
using gpu_selection_test::CudaSelectionTest;
using gpu_selection_test::DeviceBuffer;
using gpu_selection_test::ExpectStateCarriesOver;
using gpu_selection_test::RunStatefulSteps;
using gpu_selection_test::Shape;
using gpu_selection_test::StatefulRun;
using gpu_selection_test::TestOptions;

// CascadePolicy::DoSelect's cache steps with given votes (one per entry of the step's list).
struct CpuCascade {
  CascadeCache cache;
  std::vector<int64_t> caps;
  int64_t n_init = 0;
  float decay = 0.9f;

  // The step's list of tokens (held, then new), after the restart rule.
  std::vector<int32_t> Begin(int64_t num_tokens) {
    if (cache.capacities() != caps || cache.next_token > num_tokens) cache.Configure(caps);
    cache.next_token = std::max(cache.next_token, n_init);
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < cache.num_sub_caches(); ++i) {
      for (const CascadeCache::Entry& e : cache.sub_cache(i)) tokens.push_back(e.token);
    }
    for (int64_t t = cache.next_token; t < num_tokens; ++t)
      tokens.push_back(static_cast<int32_t>(t));
    return tokens;
  }
  // The update and the selected set.
  std::vector<int32_t> Finish(int64_t num_tokens, const std::vector<int32_t>& tokens,
                              const std::vector<float>& votes) {
    const size_t held = static_cast<size_t>(cache.size());
    size_t i = 0;
    for (int64_t s = 0; s < cache.num_sub_caches(); ++s) {
      for (CascadeCache::Entry& e : cache.sub_cache(s)) {
        e.ema = decay * e.ema + (1.0f - decay) * votes[i++];
      }
    }
    for (size_t j = held; j < tokens.size(); ++j) cache.Push(tokens[j], votes[j]);
    cache.next_token = std::max(cache.next_token, num_tokens);
    std::vector<int32_t> picks;
    cache.Tokens(&picks);
    SelectionResult out;
    AssembleSelection(num_tokens, n_init, 0, picks, &out);
    return out.tokens;
  }
};

TEST(CudaCascadeTest, DeviceCacheEqualsTheCpuCacheForEqualVotes) {
  struct Case {
    int64_t n_init, k, n_local, subs;
  };
  // 40 slots in 4; 3 slots in 4 (one sub-cache of none); one sub-cache; 30 of 3-4 slots; 7000
  // slots (56 KB: the unstaged kernel).
  for (const Case& c : std::vector<Case>{
           {4, 32, 8, 4}, {2, 2, 1, 4}, {0, 30, 7, 1}, {3, 90, 20, 30}, {16, 6000, 1000, 3}}) {
    SelectionOptions opt;
    opt.policy = SelectionPolicyKind::kCascade;
    opt.n_init = c.n_init;
    opt.k = c.k;
    opt.n_local = c.n_local;
    opt.baselines.cascade_sub_caches = c.subs;
    const int64_t budget = c.n_init + c.k + c.n_local;
    const int64_t max_tokens = 4 * budget + 2000;
    auto cascade = CudaCascade::Create(opt, 2, max_tokens);
    ASSERT_TRUE(cascade.ok()) << cascade.status();
    CpuCascade cpu;
    cpu.caps = CascadeCache::EqualCapacities(c.k + c.n_local, c.subs);
    cpu.n_init = c.n_init;
    cpu.decay = static_cast<float>(opt.baselines.cascade_ema_decay);
    std::mt19937 rng(static_cast<uint32_t>(c.k * 31 + c.subs));
    std::vector<int32_t> slots(static_cast<size_t>(max_tokens));
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(3 * i + 1);
    std::shuffle(slots.begin(), slots.end(), rng);
    const DeviceBuffer<int32_t> d_slots(slots);
    // Votes of a few distinct values, so that boundary comparisons often tie (the resident
    // stays).
    std::uniform_int_distribution<int> level(0, 7);
    // Prefill-like steps (1300 new tokens: pieces of 512), decode steps, a rollback, then more
    // steps.
    std::vector<int64_t> lengths = {budget + 1, budget + 300, 2 * budget + 17, 2 * budget + 1317};
    for (int64_t t = 1; t <= 40; ++t) lengths.push_back(2 * budget + 1317 + t);
    lengths.push_back(budget + 5);  // a rollback: the cache restarts
    for (int64_t t = 1; t <= 30; ++t) lengths.push_back(budget + 5 + 19 * t);
    const int64_t layer = 1;
    for (int64_t n : lengths) {
      const std::vector<int32_t> tokens = cpu.Begin(n);
      auto list = (*cascade)->Begin(layer, n, d_slots.get(), nullptr);
      ASSERT_TRUE(list.ok()) << list.status();
      ASSERT_GE(list->bound, static_cast<int64_t>(tokens.size()));
      const int32_t length = gpu_test::DownloadFrom(list->length, 1)[0];
      ASSERT_EQ(length, static_cast<int32_t>(tokens.size())) << "N=" << n << " subs " << c.subs;
      const std::vector<int32_t> got_slots = gpu_test::DownloadFrom(list->slots, length);
      for (size_t j = 0; j < tokens.size(); ++j) {
        ASSERT_EQ(got_slots[j], slots[tokens[j]]) << "list entry " << j << " N=" << n;
      }
      std::vector<float> votes(static_cast<size_t>(list->bound), -1.0f);
      for (size_t j = 0; j < tokens.size(); ++j) votes[j] = 0.125f * level(rng);
      const DeviceBuffer<float> d_votes(votes);
      DeviceBuffer<int32_t> selected(static_cast<size_t>(budget)), count(1);
      ASSERT_TRUE(
          (*cascade)->Finish(layer, n, d_votes.get(), selected.get(), count.get(), nullptr).ok());
      const std::vector<int32_t> want = cpu.Finish(n, tokens, votes);
      const int32_t got_count = gpu_test::DownloadFrom(count.get(), 1)[0];
      ASSERT_EQ(got_count, static_cast<int32_t>(want.size())) << "N=" << n;
      EXPECT_EQ(gpu_test::DownloadFrom(selected.get(), got_count), want) << "N=" << n;
      auto states = (*cascade)->Export(nullptr);
      ASSERT_TRUE(states.ok());
      EXPECT_EQ(CascadeDifference((*states)[layer].cascade, cpu.cache, 0.0), "")
          << "N=" << n << " subs " << c.subs;
      // The layer never selected stays the CPU's unconfigured cache.
      EXPECT_TRUE((*states)[0].cascade.capacities().empty());
    }
  }
}

class CudaCascadeProviderTest : public CudaSelectionTest {};

// The provider over a prompt in chunks and decode steps, against CascadePolicy.
TEST_P(CudaCascadeProviderTest, StepsMatchTheCpuAndTheStateCarriesOver) {
  std::mt19937 rng(37);
  const int64_t chunk = 37, prompt = 30 * chunk, steps = 16;
  const int64_t total = prompt + steps + 2 * chunk;
  SetUpCache(total, &rng);
  SelectionOptions opt = TestOptions(SelectionPolicyKind::kCascade, 8, 96, 32, chunk);
  opt.baselines.cascade_sub_caches = 3;
  StatefulRun run = RunStatefulSteps(this, opt, chunk, prompt, steps, total, 2, &rng);
  ASSERT_NE(run.provider, nullptr);
  EXPECT_LE(run.flips, 1);
  EXPECT_GT(run.selecting, 20);
  auto exported = run.provider->ExportLayerStates(nullptr);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), static_cast<size_t>(config_.num_layers));
  int64_t differing = 0;
  for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
    const std::string diff =
        CascadeDifference((*exported)[layer].cascade, run.cpu_state[layer].cascade, 1e-4);
    differing += !diff.empty();
    if (!diff.empty()) std::printf("layer %lld: %s\n", static_cast<long long>(layer), diff.c_str());
    // The last step selected after prompt + steps - 1 cached tokens.
    EXPECT_EQ((*exported)[layer].cascade.next_token, prompt + steps - 1);
  }
  std::printf(
      "cascade: %lld of %lld selecting layer steps differ from the CPU; %lld of %lld "
      "layers' caches differ\n",
      static_cast<long long>(run.flips), static_cast<long long>(run.selecting),
      static_cast<long long>(differing), static_cast<long long>(config_.num_layers));
  EXPECT_LE(differing, run.flips);
  ExpectStateCarriesOver(this, opt, run.provider.get(), total, chunk, prompt + steps, &rng);

  // States no sequence of pushes builds are refused; a cache of other capacities is dropped
  // (the CPU would restart it).
  auto second = CudaSelectionAttention::Create(opt, config_, total, chunk);
  ASSERT_TRUE(second.ok());
  std::vector<SelectionLayerState> bad = *exported;
  std::vector<std::deque<CascadeCache::Entry>> subs(3);
  const std::vector<int64_t> caps = bad[0].cascade.capacities();
  subs[0] = {{50, 0.5f}, {40, 0.5f}};  // descending
  bad[0].cascade.Restore(caps, subs, {0, 0, 0}, 60);
  EXPECT_EQ((*second)->ImportLayerStates(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  subs[0] = {{40, 0.5f}, {50, 0.5f}};
  bad[0].cascade.Restore(caps, subs, {0, 0, 0}, 50);  // a token not below next_token
  EXPECT_EQ((*second)->ImportLayerStates(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  subs[0].assign(static_cast<size_t>(caps[0] + 1), CascadeCache::Entry{});
  for (size_t q = 0; q < subs[0].size(); ++q) subs[0][q].token = static_cast<int32_t>(q);
  bad[0].cascade.Restore(caps, subs, {0, 0, 0}, 1000);  // over capacity
  EXPECT_EQ((*second)->ImportLayerStates(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad[0].cascade.Restore({5, 5}, {{}, {}}, {0, 0}, 70);  // another layout: dropped
  ASSERT_TRUE((*second)->ImportLayerStates(bad, nullptr).ok());
  auto dropped = (*second)->ExportLayerStates(nullptr);
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE((*dropped)[0].cascade.capacities().empty());
  EXPECT_EQ(CascadeDifference((*dropped)[1].cascade, (*exported)[1].cascade, 0.0), "");

  // A rollback into the prompt: both sides restart the cache.
  auto cpu_policy = CreateSelectionPolicy(opt);
  ASSERT_TRUE(cpu_policy.ok());
  for (int64_t cached : {prompt / 2 + 5, prompt / 2 + 6}) {
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<float> q = RandomQ(1, &rng);
      const AttentionList gpu = RunGpu(run.provider.get(), layer, cached, q, 1);
      std::vector<float> sel(static_cast<size_t>(config_.num_heads * config_.head_dim));
      ASSERT_TRUE(BuildSelectionQuery(q.data(), 1, config_.num_heads, config_.head_dim, opt.n_local,
                                      inv_freq_.data(), sel.data())
                      .ok());
      SelectionInput in = CpuInput(sel, cached);
      in.state = &run.cpu_state[static_cast<size_t>(layer)];
      SelectionResult result;
      ASSERT_TRUE((*cpu_policy)->Select(in, &result).ok());
      AttentionList cpu;
      ASSERT_TRUE(BuildAttentionList(result.tokens, slots_, cached, 1, &cpu).ok());
      EXPECT_LE(Mismatches(gpu, cpu), 2) << "rollback to " << cached << ", layer " << layer;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCascadeProviderTest,
                         ::testing::Values(Shape{8, 8, 64}, Shape{8, 2, 128}, Shape{32, 8, 128},
                                           Shape{4, 1, 64}));

}  // namespace
}  // namespace tokenselect::engine
