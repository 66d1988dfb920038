// Pieces shared by the two key-scoring kernels (selection.h: ScoreKeys): key_scores.cu's
// lane-arithmetic kernel (every shape) and key_scores_mma.cu's tensor-core kernel (head_dim 128,
// query-head group 4). Included by those two files only.
//   ScoreWorkspace      the launch counter and the per-(block, head) (max, sum-exp) partials
//   PlanScoreGrid, ResidentBlocks   the launch grid
//   CombineStats        merge of two online-softmax states
//   FinishScoreStats    called by every thread once its block's partials are written: the last
//                       block to finish combines all of them into head_max / head_inv_sum and
//                       re-zeroes the counter
#ifndef TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_
#define TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda::score_internal {

constexpr int kMaxScoreBlocks = 1024;

struct ScoreWorkspace {
  unsigned int* counter;
  float2* partial;  // [kMaxScoreBlocks, num_heads]: (max, sum-exp)
};

inline ScoreWorkspace CarveScoreWorkspace(void* ws) {
  ScoreWorkspace w;
  w.counter = static_cast<unsigned int*>(ws);
  w.partial = reinterpret_cast<float2*>(static_cast<char*>(ws) + 256);
  return w;
}

// The launch: blocks of `chunk` tokens (a multiple of `step`) covering the host's n (a bound
// when the length is on the device: blocks past the current length then do nothing), at most
// `resident` (blocks per SM times SMs) and kMaxScoreBlocks of them.
struct ScoreGrid {
  int blocks;
  int64_t chunk;
};
inline ScoreGrid PlanScoreGrid(int64_t n, int64_t step, int64_t resident) {
  int64_t blocks = resident < kMaxScoreBlocks ? resident : kMaxScoreBlocks;
  const int64_t needed = (n + step - 1) / step;
  if (needed < blocks) blocks = needed;
  if (blocks < 1) blocks = 1;
  int64_t chunk = (n + blocks - 1) / blocks;
  chunk = (chunk + step - 1) / step * step;
  return ScoreGrid{static_cast<int>((n + chunk - 1) / chunk), chunk};
}

// Blocks of `kernel` (with `threads` threads and `smem` bytes) resident at once: SMs x blocks per
// SM, computed on the first call and kept in `*cache` (a static of the caller's instantiation:
// the same on every launch; the rank threads of tensor parallelism launch concurrently, hence
// the atomic).
template <typename Kernel>
cudaError_t ResidentBlocks(Kernel kernel, int threads, size_t smem, std::atomic<int64_t>* cache,
                           int64_t* resident) {
  *resident = cache->load(std::memory_order_relaxed);
  if (*resident > 0) return cudaSuccess;
  int device = 0, num_sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  }
  if (err != cudaSuccess) return err;
  *resident = static_cast<int64_t>(num_sms) * (per_sm > 1 ? per_sm : 1);
  cache->store(*resident, std::memory_order_relaxed);
  return cudaSuccess;
}

// (m, l) online softmax states: l is the sum of exp(s - m).
__device__ __forceinline__ float2 CombineStats(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  if (m == -INFINITY) return make_float2(-INFINITY, 0.0f);
  return make_float2(m, a.y * __expf(a.x - m) + b.y * __expf(b.x - m));
}

__device__ __forceinline__ void FinishScoreStats(const KeyScoreParams& p, const ScoreWorkspace& ws) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(ws.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // S consecutive lanes per head (S a power of two <= 32, as many as the block allows), lane s
  // of a head's group taking blocks s, s + S, ... with 8 loads in flight; then the group meets
  // in a fixed xor tree (CombineStats is symmetric, so every lane of the group ends with the
  // same state: deterministic). The serial combine this replaced (one warp per head, lanes over
  // the blocks) took ~12 dependent L2 round trips in one block at the end of every call.
  const int num_heads = static_cast<int>(p.num_heads);
  const int blocks = static_cast<int>(gridDim.x);
  int group = 1;
  while (group < 32 && 2 * group * num_heads <= static_cast<int>(blockDim.x)) group *= 2;
  const int heads_per_round = static_cast<int>(blockDim.x) / group;
  const int s = static_cast<int>(threadIdx.x) % group;
  constexpr int kInFlight = 8;
  for (int h0 = 0; h0 < num_heads; h0 += heads_per_round) {  // block-uniform
    const int h = h0 + static_cast<int>(threadIdx.x) / group;
    float2 acc = make_float2(-INFINITY, 0.0f);
    if (h < num_heads) {
      for (int b0 = s; b0 < blocks; b0 += kInFlight * group) {
        float2 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int b = b0 + u * group;
          v[u] = b < blocks ? __ldcg(&ws.partial[b * num_heads + h])
                            : make_float2(-INFINITY, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) acc = CombineStats(acc, v[u]);
      }
    }
    for (int off = 1; off < group; off <<= 1) {
      float2 other;
      other.x = __shfl_xor_sync(0xffffffffu, acc.x, off);
      other.y = __shfl_xor_sync(0xffffffffu, acc.y, off);
      acc = CombineStats(acc, other);
    }
    if (s == 0 && h < num_heads) {
      p.head_max[h] = acc.x;
      p.head_inv_sum[h] = 1.0f / acc.y;
    }
  }
  if (threadIdx.x == 0) *ws.counter = 0;  // ready for the next launch
}

// The tensor-core kernel (key_scores_mma.cu) for the shapes it covers; cudaErrorNotSupported for
// the others (the caller then uses the lane kernel).
cudaError_t LaunchScoreKeysMma(const KeyScoreParams& p, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda::score_internal

#endif  // TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_
