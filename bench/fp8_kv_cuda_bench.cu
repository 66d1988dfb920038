// bench_fp8_kv_cuda: the cache-reading kernels with a bf16 against an FP8 KV cache
// (docs/fp8_kv.md), Llama-3-8B attention shape (H = 32, H_kv = 8, d = 128), one request, one
// layer, paged slots:
//   decode attention (tensor-core split kernel, PlanDecodeSplits) over the whole cache
//   ScoreKeys (the soft vote's key pass) over the whole cache
//   prefill attention of a 512-token chunk over the cache (dense)
//   TokenSelect's selection (top 2048) by the two chains the engine picks between on one GPU
//   (engine/selection/cuda_selection.h): the plain one (ScoreKeys, VoteFromLogits, TopK) and the
//   bound-vote one (BoundVoteSelect, from kBoundVoteMinCandidates), a random query (N(0, 9 / d),
//   as bench_kernels_cuda's); the bound chain's candidates and its picks against the plain
//   chain's (any difference must be a near-tie: within 1e-5 of the k-th vote)
// Napkin math printed with each time: the cache bytes read (K + V for attention, K for the
// scores: 2 KiB / 1 KiB per token per K or V row in bf16 / FP8) over the time, against a
// measured device-to-device copy (read + write).
//
//   bench_fp8_kv_cuda [--tokens 131072,1048576] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/cuda_bench_util.h"
#include "common/flags.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/selection.h"
#include "kernels/ops.h"

ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"131072", "1048576"}),
          "cache lengths to measure");
ABSL_FLAG(int32_t, reps, 20, "timed repetitions per measurement");

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;
constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128, kRow = kKvHeads * kDim;

void Run(int64_t n, int reps, int num_sms, cudaStream_t stream) {
  std::mt19937 rng(1);
  const std::vector<int32_t> slots = bench::PagedSlots(n, 0, &rng);
  DeviceBuffer<int32_t> d_slots(slots);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
  DeviceBuffer<int32_t> d_pos(pos);
  DeviceBuffer<uint16_t> k16(static_cast<size_t>(n * kRow)), v16(k16.size());
  bench::FillRandomBf16(k16.get(), static_cast<int64_t>(k16.size()), 1u, stream);
  bench::FillRandomBf16(v16.get(), static_cast<int64_t>(v16.size()), 2u, stream);
  DeviceBuffer<uint8_t> k8(k16.size()), v8(k16.size());
  bench::FillRandomFp8(k8.get(), static_cast<int64_t>(k8.size()), 3u, stream);
  bench::FillRandomFp8(v8.get(), static_cast<int64_t>(v8.size()), 4u, stream);
  DeviceBuffer<float> scales(std::vector<float>(kKvHeads, 0.0625f));
  RopeParams rope;
  rope.head_dim = kDim;
  DeviceBuffer<float> inv_freq(RopeInverseFrequencies(rope));
  const bench::TimingOptions timing{reps, 3};
  const double copy_ms = bench::CopyMs(stream, static_cast<size_t>(n * kRow * 2), timing);
  const double copy_gbs = bench::CopyGBs(static_cast<size_t>(n * kRow * 2), copy_ms);
  std::printf("\n%lld tokens (device copy of one bf16 K: %.3f ms, %.0f GB/s read + write)\n",
              static_cast<long long>(n), copy_ms, copy_gbs);

  // Decode attention, batch 1, the whole cache.
  DeviceBuffer<uint16_t> q(static_cast<size_t>(kHeads * kDim)), out(q.size());
  bench::FillRandomBf16(q.get(), static_cast<int64_t>(q.size()), 5u, stream);
  DeviceBuffer<int32_t> indptr(std::vector<int32_t>{0, static_cast<int32_t>(n)});
  DeviceBuffer<int32_t> q_pos(std::vector<int32_t>{static_cast<int32_t>(n)});
  const int splits = PlanDecodeSplits(1, kKvHeads, n, num_sms);
  DeviceBuffer<char> ws(DecodeAttentionWorkspaceBytes(1, kHeads, kDim, splits));
  double decode_ms[2] = {0, 0}, score_ms[2] = {0, 0}, prefill_ms[2] = {0, 0};
  double plain_ms[2] = {0, 0}, bound_ms[2] = {0, 0};
  std::vector<float> select_query(static_cast<size_t>(kHeads * kDim));
  std::normal_distribution<float> normal(0.0f, 3.0f / std::sqrt(float(kDim)));
  for (float& x : select_query) x = normal(rng);
  DeviceBuffer<float> d_select_query(select_query);
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    DecodeAttentionParams p;
    p.out = reinterpret_cast<__nv_bfloat16*>(out.get());
    p.q = reinterpret_cast<const __nv_bfloat16*>(q.get());
    p.q_positions = q_pos.get();
    p.k_cache = fp8 ? static_cast<const void*>(k8.get()) : k16.get();
    p.v_cache = fp8 ? static_cast<const void*>(v8.get()) : v16.get();
    p.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
    p.k_scale = scales.get();
    p.v_scale = scales.get();
    p.indptr = indptr.get();
    p.indices = d_slots.get();
    p.kv_positions = d_pos.get();
    p.inv_freq = inv_freq.get();
    p.workspace = ws.get();
    p.batch = 1;
    p.num_heads = kHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kDim;
    p.num_splits = splits;
    p.scale = 1.0f / std::sqrt(128.0f);
    decode_ms[fp8] = bench::MedianMs(
        stream, [&](int) { TS_CUDA_CHECK(DecodeAttention(p, stream)); }, timing);

    bench::ExactSelection sel(n, 2048, kHeads, kKvHeads, kDim);
    DeviceBuffer<float> query(static_cast<size_t>(kHeads * kDim));
    query.Zero();
    sel.score.query = query.get();
    sel.score.k_cache = p.k_cache;
    sel.score.kv_type = p.kv_type;
    sel.score.k_scale = scales.get();
    sel.score.slots = d_slots.get();
    score_ms[fp8] = bench::MedianMs(
        stream, [&](int) { TS_CUDA_CHECK(ScoreKeys(sel.score, stream)); }, timing);

    // The two selection chains: check, then time.
    sel.score.query = d_select_query.get();
    bench::BoundSelection bound(sel, 2048);
    TS_CUDA_CHECK(sel.Run(stream));
    TS_CUDA_CHECK(bound.Run(stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    const bench::PickComparison picks =
        bench::ComparePicks(sel.top.Download(), bound.top.Download(), sel.vote.Download());
    const int32_t candidates = gpu_test::DownloadFrom(bound.view.count, 1)[0];
    std::printf("  %s  check bound select: %d candidates, picks: %zu differ from the plain "
                "chain's, %d beyond a near-tie -> %s\n",
                fp8 ? "fp8 " : "bf16", candidates, picks.differ, picks.beyond_near_tie,
                picks.ok ? "OK" : "FAILED");
    if (!picks.ok) std::exit(1);
    plain_ms[fp8] = bench::MedianMs(stream, [&](int) { TS_CUDA_CHECK(sel.Run(stream)); }, timing);
    bound_ms[fp8] =
        bench::MedianMs(stream, [&](int) { TS_CUDA_CHECK(bound.Run(stream)); }, timing);

    // A 512-token chunk attending the whole cache (its own rows are the last 512 entries).
    constexpr int64_t kChunk = 512;
    DeviceBuffer<uint16_t> pq(static_cast<size_t>(kChunk * kHeads * kDim)),
        pout(pq.size());
    bench::FillRandomBf16(pq.get(), static_cast<int64_t>(pq.size()), 6u, stream);
    std::vector<int32_t> vis(kChunk), qpos(kChunk);
    for (int64_t i = 0; i < kChunk; ++i) {
      vis[i] = static_cast<int32_t>(n - kChunk + i + 1);
      qpos[i] = static_cast<int32_t>(n - kChunk + i);
    }
    DeviceBuffer<int32_t> d_vis(vis), d_qpos(qpos),
        q_indptr(std::vector<int32_t>{0, static_cast<int32_t>(kChunk)});
    PrefillAttentionParams pp;
    pp.out = reinterpret_cast<__nv_bfloat16*>(pout.get());
    pp.q = reinterpret_cast<const __nv_bfloat16*>(pq.get());
    pp.q_row_stride = kHeads * kDim;
    pp.q_positions = d_qpos.get();
    pp.q_indptr = q_indptr.get();
    pp.visible = d_vis.get();
    pp.k_cache = p.k_cache;
    pp.v_cache = p.v_cache;
    pp.kv_type = p.kv_type;
    pp.k_scale = scales.get();
    pp.v_scale = scales.get();
    pp.kv_indptr = indptr.get();
    pp.kv_indices = d_slots.get();
    pp.kv_positions = d_pos.get();
    pp.inv_freq = inv_freq.get();
    pp.batch = 1;
    pp.total_q = kChunk;
    pp.num_heads = kHeads;
    pp.num_kv_heads = kKvHeads;
    pp.head_dim = kDim;
    pp.max_q_len = kChunk;
    pp.max_kv_len = n;
    pp.scale = p.scale;
    pp.num_splits = PlanPrefillSplits(1, kHeads, kKvHeads, kChunk, n, num_sms);
    DeviceBuffer<char> pws(std::max<size_t>(1, PrefillAttentionWorkspaceBytes(pp)));
    pp.workspace = pws.get();
    prefill_ms[fp8] = bench::MedianMs(
        stream, [&](int) { TS_CUDA_CHECK(PrefillAttention(pp, stream)); }, {std::max(3, reps / 4), 1});
  }
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    const double elem = fp8 ? 1.0 : 2.0;
    const double kv_bytes = 2.0 * n * kRow * elem, k_bytes = n * kRow * elem;
    const double flops = 4.0 * 512 * n * kHeads * kDim;
    std::printf("  %s  decode attention %.3f ms (%.0f GB/s of K+V, %d splits) | ScoreKeys %.3f ms "
                "(%.0f GB/s of K) | prefill chunk 512 %.2f ms (%.0f TFLOP/s)\n",
                fp8 ? "fp8 " : "bf16", decode_ms[fp8], kv_bytes / decode_ms[fp8] / 1e6, splits,
                score_ms[fp8], k_bytes / score_ms[fp8] / 1e6, prefill_ms[fp8],
                flops / prefill_ms[fp8] / 1e9);
  }
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    std::printf("  %s  selection top-2048: plain chain %.4f ms, bound-vote chain %.4f ms "
                "(%.2fx; the engine's from %lldK)\n",
                fp8 ? "fp8 " : "bf16", plain_ms[fp8], bound_ms[fp8], plain_ms[fp8] / bound_ms[fp8],
                static_cast<long long>(kBoundVoteMinCandidates >> 10));
  }
  std::printf("  fp8 / bf16 time: decode %.2f, scores %.2f, prefill %.2f, selection %.2f "
              "(plain) / %.2f (bound)\n",
              decode_ms[1] / decode_ms[0], score_ms[1] / score_ms[0],
              prefill_ms[1] / prefill_ms[0], plain_ms[1] / plain_ms[0],
              bound_ms[1] / bound_ms[0]);
}

int Main(int argc, char** argv) {
  auto positional = common::ParseFlags(argc, argv, "bench_fp8_kv_cuda: bf16 vs FP8 KV kernels");
  if (!positional.ok()) {
    std::fprintf(stderr, "%s\n", positional.status().ToString().c_str());
    return 2;
  }
  int device = 0, num_sms = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, %d SMs; Llama-3-8B attention shape (H 32, H_kv 8, d 128), paged slots\n",
              prop.name, num_sms);
  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
    Run(std::stoll(t), absl::GetFlag(FLAGS_reps), num_sms, stream);
  }
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) { return tokenselect::kernels::cuda::Main(argc, argv); }
