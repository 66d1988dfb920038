// Pieces shared by the two key-scoring kernels (selection.h: ScoreKeys): key_scores.cu's
// lane-arithmetic kernel (every shape) and key_scores_mma.cu's tensor-core kernel (head_dim 128,
// query-head group 4). Included by those two files only.
//   ScoreWorkspace      the counters and the per-(block, head) and per-(group of blocks, head)
//                       (max, sum-exp) partials
//   PlanScoreGrid, ResidentBlocks   the launch grid
//   CombineStats        merge of two online-softmax states
//   FinishScoreStats    called by every thread once its block's partials are written: the last
//                       block of each group of blocks merges the group's, the last group's
//                       merger merges the groups into head_max / head_inv_sum; re-zeroes the
//                       counters
#ifndef TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_
#define TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda::score_internal {

constexpr int kMaxScoreBlocks = 1024;
// Blocks whose partials the last of them merges into one per head before the final merge.
constexpr int kStatsGroup = 32;
constexpr int kMaxStatsGroups = kMaxScoreBlocks / kStatsGroup;

struct ScoreWorkspace {
  unsigned int* counter;        // groups merged
  unsigned int* sample_counter; // bound mode: blocks past their sample's steps
  unsigned int* sample_flag;    // bound mode: 1 once the sample's statistics are written
  unsigned int* group_done;     // [kMaxStatsGroups] blocks finished per group
  float2* partial;              // [kMaxScoreBlocks, num_heads]: (max, sum-exp) per block
  float2* group_partial;        // [kMaxStatsGroups, num_heads]: per group of kStatsGroup blocks
};

// Layout: the counters in the first 256 bytes, group_done, partial, group_partial.
constexpr size_t kGroupDoneOffset = 256;
constexpr size_t kPartialOffset = kGroupDoneOffset + kMaxStatsGroups * sizeof(unsigned int);
inline size_t ScoreWorkspaceSize(int64_t num_heads) {
  return kPartialOffset + static_cast<size_t>(kMaxScoreBlocks + kMaxStatsGroups) *
                              static_cast<size_t>(num_heads) * sizeof(float2);
}

inline ScoreWorkspace CarveScoreWorkspace(void* ws, int64_t num_heads) {
  char* base = static_cast<char*>(ws);
  ScoreWorkspace w;
  w.counter = reinterpret_cast<unsigned int*>(base);
  w.sample_counter = w.counter + 1;
  w.sample_flag = w.counter + 2;
  w.group_done = reinterpret_cast<unsigned int*>(base + kGroupDoneOffset);
  w.partial = reinterpret_cast<float2*>(base + kPartialOffset);
  w.group_partial = w.partial + static_cast<int64_t>(kMaxScoreBlocks) * num_heads;
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

// Merges, per head h < num_heads, the states src[i * num_heads + h] for i in [0, count) into
// dst[h] (or, when dst is null, into head_max / head_inv_sum), with the block's threads: as many
// lanes per head as the block allows (a power of two up to 32). Lane s of a head's group takes
// i = s, s + lanes, ... in order with kInFlight loads outstanding, then the group meets in a
// fixed xor tree (CombineStats is symmetric, so every lane ends with the same state): the result
// depends on count and num_heads only. Every thread of the block calls it.
template <int kInFlight>
__device__ __forceinline__ void CombinePartials(const float2* src, int count, int num_heads,
                                                float2* dst, float* out_max,
                                                float* out_inv_sum) {
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  int lanes = 1;
  while (lanes < 32 && 2 * lanes * num_heads <= threads) lanes *= 2;
  const int heads_per_round = threads / lanes;
  const int s = tid % lanes;
  for (int h0 = 0; h0 < num_heads; h0 += heads_per_round) {  // block-uniform
    const int h = h0 + tid / lanes;
    float2 acc = make_float2(-INFINITY, 0.0f);
    if (h < num_heads) {
      for (int i0 = s; i0 < count; i0 += kInFlight * lanes) {
        float2 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int i = i0 + u * lanes;
          v[u] = i < count ? __ldcg(&src[static_cast<int64_t>(i) * num_heads + h])
                           : make_float2(-INFINITY, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) acc = CombineStats(acc, v[u]);
      }
    }
    for (int off = 1; off < lanes; off <<= 1) {
      float2 other;
      other.x = __shfl_xor_sync(0xffffffffu, acc.x, off);
      other.y = __shfl_xor_sync(0xffffffffu, acc.y, off);
      acc = CombineStats(acc, other);
    }
    if (s == 0 && h < num_heads) {
      if (dst != nullptr) {
        __stcg(&dst[h], acc);
      } else {
        out_max[h] = acc.x;
        out_inv_sum[h] = 1.0f / acc.y;
      }
    }
  }
}

// True in every thread of the block that is the last to add 1 to *counter, whose final value
// is `total` (the block's global writes before the call are then visible to it).
__device__ __forceinline__ bool LastToArrive(unsigned int* counter, unsigned int total) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == total - 1;
  __syncthreads();
  if (!is_last) return false;
  __threadfence();
  return true;
}

// Called by every thread once its block's partials (ws.partial[blockIdx.x]) are written. The
// last block of each group of kStatsGroup consecutive blocks merges the group's partials; the
// last group to be merged merges the groups into head_max / head_inv_sum. Both merges run in a
// fixed order (deterministic for a given grid), and each is one or two dependent L2 round trips
// however many blocks the grid has (one merge over the 263 blocks of an H200 took five). The
// counters are re-zeroed for the next launch. True in the block that wrote the final merge (the
// last block of the grid to finish).
__device__ __forceinline__ bool FinishScoreStats(const KeyScoreParams& p,
                                                 const ScoreWorkspace& ws) {
  const int num_heads = static_cast<int>(p.num_heads);
  const int blocks = static_cast<int>(gridDim.x);
  const int group = static_cast<int>(blockIdx.x) / kStatsGroup;
  const int first = group * kStatsGroup;
  const int members = min(kStatsGroup, blocks - first);
  if (!LastToArrive(&ws.group_done[group], static_cast<unsigned int>(members))) return false;
  CombinePartials<8>(ws.partial + static_cast<int64_t>(first) * num_heads, members, num_heads,
                     ws.group_partial + static_cast<int64_t>(group) * num_heads, nullptr,
                     nullptr);
  if (threadIdx.x == 0) ws.group_done[group] = 0;  // ready for the next launch
  const int groups = (blocks + kStatsGroup - 1) / kStatsGroup;
  if (!LastToArrive(ws.counter, static_cast<unsigned int>(groups))) return false;
  CombinePartials<8>(ws.group_partial, groups, num_heads, nullptr, p.head_max, p.head_inv_sum);
  if (threadIdx.x == 0) *ws.counter = 0;
  return true;
}

// The tensor-core kernel (key_scores_mma.cu) for the shapes it covers; cudaErrorNotSupported for
// the others (the caller then uses the lane kernel).
cudaError_t LaunchScoreKeysMma(const KeyScoreParams& p, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda::score_internal

#endif  // TOKENSELECT_KERNELS_CUDA_KEY_SCORES_INTERNAL_CUH_
