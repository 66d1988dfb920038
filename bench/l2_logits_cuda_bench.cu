// bench_l2_logits_cuda: does keeping the soft vote's logits in L2 pay? The exact selection writes
// logits [N, heads] fp32 in ScoreKeys and reads them back in VoteFromLogits: at 1M tokens and 16
// heads (TP = 2) that is 64 MiB each way per layer next to 512 MiB of FP8 keys. Here the same
// selection (score + vote + top-2048, paged slots) three ways, same binary, same buffers: no L2
// set-aside for persisting lines (what the engine runs), the set-aside at the device's maximum
// (cudaLimitPersistingL2CacheSize) without a window, and the set-aside with an access-policy
// window marking the logits persisting (hit ratio = set-aside / window).
//
// Answer on an H200 (60 MiB L2, 37.5 MiB set-aside at most; ninth session, docs/performance.md):
// no. At 1M tokens, 16 heads, FP8 keys: 0.208 ms without a set-aside, 0.306 ms with it and no
// window, 0.246 ms with the window - the set-aside alone slows the key stream more than pinning
// the logits wins back. The engine sets no set-aside.
//
//   bench_l2_logits_cuda [--tokens 1048576] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/cuda_bench_util.h"
#include "common/flags.h"
#include "kernels/cuda/selection.h"

ABSL_FLAG(std::vector<std::string>, tokens, {"1048576"}, "context lengths");
ABSL_FLAG(int32_t, reps, 20, "timed repetitions per measurement");

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;
constexpr int64_t kDim = 128;

void SetWindow(cudaStream_t stream, void* base, size_t bytes, size_t persist,
               size_t max_window) {
  cudaStreamAttrValue attr = {};
  if (persist > 0) {
    const size_t window = std::min(bytes, max_window);
    attr.accessPolicyWindow.base_ptr = base;
    attr.accessPolicyWindow.num_bytes = window;
    attr.accessPolicyWindow.hitRatio =
        static_cast<float>(std::min(1.0, static_cast<double>(persist) / window));
    attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  }
  TS_CUDA_CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &attr));
  if (persist == 0) TS_CUDA_CHECK(cudaCtxResetPersistingL2Cache());
}

void Run(int64_t n, int64_t heads, int64_t kv_heads, bool fp8, int reps,
         const cudaDeviceProp& prop, cudaStream_t stream) {
  std::mt19937 rng(1);
  DeviceBuffer<int32_t> slots(bench::PagedSlots(n, 0, &rng));
  const int64_t elems = n * kv_heads * kDim;
  DeviceBuffer<uint8_t> k8(fp8 ? static_cast<size_t>(elems) : 0);
  DeviceBuffer<uint16_t> k16(fp8 ? 0 : static_cast<size_t>(elems));
  if (fp8) {
    bench::FillRandomFp8(k8.get(), elems, 3u, stream);
  } else {
    bench::FillRandomBf16(k16.get(), elems, 1u, stream);
  }
  DeviceBuffer<float> scales(std::vector<float>(static_cast<size_t>(kv_heads), 0.0625f));
  std::vector<float> q(static_cast<size_t>(heads * kDim));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : q) v = normal(rng);
  DeviceBuffer<float> query(q);
  bench::ExactSelection sel(n, 2048, heads, kv_heads, kDim);
  sel.score.query = query.get();
  sel.score.k_cache = fp8 ? static_cast<const void*>(k8.get()) : k16.get();
  sel.score.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
  sel.score.k_scale = scales.get();
  sel.score.slots = slots.get();
  sel.score.scale = 1.0f / std::sqrt(128.0f);
  const size_t logit_bytes = static_cast<size_t>(n * heads) * 4;
  const bench::TimingOptions timing{reps, 3, /*sync_each=*/false};
  std::printf("\n%lld tokens, %lld heads / %lld kv heads, %s keys (%.0f MiB), logits %.0f MiB\n",
              static_cast<long long>(n), static_cast<long long>(heads),
              static_cast<long long>(kv_heads), fp8 ? "fp8" : "bf16",
              elems * (fp8 ? 1.0 : 2.0) / 1048576.0, logit_bytes / 1048576.0);
  std::vector<int32_t> reference;
  for (int mode = 0; mode < 3; ++mode) {
    // 0: no L2 set-aside; 1: the set-aside, no window; 2: the set-aside and the window.
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    TS_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize,
                                     mode == 0 ? 0 : prop.persistingL2CacheMaxSize));
    const size_t persist = mode < 2 ? 0 : prop.persistingL2CacheMaxSize;
    SetWindow(stream, sel.logits.get(), logit_bytes, persist,
              static_cast<size_t>(prop.accessPolicyMaxWindowSize));
    const double all_ms = bench::GraphMedianMs(
        stream, [&](int) { TS_CUDA_CHECK(sel.Run(stream)); }, 4, timing);
    const double eager_ms =
        bench::MedianMs(stream, [&](int) { TS_CUDA_CHECK(sel.Run(stream)); }, timing);
    const double score_ms = bench::GraphMedianMs(
        stream, [&](int) { TS_CUDA_CHECK(ScoreKeys(sel.score, stream)); }, 4, timing);
    const double vote_ms = bench::GraphMedianMs(
        stream, [&](int) { TS_CUDA_CHECK(VoteFromLogits(sel.soft_vote, stream)); }, 4, timing);
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<int32_t> top = sel.top.Download();
    if (mode == 0) reference = top;
    std::printf("  %-26s selection %.3f ms (eager %.3f) | score %.3f ms | vote %.3f ms | picks "
                "%s\n",
                mode == 0 ? "no set-aside" : mode == 1 ? "set-aside, no window" : "logits persisting",
                all_ms, eager_ms,
                score_ms, vote_ms, top == reference ? "same" : "DIFFER");
  }
  SetWindow(stream, nullptr, 0, 0, 0);
}

int Main(int argc, char** argv) {
  auto positional = common::ParseFlags(argc, argv, "bench_l2_logits_cuda");
  if (!positional.ok()) {
    std::fprintf(stderr, "%s\n", positional.status().ToString().c_str());
    return 2;
  }
  int device = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s: L2 %.1f MiB, persisting max %.1f MiB, access-policy window max %.1f MiB\n",
              prop.name, prop.l2CacheSize / 1048576.0, prop.persistingL2CacheMaxSize / 1048576.0,
              prop.accessPolicyMaxWindowSize / 1048576.0);
  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
    const int64_t n = std::stoll(t);
    Run(n, 16, 4, true, absl::GetFlag(FLAGS_reps), prop, stream);   // TP = 2, FP8
    Run(n, 16, 4, false, absl::GetFlag(FLAGS_reps), prop, stream);  // TP = 2, bf16
    Run(n, 32, 8, true, absl::GetFlag(FLAGS_reps), prop, stream);   // one GPU, FP8
  }
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) { return tokenselect::kernels::cuda::Main(argc, argv); }
