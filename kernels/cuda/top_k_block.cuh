// The radix select's shared pieces (top_k.cu): its block shape, workspace layout, block-wide
// scan, grid barrier and digit choice, used by TopK's kernel and by the bound-vote selection's
// screen (bound_vote.cu). Both are cooperative launches of kThreads-thread blocks, at most one
// block per SM, over a TopKWorkspaceBytes() workspace whose control words are zero at launch.
#ifndef TOKENSELECT_KERNELS_CUDA_TOP_K_BLOCK_CUH_
#define TOKENSELECT_KERNELS_CUDA_TOP_K_BLOCK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_length.h"
#include "kernels/cuda/top_k_digit.cuh"

namespace tokenselect::kernels::cuda::top_k_block {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;
constexpr int64_t kMinPerBlock = 2048;
using top_k_digit::kTopBits;  // pass 0's digit; then two of kLowBits
using top_k_digit::kTopBins;
constexpr int kLowBits = 10;
constexpr int kLowBins = 1 << kLowBits;
constexpr int kCandPerThread = 16;
constexpr int kMaxCandidates = kThreads * kCandPerThread;

// Workspace layout (uint32 words). Words [0, kControlWords) are zero at launch and cleared
// again at the end (TopK: by the last block to finish; the screen: by its picker, the last block
// to arrive).
constexpr int kHist0 = top_k_digit::kHist0;    // [kTopBins]
constexpr int kHist1 = kHist0 + kTopBins;      // [kLowBins] (slow path)
constexpr int kHist2 = kHist1 + kLowBins;      // [kLowBins] (slow path)
constexpr int kBarrier = kHist2 + kLowBins;    // grid-barrier arrivals
constexpr int kCandCount = kBarrier + 1;       // candidates appended so far
constexpr int kDone = kBarrier + 2;            // blocks done with the control words
constexpr int kControlWords = kBarrier + 8;
constexpr int kGreater = kControlWords;        // [kMaxBlocks] per block: keys > T (or > B)
constexpr int kEqual = kGreater + kMaxBlocks;  // [kMaxBlocks] per block: keys == T (slow path)
constexpr int kCand = kEqual + kMaxBlocks;     // [kMaxCandidates] (key, index) pairs
constexpr int kWorkspaceWords = kCand + 2 * kMaxCandidates;
static_assert(kCand % 2 == 0, "candidate pairs are 8-byte aligned");
static_assert(kTopBits + 2 * kLowBits == 32, "three digits cover the key");

using top_k_digit::OrderedKey;
// Exclusive scan of one value per thread over the block; returns the total.
__device__ inline uint32_t BlockExclusiveScan(uint32_t value, uint32_t* exclusive) {
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

__device__ __forceinline__ uint32_t BlockSum(uint32_t value) {
  uint32_t unused;
  return BlockExclusiveScan(value, &unused);
}

// Every block taking part arrives before any leaves. `target` = their number * (barriers so
// far, this one included); the counter starts at zero. Thread 0 arrives with a release add and
// spins with acquire loads (gpu scope), which with the block barriers around them make each
// block's global writes before the barrier visible to every block after it (release is
// cumulative over what the block barrier ordered before it); no full fences.
// GridArrive is the arrival alone (GridBarrier's first half).
__device__ __forceinline__ void GridArrive(uint32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
  }
}

// GridArriveLast: the arrival, telling every thread of the block whether it was the last one
// (the counter reaching `target`); the last block's thread 0 acquires with its add, so after
// the block barrier that block sees what every block wrote before arriving.
__device__ __forceinline__ bool GridArriveLast(uint32_t* counter, uint32_t target) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(before)
                 : "l"(counter)
                 : "memory");
    last = before + 1 == target;
  }
  __syncthreads();
  return last;
}

__device__ __forceinline__ void GridBarrier(uint32_t* counter, uint32_t target) {
  GridArrive(counter);
  if (threadIdx.x == 0) {
    uint32_t seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

// The grid's split of n elements, the same in TopK's kernel and the screen. The launch has
// LaunchBlocks(n, SMs) blocks; with a device length it was planned for the bound, and only the
// blocks the current n needs take part (a short list under a long bound then waits on a few
// blocks' barriers, not one per SM). Block b owns [b chunk, (b + 1) chunk) (chunk a multiple of
// kThreads, so every warp's part is whole tiles of 32), warp w the w-th of kWarps equal parts
// of it, [begin, end).
__host__ __device__ inline int64_t LaunchBlocks(int64_t n, int sms) {
  const int64_t wanted = (n + kMinPerBlock - 1) / kMinPerBlock;
  const int64_t blocks = wanted < sms ? wanted : sms;
  return blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

struct BlockSplit {
  uint32_t blocks;  // blocks taking part; blockIdx.x >= blocks leaves
  int64_t chunk, block_begin, part, begin, end;
};

__device__ __forceinline__ BlockSplit SplitForBlock(int64_t n, int warp) {
  BlockSplit s;
  s.blocks = static_cast<uint32_t>(LaunchBlocks(n, static_cast<int>(gridDim.x)));
  s.chunk = (n + s.blocks - 1) / s.blocks;
  s.chunk = (s.chunk + kThreads - 1) / kThreads * kThreads;
  s.block_begin = blockIdx.x * s.chunk;
  s.part = s.chunk / kWarps;
  s.begin = min(n, s.block_begin + warp * s.part);
  s.end = min(n, s.begin + s.part);
  return s;
}

// Warp-aggregated append: the lanes with `take` set claim consecutive entries of a list whose
// length is *counter (shared or global memory), in lane order, with one atomic for the warp.
// Returns this lane's entry (meaningful where take is set). Every lane of the warp calls it.
__device__ __forceinline__ uint32_t WarpAppend(bool take, uint32_t* counter) {
  const unsigned mask = __ballot_sync(0xffffffffu, take);
  if (mask == 0u) return 0u;  // the same in every lane
  const int lane = threadIdx.x & 31, leader = __ffs(mask) - 1;
  uint32_t first = 0;
  if (lane == leader) first = atomicAdd(counter, __popc(mask));
  first = __shfl_sync(0xffffffffu, first, leader);
  return first + __popc(mask & ((1u << lane) - 1u));
}

struct Digit {
  uint32_t bin;        // the chosen bin
  uint32_t remaining;  // how many keys of that bin still win
  uint32_t count;      // keys in that bin
};

// The bin of a kBins-bin histogram where the count from the top reaches `remaining`
// (1 <= remaining <= total): the same answer in every thread. Thread t holds the counts of bins
// kBins - 1 - t * per - [0, per) in c, highest first.
template <int kBins>
__device__ Digit ChooseDigitOf(const uint32_t (&c)[kBins / kThreads], uint32_t remaining) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kPer * kThreads == kBins, "bins split evenly over the threads");
  __shared__ Digit chosen;
  if (threadIdx.x == 0) chosen = Digit{0u, remaining, 0u};  // unreachable on a consistent histogram
  uint32_t sum = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) sum += c[e];
  uint32_t above;
  BlockExclusiveScan(sum, &above);  // its barriers also order the write of `chosen` above
  if (above < remaining && remaining <= above + sum) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      if (above < remaining && remaining <= above + c[e]) {
        const int bin = kBins - 1 - (static_cast<int>(threadIdx.x) * kPer + e);
        chosen = Digit{static_cast<uint32_t>(bin), remaining - above, c[e]};
      }
      above += c[e];
    }
  }
  __syncthreads();
  const Digit d = chosen;
  __syncthreads();  // chosen is written again by the next call
  return d;
}

// The same with count(b) reading bin b (a shared-memory histogram).
template <int kBins, class Count>
__device__ Digit ChooseDigit(Count count, uint32_t remaining) {
  constexpr int kPer = kBins / kThreads;
  uint32_t c[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    c[e] = count(kBins - 1 - (static_cast<int>(threadIdx.x) * kPer + e));
  }
  return ChooseDigitOf<kBins>(c, remaining);
}

// The same over a histogram in global memory (16-byte aligned), each thread's kPer consecutive
// bins read as whole vectors. Every block of the grid reads the histogram at once after a grid
// barrier; one word per load made 4x the L2 requests on the same lines: top-2048 at 512K
// 13.5-13.8 against 14.5-15.0 us, at 1M 17.2-17.7 against 18.0-18.7 us (H200, nineteenth
// session, same binary).
template <int kBins>
__device__ Digit ChooseDigitGlobal(const uint32_t* hist, uint32_t remaining) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kPer == 8 || kPer == 2, "two 16-byte or one 8-byte vector per thread");
  const int first = kBins - kPer * (static_cast<int>(threadIdx.x) + 1);  // bins first + [0, kPer)
  uint32_t w[kPer];
  if constexpr (kPer == 8) {
    const uint4 lo = __ldcg(reinterpret_cast<const uint4*>(hist + first));
    const uint4 hi = __ldcg(reinterpret_cast<const uint4*>(hist + first + 4));
    w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w;
    w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
  } else {
    const uint2 v = __ldcg(reinterpret_cast<const uint2*>(hist + first));
    w[0] = v.x; w[1] = v.y;
  }
  uint32_t c[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) c[e] = w[kPer - 1 - e];  // highest bin first
  return ChooseDigitOf<kBins>(c, remaining);
}

// Two 10-bit digits of T below those fixed in (*threshold, *mask), at shifts first_shift and 0,
// from a list of count <= kMaxCandidates keys that the whole block holds (ckey[u]: entry
// threadIdx.x + kThreads u): per digit a shared-memory histogram (hist: kLowBins words) of the
// keys that match so far, then ChooseDigit. *need (how many keys equal to T win) follows.
__device__ __forceinline__ void LowDigitsOfList(uint32_t* threshold, uint32_t* mask,
                                                uint32_t* need,
                                                const uint32_t (&ckey)[kCandPerThread],
                                                int count, int first_shift, uint32_t* hist) {
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = pass == 0 ? first_shift : 0;
    for (int b = threadIdx.x; b < kLowBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kCandPerThread; ++u) {
      if (kThreads * u >= count) break;  // the same in every thread
      const int j = static_cast<int>(threadIdx.x) + kThreads * u;
      if (j < count && (ckey[u] & *mask) == *threshold) {
        atomicAdd(&hist[(ckey[u] >> shift) & (kLowBins - 1)], 1u);
      }
    }
    __syncthreads();
    const Digit d = ChooseDigit<kLowBins>([&](int b) { return hist[b]; }, *need);
    *threshold |= d.bin << shift;
    *need = d.remaining;
    *mask |= static_cast<uint32_t>(kLowBins - 1) << shift;
  }
}

}  // namespace tokenselect::kernels::cuda::top_k_block

#endif  // TOKENSELECT_KERNELS_CUDA_TOP_K_BLOCK_CUH_
