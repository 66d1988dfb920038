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
#include "kernels/cuda/candidate_vote.cuh"
#include "kernels/cuda/top_k_digit.cuh"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;
constexpr int64_t kMinPerBlock = 2048;
constexpr int kRegTiles = 16;  // keys per thread kept in registers
using top_k_digit::kTopBits;  // pass 0's digit; then two of kLowBits
using top_k_digit::kTopBins;
constexpr int kLowBits = 10;
constexpr int kLowBins = 1 << kLowBits;
constexpr int kCandPerThread = 16;
constexpr int kMaxCandidates = kThreads * kCandPerThread;

// Workspace layout (uint32 words). Words [0, kControlWords) are zero at launch and cleared
// again by the last block.
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

__device__ __forceinline__ uint32_t BlockSum(uint32_t value) {
  uint32_t unused;
  return BlockExclusiveScan(value, &unused);
}

// Every block taking part arrives before any leaves. `target` = their number * (barriers so
// far, this one included); the counter starts at zero. Thread 0 arrives with a release add and
// spins with acquire loads (gpu scope), which with the block barriers around them make each
// block's global writes before the barrier visible to every block after it (release is
// cumulative over what the block barrier ordered before it); no full fences.
__device__ __forceinline__ void GridBarrier(uint32_t* counter, uint32_t target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    uint32_t seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

// The skip flag (selection.h): every kernel returns at once when it is set.
__device__ __forceinline__ bool Skipped(const int32_t* skip) {
  return skip != nullptr && *skip != 0;
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

// One block's top k of a short list (k <= count): the k best of scores[0, count) by the kernel's
// rule, written as index_map[i] in order of i. The three digits by shared-memory histograms
// (hist: kTopBins words), then the compaction a block-wide chunk at a time. The screen's last
// step (its candidates' votes, after a grid barrier): one launch fewer than a TopK call.
__device__ void SelectFromList(const float* scores, const int32_t* index_map, uint32_t count,
                               uint32_t k, int32_t* out, uint32_t* hist) {
  uint32_t threshold = 0u, mask = 0u, need = k;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 32 - kTopBits : (pass == 1 ? kLowBits : 0);
    const int bins = pass == 0 ? kTopBins : kLowBins;
    for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0u;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < count; i += blockDim.x) {
      const uint32_t key = OrderedKey(__ldcg(scores + i));
      if ((key & mask) == threshold) {
        atomicAdd(&hist[(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
      }
    }
    __syncthreads();
    auto count_of = [&](int b) { return hist[b]; };
    const Digit d = pass == 0 ? ChooseDigit<kTopBins>(count_of, need)
                              : ChooseDigit<kLowBins>(count_of, need);
    threshold |= d.bin << shift;
    need = d.remaining;
    mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
  uint32_t greater_run = 0u, equal_run = 0u;
  for (uint32_t base = 0; base < count; base += blockDim.x) {
    const uint32_t i = base + threadIdx.x;
    const uint32_t key = i < count ? OrderedKey(__ldcg(scores + i)) : 0u;
    const bool is_greater = i < count && key > threshold;
    const bool is_equal = i < count && key == threshold;
    uint32_t greater_before, equal_before;
    const uint32_t greater_total = BlockExclusiveScan(is_greater ? 1u : 0u, &greater_before);
    const uint32_t equal_total = BlockExclusiveScan(is_equal ? 1u : 0u, &equal_before);
    greater_before += greater_run;
    equal_before += equal_run;
    if (is_greater || (is_equal && equal_before < need)) {
      out[greater_before + min(equal_before, need)] = index_map[i];
    }
    greater_run += greater_total;
    equal_run += equal_total;
  }
}

// Launched cooperatively with at most one block per SM. Block b owns scores[b * chunk, ...),
// warp w of it the w-th of kWarps equal parts (chunk is a multiple of kThreads, so every part is
// whole tiles of 32), lane l the elements begin + l + 32 j: the same elements in every phase, so
// the first kRegTiles tiles' keys are loaded once and stay in registers (every key of n <= ~1M
// on an H200); further tiles (larger n) are read again in each phase. n is a bound when
// device_n is set; k >= the current n (possible only then) writes 0 .. n - 1.
template <bool kScreen>
__global__ void __launch_bounds__(kThreads, 1)
    RadixSelectKernel(int32_t* __restrict__ out, const float* __restrict__ scores, int64_t n,
                      DeviceLength device_n, uint32_t k, uint32_t* __restrict__ ws,
                      const int32_t* skip, bool histogram_ready, TopKParams::Screen screen) {
  PdlWait();  // launched as a dependent of the vote (or whatever preceded it)
  if (Skipped(skip)) return;
  n = ResolveLength(device_n, n);
  __shared__ uint32_t hist[kTopBins];
  // Screen mode: the query staged for candidate_vote::SoftVote and the heads' statistics,
  // before the passes (the scoring after the compaction waits for neither).
  __shared__ float4 sm_q[kScreen ? candidate_vote::kQueryVecs : 1];
  __shared__ float sm_m[32], sm_inv[32];
  if constexpr (kScreen) {
    candidate_vote::DispatchShape(
        screen.keys.kv_type == KvCacheType::kFp8E4M3, screen.keys.num_kv_heads,
        [&](auto, auto kv_heads) {
          constexpr int kKv = decltype(kv_heads)::value;
          candidate_vote::StageQuery<kKv>(sm_q, screen.keys.query, threadIdx.x, blockDim.x);
        });
    if (threadIdx.x < screen.keys.num_heads) {
      sm_m[threadIdx.x] = __ldcg(screen.keys.head_max + threadIdx.x);
      sm_inv[threadIdx.x] = __ldcg(screen.keys.head_inv_sum + threadIdx.x);
    }
  }
  // Screen mode: this block's warps score candidates first, first + step, ... below `end`
  // (slot(c) their cache slots, visible to the block: the caller synchronised).
  auto score_candidates = [&](int64_t first, int64_t step, int64_t end, auto&& slot) {
    if constexpr (kScreen) {
      __syncthreads();  // the staged query
      candidate_vote::DispatchShape(
          screen.keys.kv_type == KvCacheType::kFp8E4M3, screen.keys.num_kv_heads,
          [&](auto fp8, auto kv_heads) {
            constexpr bool kFp8 = decltype(fp8)::value;
            constexpr int kKv = decltype(kv_heads)::value;
            for (int64_t c = first; c < end; c += step) {
              const float v = candidate_vote::SoftVote<kFp8, kKv>(
                  sm_q, sm_m, sm_inv, screen.keys.k_cache, screen.keys.k_scale, slot(c), screen.keys.scale);
              if ((threadIdx.x & 31) == 0) screen.cand_vote[c] = v;
            }
          });
    }
  };
  // The key row of a candidate-to-be into L2 (sm_90: one bulk prefetch; before, 128-byte line
  // prefetches), so that its scoring after the list is complete finds it there.
  const int64_t row_bytes =
      screen.keys.num_kv_heads * candidate_vote::kD * (screen.keys.kv_type == KvCacheType::kFp8E4M3 ? 1 : 2);
  auto prefetch_row = [&](int64_t i) {
    const char* row = static_cast<const char*>(screen.keys.k_cache) + screen.keys.slots[i] * row_bytes;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row),
                 "r"(static_cast<uint32_t>(row_bytes))
                 : "memory");
#else
    for (int64_t b = 0; b < row_bytes; b += 128) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
    }
#endif
  };
  if (k >= n) {  // the same branch in every block: no barrier is left waiting
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      out[i] = static_cast<int32_t>(i);  // in screen mode every candidate is a pick
      if constexpr (kScreen) {
        screen.cand_index[i] = static_cast<int32_t>(i);
        screen.cand_slots[i] = screen.keys.slots[i];
      }
    }
    if (kScreen && blockIdx.x == 0 && threadIdx.x == 0) {
      *screen.count = static_cast<int32_t>(n);
    }
    // Every token is a candidate: the grid's warps score them all, from the slots given.
    score_candidates(static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5),
                     static_cast<int64_t>(gridDim.x) * kWarps, n,
                     [&](int64_t c) { return screen.keys.slots[c]; });
    // The vote's histogram, unused, is cleared for the next call.
    if (histogram_ready && blockIdx.x == 0) {
      for (int b = threadIdx.x; b < kTopBins; b += blockDim.x) ws[kHist0 + b] = 0u;
    }
    return;
  }
  __shared__ uint32_t warp_counts[2][kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // With device_n the launch was planned for the bound: only the blocks the current n needs
  // (the launcher's rule) take part, the others leave now (a short candidate list under a long
  // bound then waits on two blocks' barriers instead of one per SM).
  const uint32_t blocks = static_cast<uint32_t>(min(
      static_cast<int64_t>(gridDim.x), max(int64_t{1}, (n + kMinPerBlock - 1) / kMinPerBlock)));
  if (blockIdx.x >= blocks) return;
  int64_t chunk = (n + blocks - 1) / blocks;
  chunk = (chunk + kThreads - 1) / kThreads * kThreads;
  const int64_t block_begin = blockIdx.x * chunk;
  const int64_t part = chunk / kWarps;
  const int64_t begin = min(n, block_begin + warp * part);
  const int64_t end = min(n, begin + part);
  // Register tiles past the warp's range are neither loaded nor visited (a warp-uniform exit:
  // at 512K keys a warp has 8 of the 16 tiles).
  // Screen mode: the keys are the lower bounds of the exact votes, and each element's upper
  // bound is kept beside it: with inv_a[h] = 1 / a_h, the top term e of head h and the rest
  // r = bound - e, the exact vote lies in [e inv_a[h] + r min(inv_a), e inv_a[h] + r max(inv_a)]
  // (widened by 1e-4 for rounding). Statistics that are not finite, or a token whose bound or
  // top term is not (a term exp(l - C_h) past the fp32 range: a head the sample underestimated
  // by ~88 nats), give the trivial bounds [0, largest key]: every such token a candidate, none
  // raising T.
  __shared__ float inv_a[32];
  __shared__ bool usable;
  float inv_lo = 0.0f, inv_hi = 0.0f;
  if constexpr (kScreen) {
    if (threadIdx.x < 32) {
      const int h = threadIdx.x;
      float v = 1.0f;
      if (h < screen.keys.num_heads) {
        const float exact = __ldcg(screen.keys.head_max + h) - logf(__ldcg(screen.keys.head_inv_sum + h));
        const float provisional =
            __ldcg(screen.sample_max + h) - logf(__ldcg(screen.sample_inv_sum + h));
        v = expf(provisional - exact);
      }
      inv_a[h] = v;
      const bool ok = __all_sync(0xffffffffu, isfinite(v) && v > 0.0f);
      if (h == 0) usable = ok;
    }
    __syncthreads();
    inv_lo = INFINITY;
    inv_hi = 0.0f;
    for (int h = 0; h < screen.keys.num_heads; ++h) {
      inv_lo = fminf(inv_lo, inv_a[h]);
      inv_hi = fmaxf(inv_hi, inv_a[h]);
    }
  }
  auto key_of = [&](int64_t i, uint32_t* upper) {
    if constexpr (kScreen) {
      const float v = scores[i];
      const uint32_t top = screen.top_term[i];
      const float e = __uint_as_float(top & ~31u);
      if (!usable || !isfinite(v) || !isfinite(e)) {  // no bounds: a candidate, T not raised
        *upper = ~0u;
        return OrderedKey(0.0f);
      }
      const float sure = e * inv_a[top & 31u];
      const float rest = fmaxf(v - e, 0.0f);
      *upper = OrderedKey((sure + rest * inv_hi) * (1.0f + 1e-4f));
      return OrderedKey((sure + rest * inv_lo) * (1.0f - 1e-4f));
    } else {
      return OrderedKey(scores[i]);
    }
  };
  uint32_t reg[kRegTiles];
  // Screen mode: the upper bounds beside the keys, their top 16 bits rounded up (a bound still),
  // two per register (the full 32 bits spilled).
  uint32_t reg_upper[kScreen ? kRegTiles / 2 : 1] = {};
#pragma unroll
  for (int u = 0; u < kRegTiles; ++u) {
    const int64_t i = begin + 32 * u + lane;
    reg[u] = 0u;
    uint32_t upper = 0u;
    if (begin + 32 * u < end && i < end) reg[u] = key_of(i, &upper);
    if constexpr (kScreen) {
      const uint32_t high = upper >= 0xffff0000u ? 0xffffu : (upper + 0xffffu) >> 16;
      reg_upper[u / 2] |= high << (16 * (u % 2));
    }
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
      uint32_t unused;
      fn(valid ? key_of(i, &unused) : 0u, i, valid);
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
      const unsigned in_bin = __ballot_sync(0xffffffffu, valid && digit == top_bin);
      if (in_bin != 0u) {
        uint32_t slot = 0;
        if (lane == __ffs(in_bin) - 1) slot = atomicAdd(&ws[kCandCount], __popc(in_bin));
        slot = __shfl_sync(0xffffffffu, slot, __ffs(in_bin) - 1);
        if ((in_bin >> lane) & 1u) {
          cand[slot + __popc(in_bin & below)] = make_uint2(key, static_cast<uint32_t>(i));
        }
      }
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
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int shift = kLowBits * (1 - pass);
      for (int b = threadIdx.x; b < kLowBins; b += blockDim.x) hist[b] = 0;
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kCandPerThread; ++u) {
        if (kThreads * u >= count) break;
        const int j = static_cast<int>(threadIdx.x) + kThreads * u;
        if (j < count && (ckey[u] & mask) == threshold) {
          atomicAdd(&hist[(ckey[u] >> shift) & (kLowBins - 1)], 1u);
        }
      }
      __syncthreads();
      take(ChooseDigit<kLowBins>([&](int b) { return hist[b]; }, need), shift);
    }
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

  if constexpr (kScreen) {  // every index whose upper bound reaches T, in index order
    // fn(upper, index, valid) as for_each: the register tiles' upper bounds were kept beside
    // their keys, further ones are computed again.
    auto for_each_upper = [&](auto&& fn) {
#pragma unroll
      for (int u = 0; u < kRegTiles; ++u) {
        if (begin + 32 * u >= end) break;
        const int64_t i = begin + 32 * u + lane;
        fn(((reg_upper[u / 2] >> (16 * (u % 2))) & 0xffffu) << 16, i, i < end);
      }
      for (int64_t t = begin + 32 * kRegTiles; t < end; t += 32) {
        const int64_t i = t + lane;
        uint32_t upper = 0u;
        if (i < end) key_of(i, &upper);
        fn(upper, i, i < end);
      }
    };
    const uint32_t cut = threshold;
    uint32_t passed = 0;
    for_each_upper([&](uint32_t key, int64_t i, bool valid) {
      const bool pass = valid && key >= cut;
      passed += __popc(__ballot_sync(0xffffffffu, pass));
      if (pass) prefetch_row(i);
    });
    if (lane == 0) warp_counts[0][warp] = passed;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_counts[0][w];
      ws[kEqual + blockIdx.x] = total;  // unused on either path before this point
    }
    GridBarrier(barrier, ++barriers * blocks);
    uint32_t before_part = 0, all_part = 0;
    for (int b = threadIdx.x; b < static_cast<int>(blocks); b += kThreads) {
      const uint32_t c = __ldcg(&ws[kEqual + b]);
      if (b < static_cast<int>(blockIdx.x)) before_part += c;
      all_part += c;
    }
    uint32_t run = BlockSum(before_part);
    const uint32_t block_first = run;
    const uint32_t total = BlockSum(all_part);
    PdlAllowDependents();
    for (int w = 0; w < warp; ++w) run += warp_counts[0][w];
    for_each_upper([&](uint32_t key, int64_t i, bool valid) {
      const bool pass = valid && key >= cut;
      const unsigned pass_mask = __ballot_sync(0xffffffffu, pass);
      if (pass) {
        const uint32_t at = run + __popc(pass_mask & below);
        screen.cand_index[at] = static_cast<int32_t>(i);
        screen.cand_slots[at] = screen.keys.slots[i];
      }
      run += __popc(pass_mask);
    });
    if (blockIdx.x == 0 && threadIdx.x == 0) *screen.count = static_cast<int32_t>(total);
    // This block's candidates, [block_first, block_first + block_count) of the list, scored
    // by its warps (no grid barrier: the block wrote them).
    uint32_t block_count = 0;
    for (int w = 0; w < kWarps; ++w) block_count += warp_counts[0][w];
    __syncthreads();  // the list entries written above are visible to the block
    score_candidates(block_first + warp, kWarps, block_first + block_count,
                     [&](int64_t c) { return screen.cand_slots[c]; });
    // The picks: a grid barrier (every candidate's vote is written), then block 0.
    GridBarrier(barrier, ++barriers * blocks);
    if (blockIdx.x == 0) SelectFromList(screen.cand_vote, screen.cand_index, total, k, out, hist);
    uint32_t arrived = 0;
    if (threadIdx.x == 0) arrived = atomicAdd(&ws[kDone], 1u);
    __shared__ bool screen_last;
    if (threadIdx.x == 0) screen_last = arrived == blocks - 1;
    __syncthreads();
    if (screen_last) {
      for (int w = threadIdx.x; w < kControlWords; w += blockDim.x) ws[w] = 0u;
    }
    return;
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
  // Screen mode: BoundVoteSelect's second launch (its arrays and a tensor-core shape).
  const bool screening = p.screen.cand_index != nullptr;
  if (screening) {
    const TopKParams::Screen& sc = p.screen;
    const KeyScoreParams& keys = sc.keys;
    if (k == 0 || p.out == nullptr || sc.cand_slots == nullptr || sc.count == nullptr ||
        sc.cand_vote == nullptr || sc.top_term == nullptr || sc.sample_max == nullptr ||
        sc.sample_inv_sum == nullptr || keys.slots == nullptr || keys.head_max == nullptr ||
        keys.head_inv_sum == nullptr || keys.query == nullptr || keys.k_cache == nullptr ||
        reinterpret_cast<uintptr_t>(keys.query) % 16 != 0 ||
        !BoundVoteSupported(keys.num_heads, keys.num_kv_heads, keys.head_dim) ||
        (keys.kv_type == KvCacheType::kFp8E4M3 && keys.k_scale == nullptr)) {
      return cudaErrorInvalidValue;
    }
  }
  if (k == 0) {
    // The vote's histogram, unused, is cleared for the next call (a set skip flag means the
    // vote added nothing: zeros over zeros).
    if (p.histogram_ready) {
      return cudaMemsetAsync(static_cast<uint32_t*>(p.workspace) + kHist0, 0,
                             kTopBins * sizeof(uint32_t), stream);
    }
    return cudaSuccess;
  }
  if (k == p.n && p.device_n.count == nullptr && !p.histogram_ready && !screening) {
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
  int32_t* out = p.out;
  const float* scores = p.scores;
  int64_t n = p.n;
  DeviceLength device_n = p.device_n;
  uint32_t kk = static_cast<uint32_t>(k);
  const int32_t* skip = p.skip;
  bool ready = p.histogram_ready;
  TopKParams::Screen screen = p.screen;
  return LaunchPdl(screening ? RadixSelectKernel<true> : RadixSelectKernel<false>,
                   dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                   /*cooperative=*/true, out, scores, n, device_n, kk, ws, skip, ready, screen);
}

}  // namespace tokenselect::kernels::cuda
