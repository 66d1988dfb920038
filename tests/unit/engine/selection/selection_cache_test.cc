#include "engine/selection/selection_cache.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/selection/selection_reference.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kHeads = 8, kKvHeads = 2, kDim = 32;
constexpr int64_t kInit = 4, kK = 16, kLocal = 8;
constexpr int64_t kLayers = 2;

std::unique_ptr<SelectionPolicy> MakePolicy(SelectionPolicyKind kind) {
  SelectionOptions options;
  options.policy = kind;
  options.n_init = kInit;
  options.k = kK;
  options.n_local = kLocal;
  return std::move(CreateSelectionPolicy(options)).value();
}

// A decode run: one key cache of `max_tokens` tokens (slots identity), a fresh random query per
// (step, layer) unless `similar`, in which case every query is the same base plus tiny noise.
class DecodeRun {
 public:
  DecodeRun(int64_t max_tokens, uint32_t seed, bool similar)
      : keys_(reference::MakeProblem(kHeads, kKvHeads, kDim, max_tokens, seed, false)),
        rng_(seed + 1),
        similar_(similar),
        base_(kHeads * kDim) {
    for (float& x : base_) x = normal_(rng_);
  }

  // The input for a step with `num_tokens` cached tokens; the query is stored in query_.
  SelectionInput Input(int64_t num_tokens) {
    query_.resize(kHeads * kDim);
    for (size_t e = 0; e < query_.size(); ++e) {
      query_[e] = similar_ ? base_[e] + 1e-3f * normal_(rng_) : normal_(rng_);
    }
    SelectionInput input;
    input.query = query_.data();
    input.num_heads = kHeads;
    input.keys.k_cache = keys_.k_cache.data();
    input.keys.slots = keys_.slots.data();
    input.keys.num_tokens = num_tokens;
    input.keys.num_slots = keys_.num_slots;
    input.keys.num_kv_heads = kKvHeads;
    input.keys.head_dim = kDim;
    return input;
  }

 private:
  reference::Problem keys_;
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
  bool similar_;
  std::vector<float> base_;
  std::vector<float> query_;
};

TEST(SelectionCacheTest, CosineDefinition) {
  const std::vector<float> x = {1, 0}, y = {0, 1}, minus_x = {-2, 0}, zero = {0, 0};
  EXPECT_DOUBLE_EQ(SelectionQueryCosine(x, x), 1.0);
  EXPECT_DOUBLE_EQ(SelectionQueryCosine(x, y), 0.0);
  EXPECT_DOUBLE_EQ(SelectionQueryCosine(x, minus_x), -1.0);
  EXPECT_DOUBLE_EQ(SelectionQueryCosine(x, zero), 0.0);
  EXPECT_NEAR(SelectionQueryCosine(std::vector<float>{1, 1}, x), std::sqrt(0.5), 1e-12);
}

TEST(SelectionCacheTest, ThetaAboveOneNeverHitsAndEqualsNoCache) {
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
                                   SelectionPolicyKind::kHeadVote}) {
    auto policy = MakePolicy(kind);
    SelectionCache cache(kLayers, 1.01);
    DecodeRun run(400, 3, /*similar=*/true);  // near-identical queries: would hit at theta < 1
    SelectionScratch scratch;
    for (int64_t step = 0; step < 20; ++step) {
      for (int64_t layer = 0; layer < kLayers; ++layer) {
        const SelectionInput input = run.Input(300 + step);
        SelectionResult cached, direct;
        bool hit = true;
        ASSERT_TRUE(cache.Select(layer, *policy, input, &cached, &scratch, &hit).ok());
        ASSERT_TRUE(policy->Select(input, &direct).ok());
        EXPECT_FALSE(hit);
        EXPECT_EQ(cached.tokens, direct.tokens);
        EXPECT_EQ(cached.picks, direct.picks);
        EXPECT_EQ(cached.num_candidates_scored, direct.num_candidates_scored);
      }
    }
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      EXPECT_EQ(cache.layer_counters(layer).hits, 0);
      EXPECT_EQ(cache.layer_counters(layer).misses, 20);
    }
    EXPECT_EQ(cache.total_counters().lookups(), 40);
  }
}

TEST(SelectionCacheTest, ThetaMinusOneAlwaysHitsAfterTheFirstStepAndTheLocalWindowMoves) {
  auto policy = MakePolicy(SelectionPolicyKind::kTokenSelect);
  SelectionCache cache(kLayers, -1.0);
  DecodeRun run(400, 5, /*similar=*/false);  // unrelated queries: cosine near 0
  std::vector<std::vector<int32_t>> first_picks(kLayers);
  const int64_t n0 = 300;
  for (int64_t step = 0; step < 25; ++step) {
    const int64_t n = n0 + step;
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      SelectionResult r;
      bool hit = false;
      ASSERT_TRUE(cache.Select(layer, *policy, run.Input(n), &r, nullptr, &hit).ok());
      EXPECT_EQ(hit, step > 0);
      if (step == 0) {
        first_picks[layer] = r.picks;
        EXPECT_EQ(r.num_candidates_scored, n - kInit - kLocal);
        ASSERT_EQ(static_cast<int64_t>(r.picks.size()), kK);
        continue;
      }
      // Reused picks (all still candidates: N only grew), init and local rebuilt for this N.
      EXPECT_EQ(r.num_candidates_scored, 0);
      EXPECT_EQ(r.picks, first_picks[layer]);
      EXPECT_EQ(r.tokens, reference::Assemble(n, kInit, kLocal, first_picks[layer]));
      EXPECT_EQ(r.tokens.back(), n - 1);
      EXPECT_EQ(r.tokens[r.tokens.size() - kLocal], n - kLocal);
      // Tokens that left the local window are gone unless they were picked.
      const int32_t left = static_cast<int32_t>(n0 - kLocal);
      const bool picked =
          std::binary_search(first_picks[layer].begin(), first_picks[layer].end(), left);
      EXPECT_EQ(std::binary_search(r.tokens.begin(), r.tokens.end(), left), picked);
    }
  }
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(cache.layer_counters(layer).misses, 1);
    EXPECT_EQ(cache.layer_counters(layer).hits, 24);
  }
  EXPECT_EQ(cache.total_counters().hits, 48);
  EXPECT_EQ(cache.total_counters().misses, 2);
}

TEST(SelectionCacheTest, DefaultThetaHitsSimilarQueriesAndReplacesOnAMiss) {
  auto policy = MakePolicy(SelectionPolicyKind::kTokenSelect);
  SelectionCache cache(1, 0.9);
  DecodeRun similar(400, 8, /*similar=*/true);
  SelectionResult r;
  bool hit = false;
  ASSERT_TRUE(cache.Select(0, *policy, similar.Input(300), &r, nullptr, &hit).ok());
  EXPECT_FALSE(hit);  // first lookup
  ASSERT_TRUE(cache.Select(0, *policy, similar.Input(301), &r, nullptr, &hit).ok());
  EXPECT_TRUE(hit);
  DecodeRun other(400, 8, /*similar=*/false);
  const SelectionInput fresh = other.Input(302);
  SelectionResult direct;
  ASSERT_TRUE(policy->Select(fresh, &direct).ok());
  ASSERT_TRUE(cache.Select(0, *policy, fresh, &r, nullptr, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(r.tokens, direct.tokens);
  // The entry now holds the fresh query: the same query again hits with its picks.
  ASSERT_TRUE(cache.Select(0, *policy, fresh, &r, nullptr, &hit).ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(r.picks, direct.picks);
  EXPECT_EQ(cache.layer_counters(0).hits, 2);
  EXPECT_EQ(cache.layer_counters(0).misses, 2);
}

TEST(SelectionCacheTest, HitsDropPicksInTheLocalWindowOrBeyondNWithoutRefilling) {
  auto policy = MakePolicy(SelectionPolicyKind::kTopK);
  SelectionCache cache(1, -1.0);
  DecodeRun run(400, 2, false);
  const SelectionInput input = run.Input(60);
  cache.Store(0, absl::MakeConstSpan(input.query, kHeads * kDim),
              std::vector<int32_t>{5, 50, 53, 90});
  SelectionResult r;
  bool hit = false;
  ASSERT_TRUE(cache.Select(0, *policy, input, &r, nullptr, &hit).ok());
  EXPECT_TRUE(hit);
  // Candidates [4, 52): 53 is in the local window [52, 60), 90 is beyond N.
  EXPECT_THAT(r.picks, ElementsAre(5, 50));
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 3, 5, 50, 52, 53, 54, 55, 56, 57, 58, 59));
}

TEST(SelectionCacheTest, NonLookupsAreNotCounted) {
  SelectionCache cache(1, -1.0);
  DecodeRun run(400, 4, false);
  SelectionResult r;
  bool hit = true;
  // Dense and streaming never score keys.
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kDense, SelectionPolicyKind::kStreaming}) {
    ASSERT_TRUE(cache.Select(0, *MakePolicy(kind), run.Input(300), &r, nullptr, &hit).ok());
    EXPECT_FALSE(hit);
  }
  // Budget covering N: full attention, no lookup.
  auto policy = MakePolicy(SelectionPolicyKind::kTokenSelect);
  ASSERT_TRUE(cache.Select(0, *policy, run.Input(kInit + kK + kLocal), &r, nullptr, &hit).ok());
  EXPECT_TRUE(r.full_attention);
  EXPECT_EQ(cache.total_counters().lookups(), 0);
  // The first real lookup is a miss.
  ASSERT_TRUE(cache.Select(0, *policy, run.Input(kInit + kK + kLocal + 1), &r, nullptr, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.layer_counters(0).misses, 1);
}

TEST(SelectionCacheTest, ErrorsCountNothing) {
  SelectionCache cache(2, 0.9);
  auto policy = MakePolicy(SelectionPolicyKind::kTokenSelect);
  DecodeRun run(400, 4, false);
  SelectionResult r;
  absl::Status status = cache.Select(2, *policy, run.Input(300), &r);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("layer 2"));
  SelectionInput bad = run.Input(300);
  bad.keys.num_kv_heads = 3;
  EXPECT_EQ(cache.Select(0, *policy, bad, &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.total_counters().lookups(), 0);
}

TEST(SelectionCacheTest, LookupAndStoreCountAndClearForgets) {
  SelectionCache cache(1, 0.5);
  const std::vector<float> q = {1, 2, 3};
  std::vector<int32_t> picks;
  EXPECT_FALSE(cache.Lookup(0, q, &picks));
  cache.Store(0, q, std::vector<int32_t>{7, 9});
  EXPECT_TRUE(cache.Lookup(0, std::vector<float>{1, 2, 3.5f}, &picks));
  EXPECT_THAT(picks, ElementsAre(7, 9));
  EXPECT_FALSE(cache.Lookup(0, std::vector<float>{-1, -2, -3}, &picks));
  EXPECT_FALSE(cache.Lookup(0, std::vector<float>{1, 2}, &picks));  // other size
  cache.Clear();
  EXPECT_FALSE(cache.Lookup(0, q, &picks));
  EXPECT_EQ(cache.layer_counters(0).hits, 1);
  EXPECT_EQ(cache.layer_counters(0).misses, 4);
}

}  // namespace
}  // namespace tokenselect::engine
