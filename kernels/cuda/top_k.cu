// Deterministic single-row top-k (selection.h: TopK), for n up to 2^31 - 1 and any k.
//
// Scores map to an order-preserving 32-bit key (NaN -> 0, the lowest; -0 -> +0, so that the two
// zeros tie as they do on the CPU). One cooperative kernel (every block resident, grid-wide
// barriers through a counter in the workspace) finds the k-th largest key T by radix select,
// most significant byte first, and writes the winners:
//   4 histogram passes  each counts the next byte of the keys that match the prefix found so far
//                       (shared-memory histogram, then its non-zero bins by global atomics); a
//                       thread's keys are read once and kept in registers (up to 16 per thread:
//                       n <= 1M with 132 blocks of 512 threads), beyond that re-read per phase.
//                       After a barrier every block reads the global histogram and picks the
//                       same byte: the bin where the count from the top reaches k_remaining.
//   count               each warp walks its contiguous range of the block's contiguous range in
//                       tiles of 32 (ballots): the keys > T and == T; per-block totals go to the
//                       workspace and, after a barrier, every block sums the blocks before it.
//   compact             each warp walks its range again, in order, and writes index i to
//                       out[#greater before i + min(#equal before i, need)] when it wins,
//                       need = k - #greater: ties go to lower indices and the output is
//                       ascending, with no sort.
// Two launches (ClearControlKernel zeroes the histograms and the barrier counter first, as a
// kernel so that a set skip flag leaves the workspace alone); five grid barriers. Measured on an
// H200 (bench_kernels_cuda, top-2048): 20.9 us at n = 1M, 17-19 us at 32K-512K, where the seven
// one-pass launches it replaced took 38 us at 1M (plus ~1.3 us of launch gap apiece outside
// graphs); with the keys re-read from L2 in every phase instead of kept in registers, 29 us.
// What is left is mostly the phases' dependent round trips (atomics, barrier, histogram read).
// Every kernel returns at once when the skip flag is set.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;
constexpr int64_t kMinPerBlock = 2048;

// Workspace layout (uint32 words). Words [0, kControlWords) are cleared on every call.
constexpr int kHistWords = 4 * 256;
constexpr int kBarrierOffset = kHistWords;  // grid-barrier arrivals
constexpr int kControlWords = kBarrierOffset + 8;
constexpr int kGreaterOffset = kControlWords;  // [kMaxBlocks] per-block count of keys > T
constexpr int kEqualOffset = kGreaterOffset + kMaxBlocks;
constexpr int kWorkspaceWords = kEqualOffset + kMaxBlocks;

__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;  // NaN ranks lowest
  uint32_t u = __float_as_uint(f);
  if (f == 0.0f) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive scan of one value per thread over the block; returns the total.
__device__ uint32_t BlockExclusiveScan(uint32_t value, uint32_t* exclusive) {
  __shared__ uint32_t warp_sums[kWarps];
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
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) warp_offset += warp_sums[w];
    total += warp_sums[w];
  }
  __syncthreads();  // warp_sums may be reused by the next call
  *exclusive = warp_offset + inclusive - value;
  return total;
}

// Every block of the grid arrives before any leaves. `target` = gridDim.x * (barriers so far,
// this one included); the counter starts at zero (ClearControlKernel). The fences make each
// block's global writes before the barrier visible to every block after it.
__device__ __forceinline__ void GridBarrier(uint32_t* counter, uint32_t target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*static_cast<volatile uint32_t*>(counter) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

// The skip flag (selection.h): every kernel returns at once when it is set.
__device__ __forceinline__ bool Skipped(const int32_t* skip) {
  return skip != nullptr && *skip != 0;
}

__global__ void ClearControlKernel(uint32_t* __restrict__ ws, const int32_t* skip) {
  if (Skipped(skip)) return;
  for (int i = threadIdx.x; i < kControlWords; i += blockDim.x) ws[i] = 0u;
}

// Launched cooperatively with at most one block per SM. Block b owns scores[b * chunk, ...),
// warp w of it the w-th of kWarps equal parts (chunk is a multiple of kThreads, so every part is
// whole tiles of 32), lane l the elements begin + l + 32 j: the same elements in every phase, so
// the first kRegTiles tiles' keys are loaded once and stay in registers (every key of n <= ~1M
// on an H200); further tiles (larger n) are read again in each phase. n is a bound when
// device_n is set; k >= the current n (possible only then) writes 0 .. n - 1.
constexpr int kRegTiles = 16;

__global__ void __launch_bounds__(kThreads)
    RadixSelectKernel(int32_t* __restrict__ out, const float* __restrict__ scores, int64_t n,
                      DeviceLength device_n, uint32_t k, uint32_t* __restrict__ ws,
                      const int32_t* skip) {
  if (Skipped(skip)) return;
  n = ResolveLength(device_n, n);
  if (k >= n) {  // the same branch in every block: no barrier is left waiting
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      out[i] = static_cast<int32_t>(i);
    }
    return;
  }
  __shared__ uint32_t hist[256];
  __shared__ uint32_t chosen[2];  // prefix, k_remaining
  __shared__ uint32_t warp_counts[2][kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
  chunk = (chunk + kThreads - 1) / kThreads * kThreads;
  const int64_t part = chunk / kWarps;
  const int64_t begin = min(n, blockIdx.x * chunk + warp * part);
  const int64_t end = min(n, begin + part);
  uint32_t reg[kRegTiles];
#pragma unroll
  for (int u = 0; u < kRegTiles; ++u) {
    const int64_t i = begin + 32 * u + lane;
    reg[u] = i < end ? OrderedKey(scores[i]) : 0u;
  }
  // fn(key, index, valid) over the lane's elements in index order, all 32 lanes together (fn
  // may use warp votes).
  auto for_each = [&](auto&& fn) {
#pragma unroll
    for (int u = 0; u < kRegTiles; ++u) {
      const int64_t i = begin + 32 * u + lane;
      fn(reg[u], i, i < end);
    }
    for (int64_t t = begin + 32 * kRegTiles; t < end; t += 32) {
      const int64_t i = t + lane;
      const bool valid = i < end;
      fn(valid ? OrderedKey(scores[i]) : 0u, i, valid);
    }
  };

  uint32_t* barrier = ws + kBarrierOffset;
  uint32_t barriers = 0;
  uint32_t prefix = 0u, remaining = k;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for_each([&](uint32_t key, int64_t, bool valid) {
      const bool counted = valid && (key & mask) == prefix;
      const uint32_t bin = (key >> shift) & 255u;
      if (pass == 0) {
        // Warp-aggregated: votes crowd into few top bytes, and same-address shared atomics
        // serialise.
        const unsigned peers = __match_any_sync(0xffffffffu, counted ? bin : 256u);
        if (counted && __ffs(peers) - 1 == lane) {
          atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
        }
      } else if (counted) {  // later passes: few keys still match the prefix
        atomicAdd(&hist[bin], 1u);
      }
    });
    __syncthreads();
    uint32_t* global_hist = ws + pass * 256;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      if (hist[b] != 0) atomicAdd(&global_hist[b], hist[b]);
    }
    GridBarrier(barrier, ++barriers * gridDim.x);
    // Digit choice, the same in every block: thread t < 256 looks at bin 255 - t; `above`
    // counts the keys in higher bins.
    const int bin = 255 - static_cast<int>(threadIdx.x);
    const uint32_t count = threadIdx.x < 256 ? __ldcg(&global_hist[bin]) : 0u;
    uint32_t above;
    BlockExclusiveScan(count, &above);
    if (threadIdx.x < 256 && above < remaining && remaining <= above + count) {
      chosen[0] = prefix | (static_cast<uint32_t>(bin) << shift);
      chosen[1] = remaining - above;  // how many keys equal to the prefix still win
    }
    __syncthreads();
    prefix = chosen[0];
    remaining = chosen[1];
    __syncthreads();  // chosen is written again by the next pass
  }
  const uint32_t threshold = prefix, need = remaining;

  // Count, per warp then per block, the keys above and at the threshold.
  uint32_t greater = 0, equal = 0;
  for_each([&](uint32_t key, int64_t, bool valid) {
    greater += __popc(__ballot_sync(0xffffffffu, valid && key > threshold));
    equal += __popc(__ballot_sync(0xffffffffu, valid && key == threshold));
  });
  if (lane == 0) {
    warp_counts[0][warp] = greater;
    warp_counts[1][warp] = equal;
  }
  __syncthreads();
  if (threadIdx.x < 2) {
    uint32_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_counts[threadIdx.x][w];
    ws[(threadIdx.x == 0 ? kGreaterOffset : kEqualOffset) + blockIdx.x] = total;
  }
  GridBarrier(barrier, ++barriers * gridDim.x);
  // This block's offsets: the totals of the blocks before it.
  uint32_t g = 0, e = 0;
  for (int b = threadIdx.x; b < static_cast<int>(blockIdx.x); b += blockDim.x) {
    g += __ldcg(&ws[kGreaterOffset + b]);
    e += __ldcg(&ws[kEqualOffset + b]);
  }
  uint32_t unused;
  g = BlockExclusiveScan(g, &unused);
  e = BlockExclusiveScan(e, &unused);
  uint32_t greater_run = g, equal_run = e;
  for (int w = 0; w < warp; ++w) {
    greater_run += warp_counts[0][w];
    equal_run += warp_counts[1][w];
  }
  // Compact: index i goes to out[#greater before i + min(#equal before i, need)] when it wins.
  const unsigned below = (1u << lane) - 1u;
  for_each([&](uint32_t key, int64_t i, bool valid) {
    const bool is_greater = valid && key > threshold;
    const bool is_equal = valid && key == threshold;
    const unsigned greater_mask = __ballot_sync(0xffffffffu, is_greater);
    const unsigned equal_mask = __ballot_sync(0xffffffffu, is_equal);
    const uint32_t greater_before = greater_run + __popc(greater_mask & below);
    const uint32_t equal_before = equal_run + __popc(equal_mask & below);
    if (is_greater || (is_equal && equal_before < need)) {
      out[greater_before + min(equal_before, need)] = static_cast<int32_t>(i);
    }
    greater_run += __popc(greater_mask);
    equal_run += __popc(equal_mask);
  });
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
  if (k == p.n && p.device_n.count == nullptr) {
    const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, 4096);
    IotaKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(p.out, p.n, p.skip);
    return cudaGetLastError();
  }
  // One block per SM at most: the grid barriers need every block resident (the cooperative
  // launch checks that).
  int device = 0, sms = 0;
  TS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int64_t blocks = std::min<int64_t>({kMaxBlocks, sms, (p.n + kMinPerBlock - 1) / kMinPerBlock});
  blocks = std::max<int64_t>(blocks, 1);
  uint32_t* ws = static_cast<uint32_t*>(p.workspace);
  ClearControlKernel<<<1, kThreads, 0, stream>>>(ws, p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  int32_t* out = p.out;
  const float* scores = p.scores;
  int64_t n = p.n;
  DeviceLength device_n = p.device_n;
  uint32_t kk = static_cast<uint32_t>(k);
  const int32_t* skip = p.skip;
  void* args[] = {&out, &scores, &n, &device_n, &kk, &ws, &skip};
  TS_CUDA_RETURN_IF_ERROR(cudaLaunchCooperativeKernel(
      reinterpret_cast<const void*>(&RadixSelectKernel), dim3(static_cast<unsigned>(blocks)),
      dim3(kThreads), args, 0, stream));
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
