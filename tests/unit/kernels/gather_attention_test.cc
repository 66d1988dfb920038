// cpu::GatherAttention against the double-precision reference (reference.h), through the public
// entry point and through each schedule (split keys, tiled) with small tiles so tile and split
// boundaries fall everywhere. Outputs start as NaN, so every element must be written.
#include "kernels/cpu/gather_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/reference.h"

namespace tokenselect::kernels {
namespace {

using cpu::internal::GatherAttentionOptions;
using testing::MaxScaledError;
using testing::RandomVector;
using testing::ReferenceGatherAttention;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// fp32 attention against a double reference: dot products of length <= 128 and sums over up to
// 1e5 keys in fp32 leave errors of about 1e-7 relative to the output scale (1 here).
constexpr double kTolerance = 5e-6;

// A random problem: a cache of num_slots tokens and a list of kv_len distinct slots in random
// order. Positions: compact (0..kv_len-1, queries after them) or "true" (sorted random gaps).
struct Problem {
  int64_t num_queries = 1, kv_len = 0, num_heads = 8, num_kv_heads = 2, head_dim = 64;
  int64_t num_slots = 0;
  std::vector<float> q, k_cache, v_cache, inv_freq;
  std::vector<int32_t> q_positions, kv_slots, kv_positions, visible;
  bool use_visible = false;

  GatherAttentionParams Params(float* out) const {
    GatherAttentionParams p;
    p.out = out;
    p.q = q.data();
    p.q_positions = q_positions.data();
    p.k_cache = k_cache.empty() ? nullptr : k_cache.data();
    p.v_cache = v_cache.empty() ? nullptr : v_cache.data();
    p.kv_slots = kv_slots.empty() ? nullptr : kv_slots.data();
    p.kv_positions = kv_positions.empty() ? nullptr : kv_positions.data();
    p.visible = use_visible ? visible.data() : nullptr;
    p.inv_freq = inv_freq.data();
    p.num_queries = num_queries;
    p.kv_len = kv_len;
    p.num_heads = num_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    return p;
  }
};

enum class Positions { kCompact, kTrue };

Problem MakeProblem(int64_t num_queries, int64_t kv_len, int64_t num_heads, int64_t num_kv_heads,
                    int64_t head_dim, Positions positions, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem pr;
  pr.num_queries = num_queries;
  pr.kv_len = kv_len;
  pr.num_heads = num_heads;
  pr.num_kv_heads = num_kv_heads;
  pr.head_dim = head_dim;
  pr.num_slots = kv_len + kv_len / 3 + 5;
  // Larger queries make the softmax peaked rather than nearly uniform.
  pr.q = RandomVector(static_cast<size_t>(num_queries * num_heads * head_dim), rng, -3.0f, 3.0f);
  pr.k_cache = RandomVector(static_cast<size_t>(pr.num_slots * num_kv_heads * head_dim), rng);
  pr.v_cache = RandomVector(pr.k_cache.size(), rng);
  RopeParams rope;
  rope.head_dim = head_dim;
  rope.theta = 500000.0;
  pr.inv_freq = RopeInverseFrequencies(rope);

  std::vector<int32_t> slots(static_cast<size_t>(pr.num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  pr.kv_slots.assign(slots.begin(), slots.begin() + kv_len);

  pr.kv_positions.resize(static_cast<size_t>(kv_len));
  int32_t next = 0;
  std::uniform_int_distribution<int32_t> gap(1, 40);
  for (int64_t j = 0; j < kv_len; ++j) {
    pr.kv_positions[static_cast<size_t>(j)] = next;
    next += positions == Positions::kCompact ? 1 : gap(rng);
  }
  for (int64_t i = 0; i < num_queries; ++i) {
    pr.q_positions.push_back(next + static_cast<int32_t>(i));
  }
  pr.visible.assign(static_cast<size_t>(num_queries), static_cast<int32_t>(kv_len));
  return pr;
}

// A prefill chunk: the last num_queries list entries are the chunk itself, query i sees the
// selected prefix and chunk tokens up to and including itself, at the position of its token.
void MakeCausal(Problem& pr) {
  const int64_t prefix = pr.kv_len - pr.num_queries;
  for (int64_t i = 0; i < pr.num_queries; ++i) {
    pr.visible[static_cast<size_t>(i)] = static_cast<int32_t>(prefix + i + 1);
    pr.q_positions[static_cast<size_t>(i)] = pr.kv_positions[static_cast<size_t>(prefix + i)];
  }
  pr.use_visible = true;
}

enum class Schedule { kPublic, kSplitKeys, kTiled };

std::vector<float> RunAttention(const Problem& pr, Schedule schedule,
                                const GatherAttentionOptions& options = {}) {
  std::vector<float> out(static_cast<size_t>(pr.num_queries * pr.num_heads * pr.head_dim), kNaN);
  const GatherAttentionParams params = pr.Params(out.data());
  switch (schedule) {
    case Schedule::kPublic:
      cpu::GatherAttention(params);
      break;
    case Schedule::kSplitKeys:
      cpu::internal::GatherAttentionSplitKeys(params, options);
      break;
    case Schedule::kTiled:
      cpu::internal::GatherAttentionTiled(params, options);
      break;
  }
  return out;
}

void ExpectAllFinite(const std::vector<float>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " not written (or not finite)";
  }
}

// Runs the public entry point and both schedules (default and tiny tiles) and compares each
// with the reference.
void CheckAllSchedules(const Problem& pr, const std::string& what) {
  std::vector<float> scratch;
  const std::vector<double> ref = ReferenceGatherAttention(pr.Params(scratch.data()), pr.inv_freq);
  struct Variant {
    const char* name;
    Schedule schedule;
    GatherAttentionOptions options;
  };
  const Variant variants[] = {
      {"public", Schedule::kPublic, {}},
      {"split default", Schedule::kSplitKeys, {}},
      {"split tile 7 x 5 splits", Schedule::kSplitKeys, {7, 5}},
      {"split tile 16 x 1 split", Schedule::kSplitKeys, {16, 1}},
      {"tiled default", Schedule::kTiled, {}},
      {"tiled tile 9", Schedule::kTiled, {9, 0}},
      {"tiled tile 64", Schedule::kTiled, {64, 0}},
      {"tiled tile 40, 5-row items", Schedule::kTiled, {40, 0, 5}},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(what + ", " + v.name);
    const std::vector<float> out = RunAttention(pr, v.schedule, v.options);
    ExpectAllFinite(out);
    EXPECT_LT(MaxScaledError(out, ref), kTolerance);
  }
}

struct Shape {
  int64_t num_heads, num_kv_heads, head_dim;
};

TEST(GatherAttentionTest, MatchesReferenceForGqaGroupsAndHeadDims) {
  const Shape shapes[] = {{4, 4, 64}, {8, 2, 64}, {16, 2, 128}, {8, 8, 128}, {8, 1, 64}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (int64_t num_queries : {1, 3, 20}) {
      for (Positions positions : {Positions::kCompact, Positions::kTrue}) {
        const Problem pr = MakeProblem(num_queries, 300, s.num_heads, s.num_kv_heads, s.head_dim,
                                       positions, seed++);
        CheckAllSchedules(
            pr, "H=" + std::to_string(s.num_heads) + " Hkv=" + std::to_string(s.num_kv_heads) +
                    " d=" + std::to_string(s.head_dim) + " nq=" + std::to_string(num_queries) +
                    (positions == Positions::kCompact ? " compact" : " true"));
      }
    }
  }
}

TEST(GatherAttentionTest, CausalPrefillChunkWithCompactAndTruePositions) {
  for (Positions positions : {Positions::kCompact, Positions::kTrue}) {
    for (const Shape& s : {Shape{32, 8, 128}, Shape{8, 8, 64}}) {
      Problem pr = MakeProblem(/*num_queries=*/64, /*kv_len=*/64 + 190, s.num_heads, s.num_kv_heads,
                               s.head_dim, positions, 77);
      MakeCausal(pr);
      CheckAllSchedules(pr, std::string(positions == Positions::kCompact ? "compact" : "true") +
                                " H=" + std::to_string(s.num_heads));
    }
  }
}

TEST(GatherAttentionTest, OddSizesAndSmallHeadDims) {
  uint32_t seed = 100;
  for (int64_t head_dim : {2, 6, 10, 66}) {
    for (int64_t kv_len : {1, 13}) {
      Problem pr = MakeProblem(3, kv_len, 6, 3, head_dim, Positions::kTrue, seed++);
      CheckAllSchedules(pr, "d=" + std::to_string(head_dim) + " kv=" + std::to_string(kv_len));
    }
  }
}

TEST(GatherAttentionTest, PrefixMasksIncludingEmptyOnes) {
  Problem pr = MakeProblem(7, 50, 8, 2, 64, Positions::kTrue, 5);
  pr.visible = {0, 1, 50, 17, 0, 999, -3};  // clamped to [0, kv_len]
  pr.use_visible = true;
  CheckAllSchedules(pr, "mixed prefixes");
  for (Schedule schedule : {Schedule::kPublic, Schedule::kSplitKeys, Schedule::kTiled}) {
    const std::vector<float> out = RunAttention(pr, schedule);
    const int64_t row = pr.num_heads * pr.head_dim;
    for (int64_t i : {0, 4, 6}) {
      for (int64_t c = 0; c < row; ++c) ASSERT_EQ(out[static_cast<size_t>(i * row + c)], 0.0f);
    }
  }
}

TEST(GatherAttentionTest, EmptyListGivesZerosAndNoQueriesIsANoOp) {
  Problem pr = MakeProblem(4, 0, 8, 2, 64, Positions::kCompact, 9);
  pr.k_cache.clear();
  pr.v_cache.clear();
  for (Schedule schedule : {Schedule::kPublic, Schedule::kSplitKeys, Schedule::kTiled}) {
    for (float x : RunAttention(pr, schedule)) ASSERT_EQ(x, 0.0f);
  }
  pr.num_queries = 0;
  GatherAttentionParams params = pr.Params(nullptr);
  params.q = nullptr;
  cpu::GatherAttention(params);  // must not touch anything
}

// Attention over a list must not depend on where the tokens live in the cache: store the same
// tokens at other slots, follow them with the slot list, and the output is bit-identical.
TEST(GatherAttentionTest, PermutedSlotsGiveIdenticalResults) {
  for (int64_t num_queries : {1, 40}) {
    Problem a = MakeProblem(num_queries, 500, 16, 4, 128, Positions::kTrue, 21);
    Problem b = a;
    std::mt19937 rng(22);
    std::vector<int32_t> where(static_cast<size_t>(a.num_slots));  // a's slot s -> b's slot
    std::iota(where.begin(), where.end(), 0);
    std::shuffle(where.begin(), where.end(), rng);
    const int64_t row = a.num_kv_heads * a.head_dim;
    for (int64_t s = 0; s < a.num_slots; ++s) {
      const int64_t t = where[static_cast<size_t>(s)];
      std::copy_n(a.k_cache.begin() + s * row, row, b.k_cache.begin() + t * row);
      std::copy_n(a.v_cache.begin() + s * row, row, b.v_cache.begin() + t * row);
    }
    for (int32_t& slot : b.kv_slots) slot = where[static_cast<size_t>(slot)];
    for (Schedule schedule : {Schedule::kPublic, Schedule::kSplitKeys, Schedule::kTiled}) {
      const std::vector<float> out_a = RunAttention(a, schedule);
      const std::vector<float> out_b = RunAttention(b, schedule);
      ASSERT_EQ(out_a.size(), out_b.size());
      for (size_t i = 0; i < out_a.size(); ++i) ASSERT_EQ(out_a[i], out_b[i]) << i;
    }
  }
}

// 100K keys and one decode query: many splits and tiles, one long online softmax.
TEST(GatherAttentionTest, LongListSingleQuery) {
  const Problem pr = MakeProblem(1, 100000, 8, 2, 64, Positions::kTrue, 31);
  std::vector<float> scratch;
  const std::vector<double> ref = ReferenceGatherAttention(pr.Params(scratch.data()), pr.inv_freq);
  // Averaged over 1e5 values the outputs are small, so also bound the error relative to them.
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  for (Schedule schedule : {Schedule::kPublic, Schedule::kTiled}) {
    const std::vector<float> out = RunAttention(pr, schedule);
    ExpectAllFinite(out);
    EXPECT_LT(MaxScaledError(out, ref), kTolerance);
    double max_err = 0.0;
    for (size_t i = 0; i < out.size(); ++i) {
      max_err = std::max(max_err, std::fabs(static_cast<double>(out[i]) - ref[i]));
    }
    EXPECT_LT(max_err, 1e-5 * max_ref);
  }
}

// Split count must not matter beyond rounding.
TEST(GatherAttentionTest, SplitCountDoesNotChangeTheResult) {
  const Problem pr = MakeProblem(2, 3000, 8, 2, 128, Positions::kCompact, 41);
  const std::vector<float> one = RunAttention(pr, Schedule::kSplitKeys, {0, 1});
  for (int64_t splits : {2, 7, 64, 3000}) {
    const std::vector<float> many = RunAttention(pr, Schedule::kSplitKeys, {0, splits});
    for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(many[i], one[i], 1e-5) << splits;
  }
}

}  // namespace
}  // namespace tokenselect::kernels
