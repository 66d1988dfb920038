// Deterministic single-row top-k (selection.h: TopK), for n up to 2^31 - 1 and any k.
//
// Scores map to an order-preserving 32-bit key (NaN -> 0, the lowest; -0 -> +0, so that the two
// zeros tie as they do on the CPU). The k-th largest key T is found by radix select, most
// significant byte first:
//   RadixHistogramKernel (x4)  reads the scores (n * 4 B; from L2 after the first pass at n <= 4M)
//                              and counts the next byte of the keys that match the prefix found so
//                              far (shared-memory histogram, then 256 global atomics per block).
//                              The last block to finish picks the byte where the count from the
//                              top reaches k and updates (prefix, k_remaining) in the workspace.
//   CountKernel                per block (a contiguous range): the number of keys > T and == T;
//                              the last block turns them into exclusive prefix sums.
//   CompactKernel              re-walks each block's range in order (tiles of 256) and writes index
//                              i to out[#greater before i + min(#equal before i, need)] when it
//                              wins, need = k - #greater: ties go to lower indices and the output
//                              is ascending, with no sort.
// Traffic at n = 1M: ~6 reads of 4 MB (mostly L2) and k * 4 B written; launch-bound (8 launches:
// ClearControlKernel first). Every kernel returns at once when the skip flag is set.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr int64_t kMinPerBlock = 1024;

// Workspace layout (uint32 words). Words [0, kControlWords) are cleared on every call.
constexpr int kHistWords = 4 * 256;
constexpr int kDoneOffset = kHistWords;       // 5 counters: 4 passes + count kernel
constexpr int kStateOffset = kDoneOffset + 8;  // prefix, k_remaining
constexpr int kControlWords = kStateOffset + 8;
constexpr int kGreaterOffset = kControlWords;  // [kMaxBlocks]
constexpr int kEqualOffset = kGreaterOffset + kMaxBlocks;
constexpr int kWorkspaceWords = kEqualOffset + kMaxBlocks;

__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;  // NaN ranks lowest
  uint32_t u = __float_as_uint(f);
  if (f == 0.0f) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive scan of one value per thread over a block of kThreads threads; returns the total.
__device__ uint32_t BlockExclusiveScan(uint32_t value, uint32_t* exclusive) {
  __shared__ uint32_t warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t inclusive = value;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t other = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint32_t warp_offset = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) warp_offset += warp_sums[w];
    total += warp_sums[w];
  }
  __syncthreads();  // warp_sums may be reused by the next call
  *exclusive = warp_offset + inclusive - value;
  return total;
}

// The skip flag (selection.h): every kernel returns at once when it is set.
__device__ __forceinline__ bool Skipped(const int32_t* skip) {
  return skip != nullptr && *skip != 0;
}

__global__ void ClearControlKernel(uint32_t* __restrict__ ws, const int32_t* skip) {
  if (Skipped(skip)) return;
  for (int i = threadIdx.x; i < kControlWords; i += blockDim.x) ws[i] = 0u;
}

__global__ void __launch_bounds__(kThreads)
    RadixHistogramKernel(const float* __restrict__ scores, int64_t n, uint32_t k, int pass,
                         uint32_t* __restrict__ ws, const int32_t* skip) {
  if (Skipped(skip)) return;
  __shared__ uint32_t hist[256];
  __shared__ bool is_last;
  const int shift = 24 - 8 * pass;
  const uint32_t prefix = pass == 0 ? 0u : ws[kStateOffset];
  const uint32_t mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
  for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  // kPerThread loads in flight per thread (indices clamped, extras masked), then the bins.
  constexpr int kPerThread = 4;
  const int64_t tile = static_cast<int64_t>(gridDim.x) * blockDim.x * kPerThread;
  for (int64_t i0 = blockIdx.x * static_cast<int64_t>(blockDim.x) * kPerThread + threadIdx.x;
       i0 < n; i0 += tile) {
    float values[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) values[r] = scores[min(i0 + r * blockDim.x, n - 1)];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const uint32_t key = OrderedKey(values[r]);
      // Warp-aggregated: votes crowd into few bins, and same-address shared atomics serialise.
      const bool counted = i0 + r * blockDim.x < n && (key & mask) == prefix;
      const uint32_t bin = counted ? (key >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if (bin < 256u && __ffs(peers) - 1 == static_cast<int>(threadIdx.x & 31)) {
        atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
  }
  __syncthreads();
  uint32_t* global_hist = ws + pass * 256;
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    if (hist[b] != 0) atomicAdd(&global_hist[b], hist[b]);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&ws[kDoneOffset + pass], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Digit choice in parallel (a serial scan of 256 bins by one thread cost ~4 us per pass):
  // thread t looks at bin 255 - t; `above` counts the keys in higher bins.
  const uint32_t remaining = pass == 0 ? k : ws[kStateOffset + 1];
  const int bin = 255 - static_cast<int>(threadIdx.x);
  const uint32_t count = __ldcg(&global_hist[bin]);
  uint32_t above;
  BlockExclusiveScan(count, &above);
  if (above < remaining && remaining <= above + count) {
    ws[kStateOffset] = prefix | (static_cast<uint32_t>(bin) << shift);
    ws[kStateOffset + 1] = remaining - above;  // how many keys equal to the prefix still win
  }
}

__global__ void __launch_bounds__(kThreads)
    CountKernel(const float* __restrict__ scores, int64_t n, int64_t chunk,
                uint32_t* __restrict__ ws, const int32_t* skip) {
  if (Skipped(skip)) return;
  __shared__ bool is_last;
  const uint32_t threshold = ws[kStateOffset];
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = min(n, begin + chunk);
  uint32_t greater = 0, equal = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const uint32_t key = OrderedKey(scores[i]);
    greater += key > threshold ? 1u : 0u;
    equal += key == threshold ? 1u : 0u;
  }
  uint32_t unused;
  const uint32_t block_greater = BlockExclusiveScan(greater, &unused);
  const uint32_t block_equal = BlockExclusiveScan(equal, &unused);
  if (threadIdx.x == 0) {
    ws[kGreaterOffset + blockIdx.x] = block_greater;
    ws[kEqualOffset + blockIdx.x] = block_equal;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&ws[kDoneOffset + 4], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Exclusive prefix sums over blocks, in place: each thread owns kMaxBlocks / kThreads entries.
  constexpr int kPer = kMaxBlocks / kThreads;
  for (int which = 0; which < 2; ++which) {
    uint32_t* counts = ws + (which == 0 ? kGreaterOffset : kEqualOffset);
    uint32_t local[kPer];
    uint32_t sum = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int b = threadIdx.x * kPer + e;
      local[e] = b < static_cast<int>(gridDim.x) ? __ldcg(&counts[b]) : 0u;
      sum += local[e];
    }
    uint32_t offset;
    BlockExclusiveScan(sum, &offset);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int b = threadIdx.x * kPer + e;
      if (b < static_cast<int>(gridDim.x)) counts[b] = offset;
      offset += local[e];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    CompactKernel(int32_t* __restrict__ out, const float* __restrict__ scores, int64_t n,
                  int64_t chunk, const uint32_t* __restrict__ ws, const int32_t* skip) {
  if (Skipped(skip)) return;
  const uint32_t threshold = ws[kStateOffset];
  const uint32_t need = ws[kStateOffset + 1];
  uint32_t greater_run = ws[kGreaterOffset + blockIdx.x];
  uint32_t equal_run = ws[kEqualOffset + blockIdx.x];
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = min(n, begin + chunk);
  for (int64_t tile = begin; tile < end; tile += blockDim.x) {
    const int64_t i = tile + threadIdx.x;
    const uint32_t key = i < end ? OrderedKey(scores[i]) : 0u;
    const bool greater = i < end && key > threshold;
    const bool equal = i < end && key == threshold;
    // Counts fit in 16 bits per tile: pack (equal << 16) | greater into one scan.
    uint32_t before;
    const uint32_t total =
        BlockExclusiveScan((equal ? 1u << 16 : 0u) | (greater ? 1u : 0u), &before);
    const uint32_t greater_before = greater_run + (before & 0xffffu);
    const uint32_t equal_before = equal_run + (before >> 16);
    if (greater || (equal && equal_before < need)) {
      out[greater_before + min(equal_before, need)] = static_cast<int32_t>(i);
    }
    greater_run += total & 0xffffu;
    equal_run += total >> 16;
  }
}

__global__ void IotaKernel(int32_t* __restrict__ out, int64_t n, const int32_t* skip) {
  if (Skipped(skip)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

size_t TopKWorkspaceBytes(int64_t /*n*/) { return kWorkspaceWords * sizeof(uint32_t); }

cudaError_t TopK(const TopKParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.k < 0 || p.n > INT32_MAX) return cudaErrorInvalidValue;
  const int64_t k = std::min(p.k, p.n);
  if (k == 0) return cudaSuccess;
  if (k == p.n) {
    const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, 4096);
    IotaKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(p.out, p.n, p.skip);
    return cudaGetLastError();
  }
  uint32_t* ws = static_cast<uint32_t*>(p.workspace);
  // A kernel rather than cudaMemsetAsync, so that a set skip flag leaves the workspace alone too.
  ClearControlKernel<<<1, kThreads, 0, stream>>>(ws, p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  int64_t blocks = std::min<int64_t>(kMaxBlocks, (p.n + kMinPerBlock - 1) / kMinPerBlock);
  int64_t chunk = (p.n + blocks - 1) / blocks;
  chunk = (chunk + kThreads - 1) / kThreads * kThreads;
  blocks = (p.n + chunk - 1) / chunk;
  for (int pass = 0; pass < 4; ++pass) {
    RadixHistogramKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(
        p.scores, p.n, static_cast<uint32_t>(k), pass, ws, p.skip);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  CountKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(p.scores, p.n, chunk, ws,
                                                                 p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CompactKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(p.out, p.scores, p.n, chunk,
                                                                   ws, p.skip);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
