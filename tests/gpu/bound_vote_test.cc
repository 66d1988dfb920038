// Needs a GPU (label gpu): BoundVoteSelect (kernels/cuda/selection.h) against the plain chain
// ScoreKeys -> VoteFromLogits -> TopK on the same inputs (that chain is checked against the CPU
// oracle in selection_test.cc). Fresh random inputs; kv heads 1, 2, 4, 8 (groups of 4,
// head_dim 128), bf16 and FP8 keys; lengths below k, around the screen's blocks and with
// repeated slots; flat, peaked and very peaked heads (the provisional constants then miss by
// large factors and the candidate list grows); a few tokens whose logit lies ~200 above the rest
// (terms past the fp32 range); a device length under a larger bound; the skip flag. Outputs are
// poisoned first.
//
// What must hold:
//   - the statistics are ScoreKeys' (bf16: the same bits; FP8: the sums within 1e-6);
//   - the picks are min(k, n) ascending indices, the same on a repeated call (with a device
//     length, that call replayed from a captured CUDA graph);
//   - against the plain chain's picks, any difference is a near-tie: a pick the plain chain did
//     not make has a plain vote >= t (1 - 1e-5), one it made and the bound chain did not has a
//     plain vote <= t (1 + 1e-5), t the plain chain's k-th vote (the candidates' logits are
//     fp32 dots, not the tensor-core kernel's bits: ~1e-6 apart);
//   - the candidate list (the workspace's count, and with list_candidates on the first call its
//     cand_index / cand_vote) holds at least min(k, n) tokens, ascending, each with its plain
//     vote within 1e-4 (FP8: 1e-3; the plain logits are the tensor cores' over a rounded query,
//     1.6e-5 and 9.6e-5 apart at most in the thirtieth session's run; times std / 10 for
//     logits of std above 10, whose rounding is larger), and leaves out no token
//     whose plain vote is above t (1 + 1e-5).
// The cases reach the screen's ways to T (bound_vote.cu): the chosen bin's edge (most), the
// bin's keys listed (flat logits, n 6000) and the crowded bin's grid-wide passes (flat logits,
// n 40000); more candidates than the picker keeps in shared memory (the spikes, the flat ones).
// And the picker's ways (the last block to arrive; PickFromList): the chosen bin's keys ranked
// (most), or TopK's radix passes over the whole list when that bin is crowded (the flat logits,
// and logit std 100 with k near n, where most votes are below 2^-123: the clamped bottom bin).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/selection.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct BoundCase {
  int64_t num_kv_heads;
  bool fp8;
  int64_t n;
  int64_t k;
  float logit_std;     // of the logits (query scale)
  int64_t slot_pool;   // 0: n distinct rows; else slots drawn with repeats from this many
  int64_t device_cut;  // > 0: the current length is n - device_cut under the bound n
  // > 0 (bf16 only): this many tokens get a head-0 logit of ~200, far above what the sampled
  // tiles see: their terms exp(l - C_0) overflow fp32 (the screen's trivial bounds).
  int spikes = 0;
};

class BoundVoteGpuTest : public ::testing::TestWithParam<BoundCase> {};

TEST_P(BoundVoteGpuTest, PicksTheSoftVotesTopK) {
  const BoundCase c = GetParam();
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t heads = 4 * c.num_kv_heads, dim = 128;
  const int64_t num_slots = c.slot_pool > 0 ? c.slot_pool : c.n + 777;
  const int64_t row = c.num_kv_heads * dim;
  // FP8 keys here have a std of ~100 x their scale; bf16 ones of 1.
  const float key_std = c.fp8 ? 0.5f : 1.0f;
  std::vector<float> query(static_cast<size_t>(heads * dim));
  const float q_std = c.logit_std / (key_std * std::sqrt(static_cast<float>(dim)));
  for (float& x : query) x = normal(rng) * q_std;
  std::vector<int32_t> slots(static_cast<size_t>(c.n));
  if (c.slot_pool > 0) {
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(num_slots - 1));
    for (int32_t& s : slots) s = pick(rng);
  } else {
    std::vector<int32_t> perm(static_cast<size_t>(num_slots));
    for (int64_t i = 0; i < num_slots; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + c.n, slots.begin());
  }
  // Keys: bf16 from N(0, 1), or e4m3 bytes (no NaN codes) with per-head scales.
  DeviceBuffer<uint16_t> keys_bf16;
  DeviceBuffer<uint8_t> keys_fp8;
  DeviceBuffer<float> k_scale;
  if (c.fp8) {
    std::vector<uint8_t> bytes(static_cast<size_t>(num_slots * row));
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : bytes) {
      do {
        b = static_cast<uint8_t>(byte(rng));
      } while ((b & 0x7f) == 0x7f);
    }
    keys_fp8 = DeviceBuffer<uint8_t>(bytes);
    std::vector<float> scales(static_cast<size_t>(c.num_kv_heads));
    std::uniform_real_distribution<float> scale(0.002f, 0.01f);
    for (float& s : scales) s = scale(rng);
    k_scale = DeviceBuffer<float>(scales);
  } else {
    std::vector<float> keys(static_cast<size_t>(num_slots * row));
    for (float& x : keys) x = normal(rng);
    double q0_norm2 = 0.0;
    for (int64_t d = 0; d < dim; ++d) q0_norm2 += double(query[d]) * query[d];
    for (int s = 0; s < c.spikes; ++s) {  // key of kv head 0 = 200 q_0 / |q_0|^2
      const int64_t slot = slots[static_cast<size_t>((c.n / 3 + 1013 * s) % c.n)];
      for (int64_t d = 0; d < dim; ++d) {
        keys[static_cast<size_t>(slot * row + d)] =
            static_cast<float>(200.0 * query[d] / q0_norm2);
      }
    }
    keys_bf16 = DeviceBuffer<uint16_t>(gpu_test::ToBf16Bits(keys));
  }
  DeviceBuffer<float> d_query(query);
  DeviceBuffer<int32_t> d_slots(slots);
  const int64_t current = c.n - c.device_cut;
  DeviceBuffer<int32_t> d_count(std::vector<int32_t>{static_cast<int32_t>(current)});
  const DeviceLength device_n{c.device_cut > 0 ? d_count.get() : nullptr, 0};
  const void* k_cache = c.fp8 ? static_cast<const void*>(keys_fp8.get()) : keys_bf16.get();
  const KvCacheType kv_type = c.fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;

  // The plain chain.
  DeviceBuffer<float> logits(static_cast<size_t>(c.n * heads)), head_max(heads), inv_sum(heads),
      vote(static_cast<size_t>(c.n));
  DeviceBuffer<char> score_ws(ScoreKeysWorkspaceBytes(heads)), topk_ws(TopKWorkspaceBytes(c.n));
  score_ws.Zero();
  topk_ws.Zero();
  const int64_t picks = std::min(c.k, current);
  DeviceBuffer<int32_t> plain(static_cast<size_t>(picks));
  KeyScoreParams sp;
  sp.logits = logits.get();
  sp.head_max = head_max.get();
  sp.head_inv_sum = inv_sum.get();
  sp.query = d_query.get();
  sp.k_cache = k_cache;
  sp.kv_type = kv_type;
  sp.k_scale = k_scale.get();
  sp.slots = d_slots.get();
  sp.workspace = score_ws.get();
  sp.n = c.n;
  sp.device_n = device_n;
  sp.num_heads = heads;
  sp.num_kv_heads = c.num_kv_heads;
  sp.head_dim = dim;
  ASSERT_EQ(ScoreKeys(sp, nullptr), cudaSuccess);
  VoteParams vp;
  vp.vote = vote.get();
  vp.logits = logits.get();
  vp.head_max = head_max.get();
  vp.head_inv_sum = inv_sum.get();
  vp.n = c.n;
  vp.device_n = device_n;
  vp.num_heads = heads;
  ASSERT_EQ(VoteFromLogits(vp, nullptr), cudaSuccess);
  TopKParams tp;
  tp.out = plain.get();
  tp.scores = vote.get();
  tp.workspace = topk_ws.get();
  tp.n = c.n;
  tp.device_n = device_n;
  tp.k = c.k;
  ASSERT_EQ(TopK(tp, nullptr), cudaSuccess);

  // The bound-vote selection, twice.
  ASSERT_TRUE(BoundVoteSupported(heads, c.num_kv_heads, dim));
  DeviceBuffer<char> ws(BoundVoteWorkspaceBytes(c.n, heads));
  ws.Zero();
  DeviceBuffer<float> b_max(heads), b_inv(heads);
  DeviceBuffer<int32_t> got(static_cast<size_t>(picks));
  BoundVoteParams bp;
  bp.score = sp;  // the plain chain's inputs, its own statistics
  bp.score.head_max = b_max.get();
  bp.score.head_inv_sum = b_inv.get();
  bp.out = got.get();
  bp.k = c.k;
  bp.workspace = ws.get();
  // With a device length the second call is replayed from a captured CUDA graph (as the
  // engine's decode steps run it): cooperative launches with programmatic edges.
  std::vector<int32_t> first, cand_index;
  std::vector<float> cand_vote;
  for (int call = 0; call < 2; ++call) {
    got.Poison();
    b_max.Poison();
    b_inv.Poison();
    bp.list_candidates = call == 0;
    if (call == 1 && c.device_cut > 0) {
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      ASSERT_EQ(BoundVoteSelect(bp, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
      EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    } else {
      ASSERT_EQ(BoundVoteSelect(bp, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (call == 0) {
      first = got.Download();
      const BoundVoteWorkspace listed = CarveBoundVoteWorkspace(ws.get(), c.n, heads);
      const int32_t count = gpu_test::DownloadFrom(listed.count, 1)[0];
      ASSERT_GT(count, 0);
      cand_index = gpu_test::DownloadFrom(listed.cand_index, count);
      cand_vote = gpu_test::DownloadFrom(listed.cand_vote, count);
    }
  }
  const std::vector<int32_t> bound = got.Download(), want = plain.Download();
  EXPECT_EQ(bound, first) << "a repeated call picked differently";
  // bf16: the bound kernel runs the plain one's grid, so its statistics have the same bits. FP8:
  // its window of terms leaves fewer blocks per SM than the plain FP8 kernel (registers and no
  // ring), so the grid and the sums' order differ: the maxima are equal, the sums within 1e-6.
  EXPECT_EQ(b_max.Download(), head_max.Download());
  if (c.fp8) {
    const std::vector<float> a = b_inv.Download(), b = inv_sum.Download();
    for (size_t h = 0; h < a.size(); ++h) EXPECT_NEAR(a[h], b[h], 1e-6 * b[h]) << "head " << h;
  } else {
    EXPECT_EQ(b_inv.Download(), inv_sum.Download());
  }
  const BoundVoteWorkspace view = CarveBoundVoteWorkspace(ws.get(), c.n, heads);
  const int32_t candidates = gpu_test::DownloadFrom(view.count, 1)[0];
  EXPECT_GE(candidates, picks);
  EXPECT_LE(candidates, current);
  ASSERT_EQ(static_cast<int64_t>(bound.size()), picks);
  EXPECT_TRUE(std::is_sorted(bound.begin(), bound.end()) &&
              std::adjacent_find(bound.begin(), bound.end()) == bound.end());
  for (int32_t i : bound) ASSERT_TRUE(i >= 0 && i < current) << i;
  const std::vector<float> votes = vote.Download();
  double t = 1e300;
  for (int32_t i : want) t = std::min(t, static_cast<double>(votes[i]));
  std::vector<int32_t> extra, missing;
  std::set_difference(bound.begin(), bound.end(), want.begin(), want.end(),
                      std::back_inserter(extra));
  std::set_difference(want.begin(), want.end(), bound.begin(), bound.end(),
                      std::back_inserter(missing));
  for (int32_t i : extra) EXPECT_GE(votes[i], t * (1 - 1e-5)) << "picked " << i;
  for (int32_t i : missing) EXPECT_LE(votes[i], t * (1 + 1e-5)) << "left out " << i;
  // The listed candidates (first call): ascending, their votes the plain ones, every pick and
  // every token above the k-th vote among them.
  ASSERT_EQ(static_cast<int64_t>(cand_index.size()), candidates);
  EXPECT_TRUE(std::is_sorted(cand_index.begin(), cand_index.end()) &&
              std::adjacent_find(cand_index.begin(), cand_index.end()) == cand_index.end());
  // A logit's rounding grows with its size: std 100 gets 10 times the 1e-4 (measured 1.2e-4
  // there, thirty-first session); 1e-37 covers denormal votes.
  const double vote_tolerance = (c.fp8 ? 1e-3 : 1e-4) * std::max(1.0, c.logit_std / 10.0);
  std::vector<bool> listed(static_cast<size_t>(current), false);
  for (size_t j = 0; j < cand_index.size(); ++j) {
    const int32_t i = cand_index[j];
    ASSERT_TRUE(i >= 0 && i < current) << i;
    listed[static_cast<size_t>(i)] = true;
    EXPECT_NEAR(cand_vote[j], votes[i], vote_tolerance * votes[i] + 1e-37) << "candidate " << i;
  }
  for (int32_t i : bound) EXPECT_TRUE(listed[static_cast<size_t>(i)]) << "pick " << i;
  for (int64_t i = 0; i < current; ++i) {
    if (!listed[static_cast<size_t>(i)]) {
      EXPECT_LE(votes[static_cast<size_t>(i)], t * (1 + 1e-5)) << "not listed " << i;
    }
  }
  std::printf("kv %lld %s n %lld (current %lld) k %lld std %.1f: %d candidates, %zu swaps\n",
              static_cast<long long>(c.num_kv_heads), c.fp8 ? "fp8" : "bf16",
              static_cast<long long>(c.n), static_cast<long long>(current),
              static_cast<long long>(c.k), c.logit_std, candidates, extra.size());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BoundVoteGpuTest,
    ::testing::Values(BoundCase{8, false, 40000, 2048, 3.0f, 0, 0},
                      BoundCase{8, false, 40000, 2048, 0.3f, 0, 0},
                      BoundCase{8, false, 40000, 2048, 10.0f, 0, 0},
                      BoundCase{8, false, 6000, 2048, 0.05f, 0, 0},
                      BoundCase{8, false, 40000, 2048, 0.05f, 0, 0},
                      BoundCase{4, false, 9001, 300, 3.0f, 0, 0},
                      BoundCase{2, false, 5003, 64, 3.0f, 0, 0},
                      BoundCase{1, false, 3001, 1024, 3.0f, 0, 0},
                      BoundCase{8, false, 700, 1024, 3.0f, 0, 0},
                      BoundCase{8, false, 300007, 2048, 3.0f, 50000, 0},
                      BoundCase{8, false, 40000, 2048, 3.0f, 0, 7777},
                      BoundCase{8, false, 2100, 2048, 3.0f, 0, 1000},
                      BoundCase{8, false, 40000, 2048, 3.0f, 0, 0, 5},
                      BoundCase{8, false, 40000, 64, 3.0f, 0, 0, 300},
                      BoundCase{8, true, 40000, 2048, 3.0f, 0, 0},
                      BoundCase{2, true, 9001, 512, 3.0f, 0, 0},
                      BoundCase{8, false, 3001, 2900, 100.0f, 0, 0}));

// A set skip flag (a selection-cache hit) leaves the picks and the statistics untouched.
TEST(BoundVoteGpuTest, SkipFlagWritesNothing) {
  const int64_t n = 5000, heads = 32, kv = 8, dim = 128, k = 256;
  std::vector<float> keys(static_cast<size_t>(n * kv * dim), 0.5f), query(heads * dim, 0.1f);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[i] = static_cast<int32_t>(i);
  DeviceBuffer<uint16_t> d_keys(gpu_test::ToBf16Bits(keys));
  DeviceBuffer<float> d_query(query), b_max(heads), b_inv(heads);
  DeviceBuffer<int32_t> d_slots(slots), out(k), skip(std::vector<int32_t>{1});
  DeviceBuffer<char> ws(BoundVoteWorkspaceBytes(n, heads));
  ws.Zero();
  out.Poison();
  b_max.Poison();
  b_inv.Poison();
  BoundVoteParams bp;
  bp.score.head_max = b_max.get();
  bp.score.head_inv_sum = b_inv.get();
  bp.score.query = d_query.get();
  bp.score.k_cache = d_keys.get();
  bp.score.slots = d_slots.get();
  bp.score.n = n;
  bp.score.num_heads = heads;
  bp.score.num_kv_heads = kv;
  bp.score.head_dim = dim;
  bp.score.skip = skip.get();
  bp.out = out.get();
  bp.k = k;
  bp.workspace = ws.get();
  ASSERT_EQ(BoundVoteSelect(bp, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t i : out.Download()) EXPECT_EQ(i, -1);
  for (float x : b_max.Download()) EXPECT_TRUE(std::isnan(x));
  // Unsupported shapes are refused before anything is launched.
  bp.score.skip = nullptr;
  bp.score.head_dim = 64;
  EXPECT_EQ(BoundVoteSelect(bp, nullptr), cudaErrorInvalidValue);
  bp.score.head_dim = dim;
  bp.score.num_heads = 16;  // groups of 2
  EXPECT_EQ(BoundVoteSelect(bp, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
