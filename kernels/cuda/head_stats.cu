// HeadSoftmaxStats (selection.h): per-head softmax statistics of the logits in an order fixed by
// n alone, for TP-invariant numerics (docs/parallel.md).
//
// ScoreKeys computes the same statistics while it streams the keys, but in an order that follows
// its grid and lane mapping, which depend on the rank's number of KV heads: a head's max is
// exact in any order, its sum of exponentials is not, so one GPU and a tensor-parallel rank
// would vote from sums that differ in the last bits. Here a head's statistics depend on that
// head's logits and n only. ChunkStatsKernel: blocks of kChunk = 512 tokens (short per-warp
// chains: the loop is latency-bound), each of the 8 warps a contiguous eighth of them, lane l
// heads l, l + 32, ... (per load a warp reads one token's logits: 16 bytes of each 4-head
// chunk, LogitIndex), an online max and sum per (warp, head) in token order; the warps' pairs
// meet in warp order. FinishStatsKernel: a warp per head, lane l the blocks l, l + 32, ... in
// order, then an xor butterfly (the pairwise combine is symmetric, so every lane ends with the
// same pair). A second read of the logits (4 H bytes per token: ~6% of the key bytes for
// Llama-3-8B). Not key_scores_internal.cuh's FinishScoreStats / CombineStats: that combine sizes
// its lane groups by the head count (the order this kernel exists to fix) and uses __expf where
// this uses expf.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_length.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kChunk = 512;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeads = 512;  // shared memory: kWarps x heads pairs
constexpr int kUnroll = 8;      // a warp's 64 tokens: 8 rounds of 8 loads in flight

struct Stats {
  float max, sum;
};

// Symmetric in its arguments (fp addition commutes), so a butterfly gives every lane the same.
__device__ __forceinline__ Stats Combine(Stats a, Stats b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ void Update(Stats* s, float v) {
  if (v > s->max) {
    s->sum = s->sum * expf(s->max - v) + 1.0f;
    s->max = v;
  } else {
    s->sum += expf(v - s->max);
  }
}

// No __launch_bounds__: with it ptxas (sm_80) capped the kernel at 32 registers and spilled.
__global__ void ChunkStatsKernel(HeadStatsParams p, float2* __restrict__ partial) {
  __shared__ float2 sm[kWarps * kMaxHeads];
  if (p.skip != nullptr && *p.skip != 0) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  if (begin >= n) return;
  const int heads = static_cast<int>(p.num_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kPerWarp = kChunk / kWarps;
  const int64_t w_begin = begin + warp * kPerWarp;
  const int64_t w_end = min(w_begin + kPerWarp, n);
  for (int h = lane; h < heads; h += 32) {
    Stats s{-INFINITY, 0.0f};
    // Head h's logit of token j is at column[j * width] (LogitIndex).
    const float* column = p.logits + LogitIndex(0, h, p.n, heads);
    const int64_t width = LogitIndex(1, h, p.n, heads) - LogitIndex(0, h, p.n, heads);
    int64_t j = w_begin;
    for (; j + kUnroll <= w_end; j += kUnroll) {  // loads in flight, applied in token order
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = column[(j + u) * width];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) Update(&s, v[u]);
    }
    for (; j < w_end; ++j) Update(&s, column[j * width]);
    sm[warp * kMaxHeads + h] = {s.max, s.sum};
  }
  __syncthreads();
  for (int h = threadIdx.x; h < heads; h += kThreads) {
    Stats s{-INFINITY, 0.0f};
    for (int w = 0; w < kWarps; ++w) {
      const float2 v = sm[w * kMaxHeads + h];
      s = Combine(s, {v.x, v.y});
    }
    partial[blockIdx.x * static_cast<int64_t>(heads) + h] = {s.max, s.sum};
  }
}

__global__ void FinishStatsKernel(HeadStatsParams p, const float2* __restrict__ partial) {
  if (p.skip != nullptr && *p.skip != 0) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  const int lane = threadIdx.x & 31;
  for (int64_t h = threadIdx.x >> 5; h < p.num_heads; h += kWarps) {
    Stats s{-INFINITY, 0.0f};
    for (int64_t b = lane; b < blocks; b += 32) {
      const float2 v = partial[b * p.num_heads + h];
      s = Combine(s, {v.x, v.y});
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const Stats o{__shfl_xor_sync(0xffffffffu, s.max, off),
                    __shfl_xor_sync(0xffffffffu, s.sum, off)};
      s = Combine(s, o);
    }
    if (lane == 0) {
      p.head_max[h] = s.max;
      p.head_inv_sum[h] = 1.0f / s.sum;
    }
  }
}

}  // namespace

size_t HeadSoftmaxStatsWorkspaceBytes(int64_t n, int64_t num_heads) {
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  return static_cast<size_t>(blocks > 0 ? blocks : 1) * static_cast<size_t>(num_heads) *
         sizeof(float2);
}

cudaError_t HeadSoftmaxStats(const HeadStatsParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.num_heads <= 0 || p.num_heads > kMaxHeads || p.head_max == nullptr ||
      p.head_inv_sum == nullptr || p.logits == nullptr || p.workspace == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  const int64_t blocks = (p.n + kChunk - 1) / kChunk;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  auto* partial = static_cast<float2*>(p.workspace);
  ChunkStatsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, partial);
  FinishStatsKernel<<<1, kThreads, 0, stream>>>(p, partial);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
