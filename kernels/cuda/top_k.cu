// Deterministic single-row top-k (selection.h: TopK), for n up to 2^31 - 1 and any k.
//
// Scores map to an order-preserving 32-bit key (NaN -> 0, the lowest; -0 -> +0, so that the two
// zeros tie as they do on the CPU). One cooperative kernel (every block resident, grid-wide
// barriers through a counter in the workspace) finds the k-th largest key T by radix select,
// most significant digit first (12, 10 and 10 bits), and writes the winners in index order:
//   pass 0      a 4096-bin histogram of the keys' top 12 bits (shared-memory atomics, then the
//               non-zero bins by global atomics); a thread's keys are read once and kept
//               in registers (up to 16 per thread: n <= 1M with 132 blocks of 512 threads),
//               beyond that re-read per phase. After a barrier every block reads the histogram
//               (16-byte loads) and picks the same bin B: the one where the count from the top
//               reaches k.
//   fast path   (B holds at most kMaxCandidates keys - a few hundred for soft votes at 32K-1M)
//               every block counts its keys above B ("sure winners") and appends the keys in B
//               with their indices to a candidate list; after a second barrier every block
//               loads the whole list and finishes the select on it in shared memory (two
//               10-bit passes, no grid barrier). The list also gives each block its offsets:
//               the sure winners of the blocks before it plus the candidates from before it
//               that are above / equal to T.
//   slow path   (ties or crowded scores: B holds more) two more 10-bit histogram passes over all
//               keys with a barrier each, then per-block counts of the keys above / equal to T
//               and a barrier; every block sums the blocks before it.
//   compact     each warp walks its range in order and writes index i to
//               out[#greater before i + min(#equal before i, need)] when it wins,
//               need = k - #greater: ties go to lower indices and the output is ascending, with
//               no sort.
// With TopKParams::histogram_ready, pass 0's histogram is already in the workspace (the vote
// kernel's, VoteParams::top_k_workspace): every block reads it at once, with no pass 0 and no
// first barrier; the keys are still loaded into registers for the passes after it.
// One launch; two grid barriers on the fast path (four on the slow one). The workspace's control
// words (histograms, counters) must be zero at launch: the last block to finish with them
// clears them for the next call, so the caller zeroes the workspace once after allocation.
// Measured on an H200 (bench_kernels_cuda, top-2048 of soft votes, same device call, twelfth
// session): 12.7 / 12.3 / 14.7-15.2 / 19.0-19.5 us at 32K / 128K / 512K / 1M against 16.7 / 17.2 /
// 19.2 / 22.1 us for the previous design (four 8-bit passes over all keys, five barriers, a
// clearing kernel). What made the difference: warps stop at the end of their range (every warp
// walked all 16 register tiles, half of them empty at 512K), plain shared atomics instead of
// __match_any_sync aggregation (19.5 -> 16.5 us at 512K); acquire/release barriers and the
// clearing moved after the compaction came last (not measured apart). The three barriers saved
// counted for less than expected. At 32K the ~12 us are a latency chain of dependent L2 round
// trips and block barriers, not bandwidth.
// Every kernel returns at once when the skip flag is set, leaving the workspace as it was.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/top_k_block.cuh"
#include "kernels/cuda/top_k_digit.cuh"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kRegTiles = 16;  // keys per thread kept in registers
using namespace top_k_block;  // NOLINT: the select's shape, layout and helpers

// Launched cooperatively with at most one block per SM. Block b owns scores[b * chunk, ...),
// warp w of it the w-th of kWarps equal parts (chunk is a multiple of kThreads, so every part is
// whole tiles of 32), lane l the elements begin + l + 32 j: the same elements in every phase, so
// the first kRegTiles tiles' keys are loaded once and stay in registers (every key of n <= ~1M
// on an H200); further tiles (larger n) are read again in each phase. n is a bound when
// device_n is set; k >= the current n (possible only then) writes 0 .. n - 1.
__global__ void __launch_bounds__(kThreads, 1)
    RadixSelectKernel(int32_t* __restrict__ out, const float* __restrict__ scores, int64_t n,
                      DeviceLength device_n, uint32_t k, uint32_t* __restrict__ ws,
                      const int32_t* skip, bool histogram_ready) {
  PdlWait();  // launched as a dependent of the vote (or whatever preceded it)
  if (Skipped(skip)) return;
  n = ResolveLength(device_n, n);
  __shared__ uint32_t hist[kTopBins];
  if (k >= n) {  // the same branch in every block: no barrier is left waiting
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      out[i] = static_cast<int32_t>(i);
    }
    // The vote's histogram, unused, is cleared for the next call.
    if (histogram_ready && blockIdx.x == 0) {
      for (int b = threadIdx.x; b < kTopBins; b += blockDim.x) ws[kHist0 + b] = 0u;
    }
    return;
  }
  __shared__ uint32_t warp_counts[2][kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const BlockSplit split = SplitForBlock(n, warp);  // top_k_block.cuh
  if (blockIdx.x >= split.blocks) return;
  const uint32_t blocks = split.blocks;
  const int64_t block_begin = split.block_begin, begin = split.begin, end = split.end;
  // Register tiles past the warp's range are neither loaded nor visited (a warp-uniform exit:
  // at 512K keys a warp has 8 of the 16 tiles).
  auto key_of = [&](int64_t i) { return OrderedKey(scores[i]); };
  uint32_t reg[kRegTiles];
#pragma unroll
  for (int u = 0; u < kRegTiles; ++u) {
    const int64_t i = begin + 32 * u + lane;
    reg[u] = 0u;
    if (begin + 32 * u < end && i < end) reg[u] = key_of(i);
  }
  // fn(key, index, valid) over the lane's elements in index order, all 32 lanes together (fn
  // may use warp votes).
  auto for_each = [&](auto&& fn) {
#pragma unroll
    for (int u = 0; u < kRegTiles; ++u) {
      if (begin + 32 * u >= end) break;
      const int64_t i = begin + 32 * u + lane;
      fn(reg[u], i, i < end);
    }
    for (int64_t t = begin + 32 * kRegTiles; t < end; t += 32) {
      const int64_t i = t + lane;
      const bool valid = i < end;
      fn(valid ? key_of(i) : 0u, i, valid);
    }
  };
  // One histogram pass over this block's keys that match `prefix` under `mask`: bins of
  // (key >> shift) & (bins - 1) in shared memory, then the non-zero ones into global_hist.
  auto histogram = [&](int bins, int shift, uint32_t mask, uint32_t prefix,
                       uint32_t* global_hist) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for_each([&](uint32_t key, int64_t, bool valid) {
      // Plain shared atomics: with 12-bit bins a warp's keys rarely share one, and a
      // warp-aggregated add (__match_any_sync) measured slower (top-2048 at 512K: 19.5 us
      // against 16.5).
      if (valid && (key & mask) == prefix) {
        atomicAdd(&hist[(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
      }
    });
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
      if (hist[b] != 0) atomicAdd(&global_hist[b], hist[b]);
    }
  };

  uint32_t* barrier = ws + kBarrier;
  uint32_t barriers = 0;
  // Pass 0's histogram: every block's part, or the vote's (complete and visible once the vote,
  // the kernel ahead, has finished: PdlWait).
  if (!histogram_ready) {
    histogram(kTopBins, 32 - kTopBits, 0u, 0u, ws + kHist0);
    GridBarrier(barrier, ++barriers * blocks);
  }
  const Digit top = ChooseDigitGlobal<kTopBins>(ws + kHist0, k);
  uint32_t threshold = top.bin << (32 - kTopBits), need = top.remaining;
  uint32_t mask = ~0u << (32 - kTopBits);  // the bits of threshold fixed so far
  // One 10-bit digit of threshold (at `shift`) found: fix it.
  auto take = [&](const Digit& d, int shift) {
    threshold |= d.bin << shift;
    need = d.remaining;
    mask |= static_cast<uint32_t>(kLowBins - 1) << shift;
  };
  // This thread's part of the keys of earlier blocks above / at threshold (summed over the
  // block before the compaction).
  uint32_t greater_part = 0, equal_part = 0;
  const unsigned below = (1u << lane) - 1u;

  if (top.count <= kMaxCandidates) {  // the same branch in every block
    // Sure winners (top digit above B) per block; the keys in B go to the candidate list.
    const uint32_t top_bin = top.bin;
    uint32_t sure = 0;
    uint2* cand = reinterpret_cast<uint2*>(ws + kCand);
    for_each([&](uint32_t key, int64_t i, bool valid) {
      const uint32_t digit = key >> (32 - kTopBits);
      sure += __popc(__ballot_sync(0xffffffffu, valid && digit > top_bin));
      const bool in_bin = valid && digit == top_bin;
      const uint32_t slot = WarpAppend(in_bin, &ws[kCandCount]);
      if (in_bin) cand[slot] = make_uint2(key, static_cast<uint32_t>(i));
    });
    if (lane == 0) warp_counts[0][warp] = sure;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_counts[0][w];
      ws[kGreater + blockIdx.x] = total;
    }
    GridBarrier(barrier, ++barriers * blocks);
    // The whole list, in every block: entry t + kThreads u is this thread's u-th.
    const int count = static_cast<int>(top.count);
    uint32_t ckey[kCandPerThread];
    uint32_t earlier = 0u;  // bit u: candidate u lies in a block before this one
#pragma unroll
    for (int u = 0; u < kCandPerThread; ++u) {
      if (kThreads * u >= count) break;  // the same in every thread
      const int j = static_cast<int>(threadIdx.x) + kThreads * u;
      ckey[u] = 0u;
      if (j < count) {
        const uint2 c = __ldcg(&cand[j]);
        ckey[u] = c.x;
        if (c.y < block_begin) earlier |= 1u << u;
      }
    }
    // The low 20 bits in two 10-bit passes over the list, in shared memory.
    LowDigitsOfList(&threshold, &mask, &need, ckey, count, kLowBits, hist);
    // Offsets: the sure winners of earlier blocks, and their candidates above / at T.
    for (int b = threadIdx.x; b < static_cast<int>(blockIdx.x); b += kThreads) {
      greater_part += __ldcg(&ws[kGreater + b]);
    }
#pragma unroll
    for (int u = 0; u < kCandPerThread; ++u) {
      if (kThreads * u >= count) break;
      if ((earlier >> u) & 1u) {
        greater_part += ckey[u] > threshold;
        equal_part += ckey[u] == threshold;
      }
    }
  } else {
    // Crowded bin: the low 20 bits by two more passes over every key.
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      const int shift = kLowBits * (1 - pass);
      uint32_t* global_hist = ws + (pass == 0 ? kHist1 : kHist2);
      histogram(kLowBins, shift, mask, threshold, global_hist);
      GridBarrier(barrier, ++barriers * blocks);
      take(ChooseDigitGlobal<kLowBins>(global_hist, need), shift);
    }
  }

  // Per warp, then per block, the keys above and at the threshold.
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
  if (top.count > kMaxCandidates) {
    // Slow path: block totals to the workspace, then the sums of the blocks before this one.
    if (threadIdx.x < 2) {
      uint32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_counts[threadIdx.x][w];
      ws[(threadIdx.x == 0 ? kGreater : kEqual) + blockIdx.x] = total;
    }
    GridBarrier(barrier, ++barriers * blocks);
    for (int b = threadIdx.x; b < static_cast<int>(blockIdx.x); b += blockDim.x) {
      greater_part += __ldcg(&ws[kGreater + b]);
      equal_part += __ldcg(&ws[kEqual + b]);
    }
  }
  const uint32_t greater_before_block = BlockSum(greater_part);
  const uint32_t equal_before_block = BlockSum(equal_part);
  // Only the compaction is left: the kernel after this one may launch (a programmatic dependent
  // waits for this grid's end before it reads the picks; every block of this cooperative grid is
  // resident already).
  PdlAllowDependents();
  // This block is done with the control words (every block has passed every barrier and read
  // every histogram by now; BlockSum's barriers completed this block's reads): the last block to
  // arrive clears them for the next call, after its compaction, so that the atomic's round trip
  // overlaps the compaction.
  uint32_t arrived = 0;
  if (threadIdx.x == 0) arrived = atomicAdd(&ws[kDone], 1u);

  uint32_t greater_run = greater_before_block, equal_run = equal_before_block;
  for (int w = 0; w < warp; ++w) {
    greater_run += warp_counts[0][w];
    equal_run += warp_counts[1][w];
  }
  // Compact: index i goes to out[#greater before i + min(#equal before i, need)] when it wins.
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
  __shared__ bool last;
  if (threadIdx.x == 0) last = arrived == blocks - 1;
  __syncthreads();
  if (last) {
    for (int w = threadIdx.x; w < kControlWords; w += blockDim.x) ws[w] = 0u;
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
  // The histograms are read as 16-byte vectors.
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t k = std::min(p.k, p.n);
  if (k == 0) {
    // The vote's histogram, unused, is cleared for the next call (a set skip flag means the
    // vote added nothing: zeros over zeros).
    if (p.histogram_ready) {
      return cudaMemsetAsync(static_cast<uint32_t*>(p.workspace) + kHist0, 0,
                             kTopBins * sizeof(uint32_t), stream);
    }
    return cudaSuccess;
  }
  if (k == p.n && p.device_n.count == nullptr && !p.histogram_ready) {
    const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, 4096);
    IotaKernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(p.out, p.n, p.skip);
    return cudaGetLastError();
  }
  // One block per SM at most: the grid barriers need every block resident (the cooperative
  // launch checks that).
  int device = 0, sms = 0;
  TS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = LaunchBlocks(p.n, sms);
  uint32_t* ws = static_cast<uint32_t*>(p.workspace);
  int32_t* out = p.out;
  const float* scores = p.scores;
  int64_t n = p.n;
  DeviceLength device_n = p.device_n;
  uint32_t kk = static_cast<uint32_t>(k);
  const int32_t* skip = p.skip;
  bool ready = p.histogram_ready;
  return LaunchPdl(RadixSelectKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                   stream, /*cooperative=*/true, out, scores, n, device_n, kk, ws, skip, ready);
}

}  // namespace tokenselect::kernels::cuda
