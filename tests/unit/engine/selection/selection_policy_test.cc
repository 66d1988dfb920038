#include "engine/selection/selection_policy.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/selection/soft_vote.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/selection/selection_reference.h"

namespace tokenselect::engine {
namespace {

using reference::Problem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<SelectionPolicy> MakePolicy(SelectionPolicyKind kind, int64_t n_init, int64_t k,
                                            int64_t n_local, float scale = 1.0f) {
  SelectionOptions options;
  options.policy = kind;
  options.n_init = n_init;
  options.k = k;
  options.n_local = n_local;
  options.scale = scale;
  absl::StatusOr<std::unique_ptr<SelectionPolicy>> policy = CreateSelectionPolicy(options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(policy).value();
}

SelectionInput InputFor(const Problem& p) {
  SelectionInput input;
  input.query = p.query.data();
  input.num_heads = p.num_heads;
  input.keys.k_cache = p.k_cache.data();
  input.keys.slots = p.slots.data();
  input.keys.num_tokens = p.num_tokens;
  input.keys.num_slots = p.num_slots;
  input.keys.num_kv_heads = p.num_kv_heads;
  input.keys.head_dim = p.head_dim;
  return input;
}

SelectionResult MustSelect(const SelectionPolicy& policy, const Problem& p,
                           SelectionScratch* scratch = nullptr) {
  SelectionResult result;
  absl::Status status = policy.Select(InputFor(p), &result, scratch);
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

// `picks` (token indices) agree with the top k of the double-precision `votes` over candidates
// starting at `begin`, up to float rounding: a token may only be swapped for another whose
// reference vote is within `rel_tol` of the k-th best vote.
void ExpectTopKUpToRounding(const std::vector<int32_t>& picks, const std::vector<double>& votes,
                            int64_t begin, int64_t k, double rel_tol) {
  const std::vector<int32_t> ranked = reference::RankedTopK(votes, k);
  ASSERT_EQ(static_cast<int64_t>(picks.size()), static_cast<int64_t>(ranked.size()));
  const double kth = votes[ranked.back()];
  const double tol = rel_tol * std::max(std::abs(kth), 1e-30);
  std::vector<bool> in_ref(votes.size(), false);
  for (int32_t j : ranked) in_ref[j] = true;
  int64_t swapped = 0;
  for (int32_t t : picks) {
    const int64_t j = t - begin;
    ASSERT_GE(j, 0);
    ASSERT_LT(j, static_cast<int64_t>(votes.size()));
    if (!in_ref[j]) {
      ++swapped;
      EXPECT_GE(votes[j], kth - tol) << "token " << t << " is not a near-tie of the k-th vote";
    }
  }
  // Equal sizes: as many reference winners are missing as non-winners were picked, and each
  // missing one must be a near-tie too.
  std::vector<bool> picked(votes.size(), false);
  for (int32_t t : picks) picked[t - begin] = true;
  for (int32_t j : ranked) {
    if (!picked[j]) {
      EXPECT_LE(votes[j], kth + tol) << "missed clear winner " << j + begin;
    }
  }
  EXPECT_LE(swapped, std::max<int64_t>(2, k / 100)) << "too many near-ties";
}

struct Shape {
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
};

const Shape kShapes[] = {{8, 8, 64}, {8, 2, 128}, {32, 8, 128}, {4, 1, 64}};

// Checks the three scoring policies against the references for one problem.
void CheckScoringPolicies(const Problem& p, int64_t n_init, int64_t k, int64_t n_local, float scale,
                          bool exact) {
  SCOPED_TRACE(testing::Message() << "H=" << p.num_heads << " H_kv=" << p.num_kv_heads
                                  << " d=" << p.head_dim << " N=" << p.num_tokens << " budget=("
                                  << n_init << "," << k << "," << n_local << ") scale=" << scale
                                  << " exact=" << exact);
  SelectionScratch scratch;
  auto soft = MakePolicy(SelectionPolicyKind::kTokenSelect, n_init, k, n_local, scale);
  auto topk = MakePolicy(SelectionPolicyKind::kTopK, n_init, k, n_local, scale);
  auto head = MakePolicy(SelectionPolicyKind::kHeadVote, n_init, k, n_local, scale);
  const SelectionResult r_soft = MustSelect(*soft, p, &scratch);
  const SelectionResult r_topk = MustSelect(*topk, p, &scratch);
  const SelectionResult r_head = MustSelect(*head, p, &scratch);
  const int64_t n = p.num_tokens;
  if (n_init + k + n_local >= n) {
    std::vector<int32_t> all(n);
    for (int64_t j = 0; j < n; ++j) all[j] = static_cast<int32_t>(j);
    for (const SelectionResult* r : {&r_soft, &r_topk, &r_head}) {
      EXPECT_EQ(r->tokens, all);
      EXPECT_TRUE(r->full_attention);
      EXPECT_EQ(r->num_candidates_scored, 0);
      EXPECT_TRUE(r->picks.empty());
    }
    return;
  }
  const int64_t begin = n_init;
  const int64_t end = n - n_local;
  const auto logits = reference::Logits(p, scale, begin, end);
  for (const SelectionResult* r : {&r_soft, &r_topk, &r_head}) {
    EXPECT_FALSE(r->full_attention);
    EXPECT_EQ(r->num_candidates_scored, k > 0 ? end - begin : 0);
    EXPECT_EQ(static_cast<int64_t>(r->picks.size()), k);
    EXPECT_EQ(r->tokens, reference::Assemble(n, n_init, n_local, r->picks));
  }
  ExpectTopKUpToRounding(r_soft.picks, reference::SoftVotes(logits), begin, k, 1e-4);
  const std::vector<double> summed = reference::SummedLogits(logits);
  std::vector<int32_t> head_ref = reference::HeadVotePicks(logits, k);
  for (int32_t& j : head_ref) j += static_cast<int32_t>(begin);
  if (exact) {
    std::vector<int32_t> topk_ref = reference::Ascending(reference::RankedTopK(summed, k));
    for (int32_t& j : topk_ref) j += static_cast<int32_t>(begin);
    EXPECT_EQ(r_topk.picks, topk_ref);
    EXPECT_EQ(r_head.picks, head_ref);
  } else {
    ExpectTopKUpToRounding(r_topk.picks, summed, begin, k, 1e-5);
    // Float rounding can move a per-head near-tie; demand near-total agreement.
    std::vector<int32_t> common;
    std::set_intersection(r_head.picks.begin(), r_head.picks.end(), head_ref.begin(),
                          head_ref.end(), std::back_inserter(common));
    EXPECT_GE(static_cast<int64_t>(common.size()), k - std::max<int64_t>(2, k / 50));
  }
}

TEST(SelectionPolicyTest, ScoringPoliciesMatchReferencesAcrossShapesAndSizes) {
  const int64_t n_init = 16, k = 64, n_local = 32, budget = n_init + k + n_local;
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    for (int64_t n : {int64_t{1}, int64_t{37}, budget - 1, budget, budget + 1, int64_t{5000}}) {
      for (bool exact : {false, true}) {
        const Problem p = reference::MakeProblem(s.heads, s.kv_heads, s.head_dim, n, seed++, exact);
        const float scale = exact ? 0.25f : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        CheckScoringPolicies(p, n_init, k, n_local, scale, exact);
      }
    }
  }
}

TEST(SelectionPolicyTest, DefaultBudgetAndScaleAtLargeN) {
  const int64_t n = 65536;
  for (const Shape& s : {Shape{8, 2, 128}, Shape{4, 1, 64}}) {
    for (bool exact : {false, true}) {
      const Problem p = reference::MakeProblem(s.heads, s.kv_heads, s.head_dim, n,
                                               100 + static_cast<uint32_t>(s.heads), exact);
      CheckScoringPolicies(p, 128, 2048, 512, exact ? 0.5f : 1.0f, exact);
    }
  }
}

TEST(SelectionPolicyTest, ZeroBudgetPartsAndZeroK) {
  const Problem p = reference::MakeProblem(8, 2, 64, 700, 5, false);
  CheckScoringPolicies(p, 0, 50, 0, 0.125f, false);
  CheckScoringPolicies(p, 10, 0, 20, 0.125f, false);
  CheckScoringPolicies(p, 0, 1, 0, 0.125f, false);
}

TEST(SelectionPolicyTest, SoftVoteVotesSumToNumHeads) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, -1.0f, -1.0f, 4.0f};  // [2, 3]
  std::vector<float> votes(3);
  SoftVote(logits.data(), 2, 3, votes.data());
  EXPECT_NEAR(votes[0] + votes[1] + votes[2], 2.0f, 1e-6f);
  const double z0 = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  const double z1 = 2 * std::exp(-5.0) + 1.0;
  EXPECT_NEAR(votes[2], 1.0 / z0 + 1.0 / z1, 1e-6);
}

// Writes, for every kv head, 30 * unit(sum of its group's query heads) as token t's key: a key
// with an outsized dot product with every query head of the group.
void PlantNeedle(Problem& p, int64_t t) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  for (int64_t kv = 0; kv < p.num_kv_heads; ++kv) {
    std::vector<double> dir(p.head_dim, 0.0);
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      for (int64_t e = 0; e < p.head_dim; ++e) dir[e] += p.query[h * p.head_dim + e];
    }
    double norm = 0.0;
    for (double x : dir) norm += x * x;
    norm = std::sqrt(norm);
    float* key = &p.k_cache[(p.slots[t] * p.num_kv_heads + kv) * p.head_dim];
    for (int64_t e = 0; e < p.head_dim; ++e) key[e] = static_cast<float>(30.0 * dir[e] / norm);
  }
}

// Tokens whose keys are identical get bitwise-identical votes; the lower index must win.
TEST(SelectionPolicyTest, ExactTiesGoToTheLowerTokenIndex) {
  Problem p = reference::MakeProblem(4, 2, 16, 300, 9, false);
  for (int64_t t : {200, 50, 120}) PlantNeedle(p, t);
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
                                   SelectionPolicyKind::kHeadVote}) {
    const SelectionResult r = MustSelect(*MakePolicy(kind, 4, 2, 8), p);
    EXPECT_THAT(r.picks, ElementsAre(50, 120)) << PolicyName(kind);
  }
}

// Query head h reads kv head h / g (DESIGN.md section 4), not h % num_kv_heads. H = 4, H_kv = 2,
// d = 1: only heads 0 and 1 are non-zero, and both belong to kv head 0. Token 0 is strong on kv
// head 1 only, token 1 on kv head 0 only. With h / g token 1 wins clearly; the h % H_kv mapping
// would give each token one strong head and the tie would go to token 0.
TEST(SelectionPolicyTest, QueryHeadUsesKvHeadHDivG) {
  Problem p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 1;
  p.num_tokens = 3;
  p.num_slots = 3;
  p.query = {1.0f, 1.0f, 0.0f, 0.0f};
  p.slots = {0, 1, 2};
  p.k_cache = {0.0f,  10.0f,  // token 0: kv0 = 0, kv1 = 10
               10.0f, 0.0f,   // token 1: kv0 = 10, kv1 = 0
               0.0f,  0.0f};  // token 2
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
                                   SelectionPolicyKind::kHeadVote}) {
    EXPECT_THAT(MustSelect(*MakePolicy(kind, 0, 1, 0), p).picks, ElementsAre(1))
        << PolicyName(kind);
  }
}

TEST(SelectionPolicyTest, HeadVoteTieBreaksBySummedLogitsThenIndex) {
  // Two heads, one kv head each, d = 1: s[h, j] = q_h * key_h(j). Candidates are all tokens.
  Problem p;
  p.num_heads = 2;
  p.num_kv_heads = 2;
  p.head_dim = 1;
  p.num_tokens = 4;
  p.num_slots = 4;
  p.query = {1.0f, 1.0f};
  p.slots = {0, 1, 2, 3};
  auto head_vote = MakePolicy(SelectionPolicyKind::kHeadVote, 0, 2, 0);
  // Head 0 logits [5, 4, 0, 0], head 1 [0, 4, 5, 0]: counts 1, 2, 1, 0; tokens 0 and 2 tie on
  // count and on summed logits (5), so the lower index 0 wins.
  p.k_cache = {5, 0, 4, 4, 0, 5, 0, 0};
  EXPECT_THAT(MustSelect(*head_vote, p).picks, ElementsAre(0, 1));
  // Head 1 logits [0, 4, 6, 0]: token 2 now has the larger summed logits.
  p.k_cache = {5, 0, 4, 4, 0, 6, 0, 0};
  EXPECT_THAT(MustSelect(*head_vote, p).picks, ElementsAre(1, 2));
  // k = 1 with head 0 [5, 1, 0, 0], head 1 [0, 0, 5, 0]: 0 and 2 tie completely -> 0.
  p.k_cache = {5, 0, 1, 0, 0, 5, 0, 0};
  EXPECT_THAT(MustSelect(*MakePolicy(SelectionPolicyKind::kHeadVote, 0, 1, 0), p).picks,
              ElementsAre(0));
}

TEST(SelectionPolicyTest, PlantedNeedleIsAlwaysSelected) {
  const int64_t n = 3000, n_init = 16, k = 64, n_local = 32;
  std::mt19937 rng(42);
  for (const Shape& s : {Shape{8, 2, 64}, Shape{4, 1, 64}, Shape{8, 8, 32}}) {
    for (int trial = 0; trial < 15; ++trial) {
      Problem p = reference::MakeProblem(s.heads, s.kv_heads, s.head_dim, n, rng(), false);
      const int64_t positions[] = {
          n_init,          n_init + 1,
          n / 2,           n - n_local - 2,
          n - n_local - 1, std::uniform_int_distribution<int64_t>(n_init, n - n_local - 1)(rng)};
      const int64_t needle = positions[trial % 6];
      PlantNeedle(p, needle);
      for (SelectionPolicyKind kind :
           {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
            SelectionPolicyKind::kHeadVote}) {
        for (float scale : {1.0f, 0.125f}) {
          const SelectionResult r = MustSelect(*MakePolicy(kind, n_init, k, n_local, scale), p);
          EXPECT_TRUE(std::binary_search(r.picks.begin(), r.picks.end(), needle))
              << PolicyName(kind) << " missed the needle at " << needle << " (trial " << trial
              << ")";
        }
      }
    }
  }
}

TEST(SelectionPolicyTest, FullAttentionExactlyWhenTheBudgetCoversN) {
  const int64_t n_init = 8, k = 16, n_local = 8, budget = 32;
  for (SelectionPolicyKind kind :
       {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
        SelectionPolicyKind::kHeadVote, SelectionPolicyKind::kStreaming}) {
    auto policy = MakePolicy(kind, n_init, k, n_local);
    for (int64_t n : {int64_t{0}, int64_t{1}, budget - 1, budget}) {
      const Problem p = reference::MakeProblem(4, 2, 8, n, 3, false);
      const SelectionResult r = MustSelect(*policy, p);
      EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), n) << PolicyName(kind);
      EXPECT_TRUE(r.full_attention);
    }
    const Problem p = reference::MakeProblem(4, 2, 8, budget + 1, 3, false);
    const SelectionResult r = MustSelect(*policy, p);
    EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), budget) << PolicyName(kind);
    EXPECT_FALSE(r.full_attention);
  }
}

TEST(SelectionPolicyTest, DenseSelectsEverythingWithoutReadingKeys) {
  auto dense = MakePolicy(SelectionPolicyKind::kDense, 4, 4, 4);
  EXPECT_FALSE(dense->scores_keys());
  SelectionInput input;  // no query, no keys: dense reads only num_tokens
  input.keys.num_tokens = 100;
  SelectionResult r;
  ASSERT_TRUE(dense->Select(input, &r).ok());
  EXPECT_EQ(r.tokens.size(), 100u);
  EXPECT_EQ(r.tokens.back(), 99);
  EXPECT_TRUE(r.full_attention);
  EXPECT_EQ(r.num_candidates_scored, 0);
}

TEST(SelectionPolicyTest, StreamingKeepsSinksAndAWindowOfKPlusNLocal) {
  auto streaming = MakePolicy(SelectionPolicyKind::kStreaming, 3, 4, 2);
  EXPECT_FALSE(streaming->scores_keys());
  SelectionInput input;
  input.keys.num_tokens = 20;
  SelectionResult r;
  ASSERT_TRUE(streaming->Select(input, &r).ok());
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 14, 15, 16, 17, 18, 19));
  EXPECT_TRUE(r.picks.empty());
  EXPECT_FALSE(r.full_attention);
}

TEST(SelectionPolicyTest, InvalidInputsNameTheField) {
  Problem p = reference::MakeProblem(6, 4, 8, 200, 1, false);
  auto policy = MakePolicy(SelectionPolicyKind::kTokenSelect, 4, 8, 4);
  SelectionResult r;
  absl::Status status = policy->Select(InputFor(p), &r);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("num_heads (6)"));

  p = reference::MakeProblem(8, 4, 8, 200, 1, false);
  p.slots[17] = static_cast<int32_t>(p.num_slots);
  status = policy->Select(InputFor(p), &r);
  EXPECT_THAT(std::string(status.message()), HasSubstr("keys.slots[17]"));

  p = reference::MakeProblem(8, 4, 8, 200, 1, false);
  SelectionInput input = InputFor(p);
  input.query = nullptr;
  EXPECT_THAT(std::string(policy->Select(input, &r).message()), HasSubstr("query"));
  input = InputFor(p);
  input.keys.head_dim = 0;
  EXPECT_THAT(std::string(policy->Select(input, &r).message()), HasSubstr("keys.head_dim"));
  input = InputFor(p);
  input.keys.num_tokens = -1;
  EXPECT_THAT(std::string(policy->Select(input, &r).message()), HasSubstr("keys.num_tokens"));
  // Within the budget nothing is read, so missing keys are fine.
  input = SelectionInput();
  input.keys.num_tokens = 16;
  EXPECT_TRUE(policy->Select(input, &r).ok());
  EXPECT_EQ(r.tokens.size(), 16u);
}

TEST(SelectionPolicyTest, FactoryRejectsInvalidOptions) {
  SelectionOptions options;
  options.chunk_size = 0;
  absl::StatusOr<std::unique_ptr<SelectionPolicy>> policy = CreateSelectionPolicy(options);
  ASSERT_FALSE(policy.ok());
  EXPECT_THAT(std::string(policy.status().message()), HasSubstr("selection.chunk_size"));
  options = SelectionOptions();
  options.policy = SelectionPolicyKind::kHeadVote;
  policy = CreateSelectionPolicy(options);
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ((*policy)->kind(), SelectionPolicyKind::kHeadVote);
  EXPECT_TRUE((*policy)->scores_keys());
}

}  // namespace
}  // namespace tokenselect::engine
