// Needs a GPU (label gpu): the CUDA selection kernels (kernels/cuda/selection.h) against the CPU
// selection oracle (engine/selection: ScoreCandidates, SoftVote, SumOverHeads, TopKByScore) on
// fresh random inputs, odd sizes, groups 1/2/4/8 and head dims 64/128. Outputs are poisoned with
// NaN (-1 for indices) before every run, so an unwritten element fails.
// ScoreKeys' statistics bit for bit across repeated calls (whichever block finishes last), and
// within 1e-6 under a device length (the grid then follows the bound).
// SelectionCacheCheck against the CPU cache's rule (engine/selection/selection_cache.h: cosine
// in double, clamped, 0 for a zero vector; the CPU cosine is re-stated here, because
// selection_cache.cc needs the policy library), step by step over query sequences and thetas;
// the skip flags: a set flag leaves every output and workspace byte untouched, a clear one gives
// bitwise the results of no flag, and a check -> score -> vote -> top-k chain keeps the cached
// top-k on a hit. The top-k from the vote's own first-digit histogram (VoteParams::
// top_k_workspace, TopKParams::histogram_ready) against the two plain calls.
//
// Tolerance rule for the selected indices against the CPU's (votes differ by fp32 rounding: a
// different summation order in the dot products and exp, ~1e-6 relative, checked at 1e-4):
//   1. The GPU top-k of the GPU votes must equal the CPU TopKByScore of the same (downloaded)
//      votes exactly: the top-k itself has no tolerance, ties included.
//   2. Against the CPU votes, let t be the k-th best CPU vote. An index the GPU picked and the CPU
//      did not must have cpu_vote >= t * (1 - 2e-4); one the CPU picked and the GPU did not must
//      have cpu_vote <= t * (1 + 2e-4). Mismatches are thus only swaps across the threshold
//      within twice the vote tolerance (near-ties), never a clearly better token left out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "engine/selection/key_scores.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/top_k.h"
#include "gtest/gtest.h"
#include "kernels/cuda/selection.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

// The soft vote's device buffers over n candidates and the ScoreKeys / VoteFromLogits params
// that write them; the keys (bf16 bits), query and slots are the test's.
struct SoftVoteBuffers {
  SoftVoteBuffers(int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  const float* query, const uint16_t* keys, const int32_t* slots)
      : logits(static_cast<size_t>(n * num_heads)),
        head_max(static_cast<size_t>(num_heads)),
        inv_sum(static_cast<size_t>(num_heads)),
        vote(static_cast<size_t>(n)),
        score_ws(ScoreKeysWorkspaceBytes(num_heads)) {
    score_ws.Zero();
    sp.logits = logits.get();
    sp.head_max = head_max.get();
    sp.head_inv_sum = inv_sum.get();
    sp.query = query;
    sp.k_cache = reinterpret_cast<const __nv_bfloat16*>(keys);
    sp.slots = slots;
    sp.workspace = score_ws.get();
    sp.n = n;
    sp.num_heads = num_heads;
    sp.num_kv_heads = num_kv_heads;
    sp.head_dim = head_dim;
    vp.vote = vote.get();
    vp.logits = logits.get();
    vp.head_max = head_max.get();
    vp.head_inv_sum = inv_sum.get();
    vp.n = n;
    vp.num_heads = num_heads;
  }

  DeviceBuffer<float> logits, head_max, inv_sum, vote;
  DeviceBuffer<char> score_ws;
  KeyScoreParams sp;
  VoteParams vp;
};

struct ScoreCase {
  int64_t n;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t k;
  // 0: n distinct slots out of n + 777; else the candidates' slots drawn (with repeats) from a
  // cache of this many rows, so that long lists need no host memory for n distinct keys.
  int64_t slot_pool = 0;
};

class SelectionGpuTest : public ::testing::TestWithParam<ScoreCase> {};

TEST_P(SelectionGpuTest, ScoreVoteTopKMatchCpu) {
  const ScoreCase c = GetParam();
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t num_slots = c.slot_pool > 0 ? c.slot_pool : c.n + 777;
  const int64_t row = c.num_kv_heads * c.head_dim;
  std::vector<float> keys(static_cast<size_t>(num_slots * row));
  for (float& x : keys) x = normal(rng);
  const std::vector<uint16_t> key_bits = gpu_test::RoundToBf16(&keys);
  // Query scaled so that logits have a std of ~3 (a peaked but not degenerate softmax).
  std::vector<float> query(static_cast<size_t>(c.num_heads * c.head_dim));
  const float q_std = 3.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (float& x : query) x = normal(rng) * q_std;
  std::vector<int32_t> slots(static_cast<size_t>(c.n));
  if (c.slot_pool > 0) {
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(num_slots - 1));
    for (int32_t& slot : slots) slot = pick(rng);
  } else {
    std::vector<int32_t> perm(static_cast<size_t>(num_slots));
    for (int64_t i = 0; i < num_slots; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    slots.assign(perm.begin(), perm.begin() + c.n);
  }
  const float scale = 1.0f;

  // CPU oracle.
  engine::KeyCacheView view;
  view.k_cache = keys.data();
  view.slots = slots.data();
  view.num_tokens = c.n;
  view.num_slots = num_slots;
  view.num_kv_heads = c.num_kv_heads;
  view.head_dim = c.head_dim;
  std::vector<float> cpu_logits(static_cast<size_t>(c.num_heads * c.n));
  engine::ScoreCandidates(query.data(), c.num_heads, view, 0, c.n, scale, cpu_logits.data());
  std::vector<float> cpu_sum(static_cast<size_t>(c.n));
  engine::SumOverHeads(cpu_logits.data(), c.num_heads, c.n, cpu_sum.data());
  std::vector<double> cpu_max(static_cast<size_t>(c.num_heads), -INFINITY);
  std::vector<double> cpu_denominator(static_cast<size_t>(c.num_heads), 0.0);
  for (int64_t h = 0; h < c.num_heads; ++h) {
    for (int64_t j = 0; j < c.n; ++j) cpu_max[h] = std::max<double>(cpu_max[h], cpu_logits[h * c.n + j]);
    for (int64_t j = 0; j < c.n; ++j) cpu_denominator[h] += std::exp(cpu_logits[h * c.n + j] - cpu_max[h]);
  }
  std::vector<float> soft = cpu_logits;
  std::vector<float> cpu_vote(static_cast<size_t>(c.n));
  engine::SoftVote(soft.data(), c.num_heads, c.n, cpu_vote.data());

  // GPU.
  DeviceBuffer<uint16_t> d_keys(key_bits);
  DeviceBuffer<float> d_query(query);
  DeviceBuffer<int32_t> d_slots(slots);
  SoftVoteBuffers sv(c.n, c.num_heads, c.num_kv_heads, c.head_dim, d_query.get(), d_keys.get(),
                     d_slots.get());
  DeviceBuffer<float>& d_logits = sv.logits;
  DeviceBuffer<float>& d_max = sv.head_max;
  DeviceBuffer<float>& d_inv_sum = sv.inv_sum;
  DeviceBuffer<float>& d_vote = sv.vote;
  DeviceBuffer<float> d_sum(static_cast<size_t>(c.n));
  const int64_t k = std::min(c.k, c.n);
  DeviceBuffer<int32_t> d_topk(static_cast<size_t>(std::max<int64_t>(k, 1)));
  DeviceBuffer<char> d_topk_ws(TopKWorkspaceBytes(c.n));
  d_topk_ws.Zero();  // zeroed once after allocation (selection.h)
  for (auto* b : {&d_logits, &d_max, &d_inv_sum, &d_vote, &d_sum}) b->Poison();
  d_topk.Poison();

  KeyScoreParams sp = sv.sp;
  sp.scale = scale;
  // Twice: the workspace's completion counter must be left ready for the next launch.
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(ScoreKeys(sp, nullptr), cudaSuccess);
  }
  VoteParams vp = sv.vp;
  ASSERT_EQ(VoteFromLogits(vp, nullptr), cudaSuccess);
  vp.vote = d_sum.get();
  vp.mode = VoteMode::kSumLogits;
  ASSERT_EQ(VoteFromLogits(vp, nullptr), cudaSuccess);
  TopKParams tp;
  tp.out = d_topk.get();
  tp.scores = d_vote.get();
  tp.workspace = d_topk_ws.get();
  tp.n = c.n;
  tp.k = c.k;
  ASSERT_EQ(TopK(tp, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> logits = d_logits.Download();
  for (int64_t j = 0; j < c.n; ++j) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float ref = cpu_logits[h * c.n + j];
      const float got = logits[LogitIndex(j, h, c.n, c.num_heads)];
      ASSERT_NEAR(got, ref, 1e-4f + 1e-5f * std::fabs(ref)) << "token " << j << " head " << h;
    }
  }
  const std::vector<float> head_max = d_max.Download();
  const std::vector<float> inv_sum = d_inv_sum.Download();
  for (int64_t h = 0; h < c.num_heads; ++h) {
    EXPECT_NEAR(head_max[h], cpu_max[h], 1e-4 + 1e-5 * std::fabs(cpu_max[h])) << h;
    EXPECT_NEAR(inv_sum[h] * cpu_denominator[h], 1.0, 1e-4) << h;
  }
  const std::vector<float> vote = d_vote.Download();
  const std::vector<float> sum = d_sum.Download();
  for (int64_t j = 0; j < c.n; ++j) {
    ASSERT_NEAR(vote[j], cpu_vote[j], 1e-4f * cpu_vote[j] + 1e-30f) << "vote " << j;
    ASSERT_NEAR(sum[j], cpu_sum[j], 1e-4f * (1.0f + std::fabs(cpu_sum[j]))) << "sum " << j;
  }

  // Rule 1: exact against the CPU top-k of the same votes.
  std::vector<int32_t> topk = d_topk.Download();
  topk.resize(static_cast<size_t>(k));
  std::vector<int32_t> expected;
  engine::TopKByScore(vote.data(), c.n, c.k, &expected);
  ASSERT_EQ(topk, expected);
  // Rule 2: against the CPU votes, mismatches only across the threshold within tolerance.
  std::vector<int32_t> cpu_topk;
  engine::TopKByScore(cpu_vote.data(), c.n, c.k, &cpu_topk);
  if (k > 0 && k < c.n) {
    std::vector<float> sorted = cpu_vote;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
    const float t = sorted[k - 1];
    const std::set<int32_t> gpu_set(topk.begin(), topk.end());
    const std::set<int32_t> cpu_set(cpu_topk.begin(), cpu_topk.end());
    int mismatches = 0;
    for (int32_t i : topk) {
      if (cpu_set.count(i) == 0) {
        ++mismatches;
        EXPECT_GE(cpu_vote[i], t * (1.0f - 2e-4f)) << "GPU picked " << i;
      }
    }
    for (int32_t i : cpu_topk) {
      if (gpu_set.count(i) == 0) {
        EXPECT_LE(cpu_vote[i], t * (1.0f + 2e-4f)) << "GPU left " << i;
      }
    }
    RecordProperty("mismatches", mismatches);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SelectionGpuTest,
    ::testing::Values(ScoreCase{1, 32, 8, 128, 2048},         // one token
                      ScoreCase{1001, 32, 8, 128, 2048},      // k > n
                      ScoreCase{70001, 32, 8, 128, 2048},     // Llama-3-8B, g = 4
                      // Tensor-core scoring (g = 4, d = 128) at the TP = 2 / 4 / 8 head counts
                      // (2, 4, 8 rows of warps), and a length past a thousand blocks.
                      ScoreCase{60013, 16, 4, 128, 2048},
                      ScoreCase{20011, 8, 2, 128, 1024},
                      ScoreCase{9001, 4, 1, 128, 512},
                      ScoreCase{600011, 32, 8, 128, 2048, 65536},
                      ScoreCase{40009, 32, 4, 128, 1000},     // g = 8
                      ScoreCase{33333, 8, 8, 128, 777},       // g = 1
                      ScoreCase{25013, 12, 6, 64, 513},       // g = 2, d = 64
                      ScoreCase{50021, 12, 3, 64, 4097},      // g = 4, odd kv heads
                      ScoreCase{30011, 16, 2, 64, 16384}));   // g = 8, d = 64, large k

// ScoreKeys' statistics come from a fixed summation order whichever block finishes last (the
// blocks' partials are merged per group of blocks, then across groups, by whichever block
// arrives last): repeated calls give the same bits. A call whose length is read from the device
// under a larger bound (a graph's replay) splits the tokens into blocks by the bound, so its
// sums may differ in the last bits; its logits and maxima may not. Shapes of both kernels: tensor
// cores for d = 128, g = 4 (TP = 1 and 2 head counts), the lane kernel otherwise; lengths from
// one tile to past a thousand blocks.
TEST(ScoreKeysGpuTest, StatisticsAreDeterministicAndFollowTheDeviceLength) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int64_t heads, kv_heads, dim;
  };
  for (const Shape shape : {Shape{32, 8, 128}, Shape{16, 4, 128}, Shape{32, 4, 128}}) {
    for (int64_t n : {63, 64, 2048, 2049, 70001, 524289 + 77}) {
      SCOPED_TRACE(testing::Message() << "heads " << shape.heads << "/" << shape.kv_heads
                                      << ", n " << n);
      const int64_t pool = 4099, bound = n + 3001;
      std::vector<float> keys(static_cast<size_t>(pool * shape.kv_heads * shape.dim));
      for (float& x : keys) x = normal(rng);
      const std::vector<uint16_t> key_bits = gpu_test::RoundToBf16(&keys);
      std::vector<float> query(static_cast<size_t>(shape.heads * shape.dim));
      for (float& x : query) x = normal(rng) * 3.0f / std::sqrt(static_cast<float>(shape.dim));
      std::vector<int32_t> slots(static_cast<size_t>(bound));
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(pool - 1));
      for (int32_t& slot : slots) slot = pick(rng);
      DeviceBuffer<uint16_t> d_keys(key_bits);
      DeviceBuffer<float> d_query(query);
      DeviceBuffer<int32_t> d_slots(slots);
      DeviceBuffer<int32_t> d_n(std::vector<int32_t>{static_cast<int32_t>(n)});
      SoftVoteBuffers sv(bound, shape.heads, shape.kv_heads, shape.dim, d_query.get(),
                         d_keys.get(), d_slots.get());
      struct Result {
        std::vector<float> logits, max, inv;
      };
      auto run = [&](bool device_length) {
        sv.logits.Poison();
        sv.head_max.Poison();
        sv.inv_sum.Poison();
        KeyScoreParams sp = sv.sp;
        sp.n = device_length ? bound : n;
        if (device_length) sp.device_n.count = d_n.get();
        EXPECT_EQ(ScoreKeys(sp, nullptr), cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        // Token-major copy of the first n tokens (the layout's stride is the bound, sp.n).
        const std::vector<float> raw = sv.logits.Download();
        Result r{std::vector<float>(static_cast<size_t>(n * shape.heads)), sv.head_max.Download(),
                 sv.inv_sum.Download()};
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t h = 0; h < shape.heads; ++h) {
            r.logits[j * shape.heads + h] = raw[LogitIndex(j, h, sp.n, shape.heads)];
          }
        }
        return r;
      };
      const Result first = run(false);
      for (float v : first.logits) ASSERT_FALSE(std::isnan(v)) << "a logit was not written";
      for (int rep = 0; rep < 3; ++rep) {
        const Result again = run(rep == 2);
        ASSERT_EQ(std::memcmp(again.logits.data(), first.logits.data(),
                              first.logits.size() * sizeof(float)),
                  0)
            << "logits differ, run " << rep;
        for (int64_t h = 0; h < shape.heads; ++h) {
          ASSERT_EQ(std::memcmp(&again.max[h], &first.max[h], sizeof(float)), 0) << "max " << h;
          if (rep < 2) {
            ASSERT_EQ(std::memcmp(&again.inv[h], &first.inv[h], sizeof(float)), 0)
                << "inv_sum " << h << ", run " << rep;
          } else {
            ASSERT_NEAR(again.inv[h] / first.inv[h], 1.0, 1e-6)
                << "inv_sum " << h << " (device length)";
          }
        }
      }
      // And right: against double precision over the logits themselves.
      for (int64_t h = 0; h < shape.heads; ++h) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) m = std::max<double>(m, first.logits[j * shape.heads + h]);
        for (int64_t j = 0; j < n; ++j) sum += std::exp(first.logits[j * shape.heads + h] - m);
        EXPECT_EQ(first.max[h], static_cast<float>(m)) << "head " << h;
        EXPECT_NEAR(first.inv[h] * sum, 1.0, 1e-4) << "head " << h;
      }
    }
  }
}

// HeadSoftmaxStats (TP-invariant numerics): against a double-precision reference, and a head's
// statistics from the logits of all heads bit for bit those from a copy holding only half of
// the heads (what a tensor-parallel rank scores), over n below, at and across the kernel's block
// of tokens; with a device length (a bound larger than n) and the skip flag.
TEST(HeadStatsGpuTest, MatchReferenceAndDoNotDependOnTheHeadCount) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t heads : {8, 32}) {
    for (int64_t n : {1, 37, 4096, 4097, 20000}) {
      SCOPED_TRACE(testing::Message() << "heads " << heads << ", n " << n);
      std::vector<float> logits(static_cast<size_t>(n * heads));
      for (float& v : logits) v = normal(rng);
      const int64_t half = heads / 2;
      std::vector<float> upper(static_cast<size_t>(n * half));
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t h = 0; h < half; ++h) upper[j * half + h] = logits[j * heads + half + h];
      }
      // l: token-major rows of hcount logits (bound rows), put in ScoreKeys' layout.
      auto run = [&](const std::vector<float>& l, int64_t hcount, int64_t bound,
                     std::vector<float>* max, std::vector<float>* inv) {
        std::vector<float> laid(l.size());
        for (int64_t j = 0; j < bound; ++j) {
          for (int64_t h = 0; h < hcount; ++h) {
            laid[LogitIndex(j, h, bound, hcount)] = l[j * hcount + h];
          }
        }
        DeviceBuffer<float> d_l(laid), d_max(static_cast<size_t>(hcount)),
            d_inv(static_cast<size_t>(hcount));
        DeviceBuffer<char> ws(HeadSoftmaxStatsWorkspaceBytes(bound, hcount));
        DeviceBuffer<int32_t> d_n(std::vector<int32_t>{static_cast<int32_t>(n)});
        d_max.Poison();
        d_inv.Poison();
        HeadStatsParams p;
        p.head_max = d_max.get();
        p.head_inv_sum = d_inv.get();
        p.logits = d_l.get();
        p.workspace = ws.get();
        p.n = bound;
        if (bound != n) p.device_n.count = d_n.get();
        p.num_heads = hcount;
        ASSERT_EQ(HeadSoftmaxStats(p, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        *max = d_max.Download();
        *inv = d_inv.Download();
      };
      std::vector<float> max, inv, max_half, inv_half, max_bound, inv_bound;
      std::vector<float> padded = logits;
      padded.resize(static_cast<size_t>((n + 5000) * heads), 1e30f);  // past n: never read
      run(logits, heads, n, &max, &inv);
      run(upper, half, n, &max_half, &inv_half);
      run(padded, heads, n + 5000, &max_bound, &inv_bound);
      for (int64_t h = 0; h < heads; ++h) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) m = std::max<double>(m, logits[j * heads + h]);
        for (int64_t j = 0; j < n; ++j) sum += std::exp(logits[j * heads + h] - m);
        EXPECT_EQ(max[h], static_cast<float>(m)) << "head " << h;
        EXPECT_NEAR(inv[h] * sum, 1.0, 1e-5) << "head " << h;
        EXPECT_EQ(max_bound[h], max[h]) << "head " << h;
        EXPECT_EQ(inv_bound[h], inv[h]) << "head " << h;
      }
      for (int64_t h = 0; h < half; ++h) {
        EXPECT_EQ(max_half[h], max[half + h]) << "head " << half + h;
        EXPECT_EQ(inv_half[h], inv[half + h]) << "head " << half + h << " (bits differ)";
      }
    }
  }
  // A set skip flag writes nothing.
  DeviceBuffer<float> d_l(std::vector<float>(64, 1.0f)), d_max(8), d_inv(8);
  DeviceBuffer<char> ws(HeadSoftmaxStatsWorkspaceBytes(8, 8));
  DeviceBuffer<int32_t> skip(std::vector<int32_t>{1});
  d_max.Poison();
  HeadStatsParams p;
  p.head_max = d_max.get();
  p.head_inv_sum = d_inv.get();
  p.logits = d_l.get();
  p.workspace = ws.get();
  p.n = 8;
  p.num_heads = 8;
  p.skip = skip.get();
  ASSERT_EQ(HeadSoftmaxStats(p, nullptr), cudaSuccess);
  for (float v : d_max.Download()) EXPECT_TRUE(std::isnan(v));
}

// Top-k alone on adversarial scores: many exact ties, NaN, +-0, +-inf, negatives.
TEST(TopKGpuTest, MatchesCpuExactlyWithTies) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  const int64_t sizes[] = {1, 7, 1000, 4096 * 3 + 5, (int64_t{1} << 20) + 3, int64_t{4} << 20};
  // One workspace, zeroed once, for every call: each call must leave it ready for the next
  // (the crowded-bin path and the candidate path alike: the ties below crowd the top bins).
  DeviceBuffer<char> ws(TopKWorkspaceBytes(0));
  ws.Zero();
  for (int64_t n : sizes) {
    std::vector<float> scores(static_cast<size_t>(n));
    std::uniform_int_distribution<int> pick(0, 99);
    std::normal_distribution<float> normal(0.0f, 10.0f);
    for (float& s : scores) {
      const int r = pick(rng);
      if (r < 40) s = static_cast<float>(pick(rng) % 50);  // ties
      else if (r < 42) s = NAN;
      else if (r < 44) s = (r == 42) ? 0.0f : -0.0f;
      else if (r < 45) s = (pick(rng) % 2) ? INFINITY : -INFINITY;
      else s = normal(rng);
    }
    DeviceBuffer<float> d_scores(scores);
    const int64_t ks[] = {0, 1, 5, 2048, 16384, n - 1, n, n + 3};
    for (int64_t k : ks) {
      if (k < 0) continue;
      SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k);
      const int64_t kk = std::min(k, n);
      DeviceBuffer<int32_t> out(static_cast<size_t>(std::max<int64_t>(kk, 1)));
      out.Poison();
      TopKParams tp;
      tp.out = out.get();
      tp.scores = d_scores.get();
      tp.workspace = ws.get();
      tp.n = n;
      tp.k = k;
      ASSERT_EQ(TopK(tp, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<int32_t> got = out.Download();
      got.resize(static_cast<size_t>(kk));
      std::vector<int32_t> expected;
      engine::TopKByScore(scores.data(), n, k, &expected);
      ASSERT_EQ(got, expected);
    }
  }
}

// A workspace that is not 16-byte aligned (its histograms are read as vectors) is refused
// before anything is launched.
TEST(TopKGpuTest, RefusesAMisalignedWorkspace) {
  DeviceBuffer<char> ws(TopKWorkspaceBytes(0) + 16);
  ws.Zero();
  DeviceBuffer<float> scores(std::vector<float>(5000, 1.0f));
  DeviceBuffer<int32_t> out(16);
  TopKParams tp;
  tp.out = out.get();
  tp.scores = scores.get();
  tp.n = 5000;
  tp.k = 16;
  tp.workspace = ws.get() + 4;
  EXPECT_EQ(TopK(tp, nullptr), cudaErrorInvalidValue);
  tp.workspace = ws.get();
  EXPECT_EQ(TopK(tp, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// VoteFromLogits with top_k_workspace then TopK with histogram_ready (the engine on one GPU)
// against the two calls without: the same votes and picks, for the vector vote kernel (32, 16
// and 8 heads) and the scalar one (12 heads), soft votes and summed logits, lengths past the
// top-k's register tiles (n > ~1M), a device length under a larger bound (k below, at and over
// the current length), k = 0, crowded bins (ties), and the skip flag (nothing written). After
// every call the vote's histogram (the workspace's first 4096 words: top_k_digit.cuh) is zero
// again, ready for the next vote.
TEST(VoteHistogramGpuTest, TopKFromTheVotesHistogramMatches) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  struct Case {
    int64_t heads, n, k;
    int64_t current;  // > 0: the length on the device (n is then the bound)
    VoteMode mode;
    bool ties;
  };
  const Case cases[] = {
      {32, 70001, 2048, 0, VoteMode::kSoftVote, false},
      {32, 1300007, 2048, 0, VoteMode::kSoftVote, false},  // past the register tiles
      {16, 60013, 4096, 0, VoteMode::kSoftVote, false},
      {8, 33333, 512, 0, VoteMode::kSoftVote, false},
      {12, 25013, 513, 0, VoteMode::kSoftVote, false},      // the scalar vote kernel
      {32, 50021, 777, 0, VoteMode::kSumLogits, false},
      {32, 30011, 2048, 0, VoteMode::kSoftVote, true},       // crowded bins
      {32, 90001, 2048, 61234, VoteMode::kSoftVote, false},  // device length
      {32, 90001, 2048, 1500, VoteMode::kSoftVote, false},   // k over the current length
      {16, 20011, 2048, 2048, VoteMode::kSoftVote, false},   // k at the current length
      {16, 5000, 5000, 0, VoteMode::kSoftVote, false},       // k = n
      {32, 4099, 0, 0, VoteMode::kSoftVote, false},          // k = 0
  };
  constexpr int kHistWords = 4096;
  DeviceBuffer<char> ws(TopKWorkspaceBytes(0));
  ws.Zero();
  auto histogram_clear = [&] {
    const std::vector<char> bytes = ws.Download();
    const std::vector<char> zeros(kHistWords * sizeof(uint32_t), 0);
    return std::memcmp(bytes.data(), zeros.data(), zeros.size()) == 0;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "heads " << c.heads << ", n " << c.n << ", k " << c.k
                                    << ", current " << c.current);
    const int64_t cur = c.current > 0 ? c.current : c.n;
    std::vector<float> logits(static_cast<size_t>(c.n * c.heads));
    for (float& x : logits) x = normal(rng);
    if (c.ties) {  // every token of a band of 64 gets the band's first token's logits
      for (int64_t j = 0; j < c.n; ++j) {
        for (int64_t h = 0; h < c.heads; ++h) {
          logits[LogitIndex(j, h, c.n, c.heads)] =
              logits[LogitIndex(j / 64 * 64, h, c.n, c.heads)];
        }
      }
    }
    std::vector<float> head_max(static_cast<size_t>(c.heads), -INFINITY);
    std::vector<float> inv_sum(static_cast<size_t>(c.heads));
    for (int64_t h = 0; h < c.heads; ++h) {
      double sum = 0.0;
      for (int64_t j = 0; j < cur; ++j) {
        head_max[h] = std::max(head_max[h], logits[LogitIndex(j, h, c.n, c.heads)]);
      }
      for (int64_t j = 0; j < cur; ++j) {
        sum += std::exp(double(logits[LogitIndex(j, h, c.n, c.heads)]) - head_max[h]);
      }
      inv_sum[h] = static_cast<float>(1.0 / sum);
    }
    DeviceBuffer<float> d_logits(logits), d_max(head_max), d_inv(inv_sum);
    DeviceBuffer<float> vote_a(static_cast<size_t>(c.n)), vote_b(static_cast<size_t>(c.n));
    const int64_t kk = std::max<int64_t>(std::min(c.k, c.n), 1);
    DeviceBuffer<int32_t> top_a(static_cast<size_t>(kk)), top_b(static_cast<size_t>(kk));
    DeviceBuffer<int32_t> d_cur(std::vector<int32_t>{static_cast<int32_t>(cur)});
    DeviceBuffer<int32_t> skip_set(std::vector<int32_t>{1}), skip_clear(std::vector<int32_t>{0});
    for (auto* b : {&vote_a, &vote_b}) b->Poison();
    for (auto* b : {&top_a, &top_b}) b->Poison();
    auto run = [&](DeviceBuffer<float>& vote, DeviceBuffer<int32_t>& top, const int32_t* skip,
                   bool histogram) {
      VoteParams vp;
      vp.vote = vote.get();
      vp.logits = d_logits.get();
      vp.head_max = d_max.get();
      vp.head_inv_sum = d_inv.get();
      vp.n = c.n;
      vp.num_heads = c.heads;
      vp.mode = c.mode;
      vp.skip = skip;
      TopKParams tp;
      tp.out = top.get();
      tp.scores = vote.get();
      tp.workspace = ws.get();
      tp.n = c.n;
      tp.k = c.k;
      tp.skip = skip;
      if (c.current > 0) vp.device_n.count = tp.device_n.count = d_cur.get();
      if (histogram) {
        vp.top_k_workspace = ws.get();
        tp.histogram_ready = true;
      }
      EXPECT_EQ(VoteFromLogits(vp, nullptr), cudaSuccess);
      EXPECT_EQ(TopK(tp, nullptr), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    };
    run(vote_a, top_a, nullptr, false);
    // A set skip flag writes nothing; a clear one is no flag.
    run(vote_b, top_b, skip_set.get(), true);
    for (float v : vote_b.Download()) ASSERT_TRUE(std::isnan(v)) << "written under a set skip";
    for (int32_t i : top_b.Download()) ASSERT_EQ(i, -1) << "written under a set skip";
    ASSERT_TRUE(histogram_clear()) << "histogram written under a set skip";
    run(vote_b, top_b, skip_clear.get(), true);
    ASSERT_TRUE(histogram_clear()) << "the histogram was left behind";
    const std::vector<float> a = vote_a.Download(), b = vote_b.Download();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(cur) * sizeof(float)), 0)
        << "votes differ";
    std::vector<int32_t> picks_a = top_a.Download(), picks_b = top_b.Download();
    const size_t picked = static_cast<size_t>(std::min(std::min(c.k, c.n), cur));
    picks_a.resize(picked);
    picks_b.resize(picked);
    ASSERT_EQ(picks_a, picks_b);
    std::vector<int32_t> expected;
    engine::TopKByScore(a.data(), cur, c.k, &expected);
    ASSERT_EQ(picks_b, expected);
  }
}

// The CPU cache's cosine (engine/selection/selection_cache.cc: SelectionQueryCosine).
double CpuCosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    norm_a += static_cast<double>(a[i]) * a[i];
    norm_b += static_cast<double>(b[i]) * b[i];
  }
  if (norm_a == 0.0 || norm_b == 0.0) return 0.0;
  return std::clamp(dot / (std::sqrt(norm_a) * std::sqrt(norm_b)), -1.0, 1.0);
}

// Bytes of a device buffer, for "untouched" checks.
template <typename T>
std::vector<uint8_t> Bytes(const DeviceBuffer<T>& b) {
  std::vector<uint8_t> out(b.size() * sizeof(T));
  if (!out.empty()) {
    EXPECT_EQ(cudaMemcpy(out.data(), b.get(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return out;
}

TEST(SelectionCacheGpuTest, CheckMatchesCpuCacheRule) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t dim : {int64_t{4096}, int64_t{1000}, int64_t{3}}) {
    for (float theta : {0.9f, -1.0f, 1.5f, 0.5f}) {
      SCOPED_TRACE(testing::Message() << "dim=" << dim << " theta=" << theta);
      // A query sequence with near repeats (cosine ~0.995), fresh draws (~0), a scaled copy
      // (1), its negation (-1), a zero vector and a NaN, so that every branch is taken.
      auto fresh = [&] {
        std::vector<float> q(static_cast<size_t>(dim));
        for (float& x : q) x = normal(rng);
        return q;
      };
      std::vector<std::vector<float>> seq;
      seq.push_back(fresh());
      for (int step = 0; step < 3; ++step) {
        std::vector<float> near = seq.back();
        for (float& x : near) x += 0.1f * normal(rng);
        seq.push_back(near);
      }
      seq.push_back(fresh());
      std::vector<float> scaled = seq.back();
      for (float& x : scaled) x *= 2.5f;
      seq.push_back(scaled);
      std::vector<float> negated = scaled;
      for (float& x : negated) x = -x;
      seq.push_back(negated);
      seq.push_back(std::vector<float>(static_cast<size_t>(dim), 0.0f));
      seq.push_back(std::vector<float>(static_cast<size_t>(dim), 0.0f));
      seq.push_back(fresh());
      std::vector<float> with_nan = seq.back();
      with_nan[static_cast<size_t>(dim / 2)] = NAN;
      seq.push_back(with_nan);
      seq.push_back(fresh());

      DeviceBuffer<float> d_cached(static_cast<size_t>(dim)), d_query(static_cast<size_t>(dim));
      DeviceBuffer<int32_t> d_valid(1), d_hit(1);
      d_cached.Poison();  // never read before the first store (valid = 0)
      d_valid.Zero();
      std::vector<float> cpu_cached;
      bool cpu_valid = false;
      int hits = 0;
      for (size_t step = 0; step < seq.size(); ++step) {
        SCOPED_TRACE(testing::Message() << "step " << step);
        const std::vector<float>& q = seq[step];
        // The CPU cache: hit = valid && cosine >= theta (NaN misses); a miss stores q.
        const bool cpu_hit = cpu_valid && CpuCosine(q, cpu_cached) >= static_cast<double>(theta);
        if (!cpu_hit) {
          cpu_cached = q;
          cpu_valid = true;
        }
        hits += cpu_hit ? 1 : 0;
        d_query.Upload(q);
        d_hit.Poison();
        CacheCheckParams cp;
        cp.hit = d_hit.get();
        cp.cached_query = d_cached.get();
        cp.cached_valid = d_valid.get();
        cp.query = d_query.get();
        cp.dim = dim;
        cp.theta = theta;
        ASSERT_EQ(SelectionCacheCheck(cp, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(d_hit.Download()[0], cpu_hit ? 1 : 0);
        ASSERT_EQ(d_valid.Download()[0], 1);
        const std::vector<float> cached = d_cached.Download();
        ASSERT_EQ(0, std::memcmp(cached.data(), cpu_cached.data(), cached.size() * sizeof(float)));
      }
      // theta = -1 hits on every check after the first, except the NaN query and the one after
      // it (the stored entry is then the NaN query); theta > 1 never hits.
      if (theta == -1.0f) {
        EXPECT_EQ(hits, static_cast<int>(seq.size()) - 3);
      }
      if (theta > 1.0f) {
        EXPECT_EQ(hits, 0);
      }
      if (theta == 0.9f && dim >= 1000) {
        EXPECT_GE(hits, 4);  // the near repeats and the scaled copy
      }
    }
  }
  CacheCheckParams bad;
  EXPECT_EQ(SelectionCacheCheck(bad, nullptr), cudaErrorInvalidValue);
}

// PlaceSlice (the cache check's gather under tensor parallelism): every element written, the
// slice bit for bit (NaN and -0 included), zeros around it; bad arguments refused.
TEST(SelectionCacheGpuTest, PlaceSliceWritesTheSliceAmidZeros) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const auto& [dim, offset, len] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {4096, 2048, 2048}, {4096, 0, 2048}, {1000, 333, 1}, {7, 0, 7}, {300001, 150000, 77},
           {5, 5, 0}}) {
    SCOPED_TRACE(testing::Message() << "dim " << dim << " offset " << offset << " len " << len);
    std::vector<float> slice(static_cast<size_t>(std::max<int64_t>(len, 1)));
    for (float& x : slice) x = normal(rng);
    slice[0] = len > 1 ? std::numeric_limits<float>::quiet_NaN() : slice[0];
    if (len > 2) slice[1] = -0.0f;
    DeviceBuffer<float> d_src(slice);
    DeviceBuffer<float> d_dst(static_cast<size_t>(dim));
    d_dst.Poison();
    ASSERT_EQ(PlaceSlice(d_dst.get(), dim, d_src.get(), offset, len, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = d_dst.Download();
    for (int64_t i = 0; i < dim; ++i) {
      const float want = i >= offset && i < offset + len ? slice[i - offset] : 0.0f;
      ASSERT_EQ(0, std::memcmp(&got[i], &want, sizeof(float))) << "element " << i;
    }
  }
  DeviceBuffer<float> d(8);
  EXPECT_EQ(PlaceSlice(d.get(), 8, d.get(), 4, 5, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PlaceSlice(d.get(), 8, d.get(), -1, 2, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PlaceSlice(d.get(), 8, d.get(), 0, -1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PlaceSlice(nullptr, 8, d.get(), 0, 2, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(PlaceSlice(d.get(), 8, nullptr, 0, 2, nullptr), cudaErrorInvalidValue);
}

// Skip flags: set -> nothing written; clear -> bitwise the unflagged results; and the chain
// check -> score -> vote -> top-k keeps the cached top-k on a hit and refreshes it on a miss.
TEST(SelectionCacheGpuTest, SkipFlagsAndCachedChain) {
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 50021, num_heads = 32, num_kv_heads = 8, head_dim = 128, k = 2048;
  const int64_t dim = num_heads * head_dim;
  std::vector<float> keys(static_cast<size_t>(n * num_kv_heads * head_dim));
  for (float& x : keys) x = normal(rng);
  const std::vector<uint16_t> key_bits = gpu_test::RoundToBf16(&keys);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) slots[j] = static_cast<int32_t>(n - 1 - j);
  const float q_std = 3.0f / std::sqrt(static_cast<float>(head_dim));
  auto fresh = [&] {
    std::vector<float> q(static_cast<size_t>(dim));
    for (float& x : q) x = normal(rng) * q_std;
    return q;
  };

  DeviceBuffer<uint16_t> d_keys(key_bits);
  DeviceBuffer<int32_t> d_slots(slots);
  DeviceBuffer<float> d_query(static_cast<size_t>(dim)), d_cached(static_cast<size_t>(dim));
  SoftVoteBuffers sv(n, num_heads, num_kv_heads, head_dim, d_query.get(), d_keys.get(),
                     d_slots.get());
  DeviceBuffer<float>& d_logits = sv.logits;
  DeviceBuffer<float>& d_max = sv.head_max;
  DeviceBuffer<float>& d_inv = sv.inv_sum;
  DeviceBuffer<float>& d_vote = sv.vote;
  DeviceBuffer<char>& d_score_ws = sv.score_ws;
  DeviceBuffer<char> d_topk_ws(TopKWorkspaceBytes(n));
  DeviceBuffer<int32_t> d_topk(static_cast<size_t>(k)), d_ref_topk(static_cast<size_t>(k));
  DeviceBuffer<int32_t> d_valid(1), d_hit(1), d_flag(1);
  d_valid.Zero();
  d_topk_ws.Zero();

  const KeyScoreParams& sp = sv.sp;
  const VoteParams& vp = sv.vp;
  TopKParams tp;
  tp.scores = d_vote.get();
  tp.workspace = d_topk_ws.get();
  tp.n = n;
  tp.k = k;
  auto chain = [&](const int32_t* skip, int32_t* out) {
    KeyScoreParams s = sp;
    VoteParams v = vp;
    TopKParams t = tp;
    s.skip = v.skip = t.skip = skip;
    t.out = out;
    ASSERT_EQ(ScoreKeys(s, nullptr), cudaSuccess);
    ASSERT_EQ(VoteFromLogits(v, nullptr), cudaSuccess);
    ASSERT_EQ(TopK(t, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };

  // Unflagged reference, then the flag clear: bitwise equal outputs.
  d_query.Upload(fresh());
  chain(nullptr, d_ref_topk.get());
  const std::vector<uint8_t> ref_logits = Bytes(d_logits), ref_vote = Bytes(d_vote);
  const std::vector<uint8_t> ref_max = Bytes(d_max), ref_inv = Bytes(d_inv);
  d_flag.Zero();
  for (auto* b : {&d_logits, &d_max, &d_inv, &d_vote}) b->Poison();
  d_topk.Poison();
  chain(d_flag.get(), d_topk.get());
  EXPECT_EQ(Bytes(d_logits), ref_logits);
  EXPECT_EQ(Bytes(d_vote), ref_vote);
  EXPECT_EQ(Bytes(d_max), ref_max);
  EXPECT_EQ(Bytes(d_inv), ref_inv);
  EXPECT_EQ(d_topk.Download(), d_ref_topk.Download());

  // Flag set (any non-zero value): not one byte of any output or workspace changes.
  const std::vector<int32_t> set = {7};
  d_flag.Upload(set);
  for (auto* b : {&d_logits, &d_max, &d_inv, &d_vote}) b->Poison();
  d_topk.Poison();
  d_topk_ws.Poison();
  const std::vector<uint8_t> score_ws_before = Bytes(d_score_ws);
  d_query.Upload(fresh());
  chain(d_flag.get(), d_topk.get());
  for (const auto* b : {&d_logits, &d_max, &d_inv, &d_vote}) {
    for (uint8_t byte : Bytes(*b)) ASSERT_EQ(byte, 0xff);
  }
  for (uint8_t byte : Bytes(d_topk)) ASSERT_EQ(byte, 0xff);
  for (uint8_t byte : Bytes(d_topk_ws)) ASSERT_EQ(byte, 0xff);
  EXPECT_EQ(Bytes(d_score_ws), score_ws_before);
  d_topk_ws.Zero();  // back to the state TopK needs

  // The cached chain: check writes `hit`, the rest skips on it. Queries: q0 (miss: computed),
  // q0 + noise (hit: the top-k output keeps q0's picks), q2 fresh (miss: q2's picks).
  CacheCheckParams cp;
  cp.hit = d_hit.get();
  cp.cached_query = d_cached.get();
  cp.cached_valid = d_valid.get();
  cp.query = d_query.get();
  cp.dim = dim;
  cp.theta = 0.9f;
  const std::vector<float> q0 = fresh();
  std::vector<float> q1 = q0;
  for (float& x : q1) x += 0.05f * q_std * normal(rng);
  const std::vector<float> q2 = fresh();
  std::vector<int32_t> picks_q0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const std::vector<float>& q = step == 0 ? q0 : step == 1 ? q1 : q2;
    d_query.Upload(q);
    ASSERT_EQ(SelectionCacheCheck(cp, nullptr), cudaSuccess);
    chain(d_hit.get(), d_topk.get());
    const int32_t hit = d_hit.Download()[0];
    EXPECT_EQ(hit, step == 1 ? 1 : 0);
    const std::vector<int32_t> got = d_topk.Download();
    if (step == 1) {
      EXPECT_EQ(got, picks_q0);  // survived the skipped chain
      continue;
    }
    chain(nullptr, d_ref_topk.get());  // the unflagged selection for q
    EXPECT_EQ(got, d_ref_topk.Download());
    if (step == 0) picks_q0 = got;
  }
  EXPECT_NE(d_topk.Download(), picks_q0);  // q2 picked its own tokens
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
