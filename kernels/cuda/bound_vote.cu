// BoundVoteSelect (selection.h): the bound-vote selection's two launches over one workspace,
// ScoreKeys in bound mode and then the screen below.
//
// The screen: one cooperative launch of kThreads-thread blocks, at most one per SM, over the
// TopK workspace's layout and helpers (top_k_block.cuh). Block b owns tokens [b chunk,
// (b + 1) chunk), warp w the w-th of kWarps equal parts of that (begin, end), lane l the tokens
// begin + 32 u + l (tile u).
//   load   the warp's first kTiles tiles' vote bounds and top terms (ScoreKeys' vote_bound /
//          vote_top) into shared memory by 16-byte cp.async, one round trip (every token of
//          1M on an H100); tokens past them are read from global memory in each pass.
//   T      each token's lower and upper bound of its exact vote (see `bounds`) is computed
//          where a pass needs it. Pass 0: the lower bounds' first-digit histogram over the grid
//          (FirstBin: 4096 bins 3% of a value wide; a grid barrier), and each tile's ceiling
//          (its largest vote bound times max(inv_a)), which lets later passes skip the tiles
//          that cannot hold what they look for. The chosen bin B (where the count from the top
//          reaches k): with at most kEdgeMaxInBin keys in it, T is B's lower edge (at most 3%
//          below the k-th largest lower bound: a few more candidates, no further pass); else
//          TopK's way, B's keys listed (a second grid barrier) and two 10-bit passes over the
//          list in every block, or with more than kMaxCandidates of them two grid-wide passes.
//   list   every token whose upper bound reaches T (a superset of the exact top k, ties
//          included): a counting pass, then the block's candidates in index order at the start
//          of its own range of cand_index / cand_slots (ranges are disjoint: no grid barrier),
//          their key rows prefetched into L2 and their slots kept in shared memory. Then the
//          warp discards its bounds' lines from L2 (the scoring stored them evict_last: they
//          are never written back to DRAM; l2_policy.cuh).
//   score  the block's warps score its candidates (candidate_vote.cuh) into cand_vote.
//   pick   every block arrives at a last grid counter; all but the last to arrive leave. That
//          one (the picker) gathers the candidates in index order (shared memory for the first
//          kGather, then the bound arrays, read by now), writes the top k of their votes as
//          token indices (ascending; PickFromList) and clears the workspace's control words.
// Measured (thirtieth session, H100, 1M tokens, k 2048, per-phase %globaltimer stamps in a
// scratch build): the first version, inside TopK's kernel with the bounds in registers
// (16 tiles unrolled in every pass), took 58.7 us after the scoring: 13 us for block 0's pick
// (its three passes and compaction read the list from global memory), 8-11 us to load the
// bounds, a grid barrier and block scans to place the list. This one takes ~33 us: its load
// 3 us (the query, 16 KB that every block reads, is staged after the bounds have arrived:
// staged beside them it took the load to 5.4 us), pass 0 4.7 us, the list 3.7 us, the
// scoring 4-6 us (the slowest block sets the barrier), the pick 7 us with its gather; the
// selection went from 0.8016 to 0.7754-0.7768 ms. The edge: TopK's 12-bit first digit (bins
// 12.5% wide) gave the same speed, but on loose bounds (the test's FP8 keys) 4K-39K
// candidates of 40K against 3-5K with an exact T; with 3% bins 5-14K. An 8192-bin digit cost
// 1.5 us. Tried and dropped (no gain measured, same device
// call): the bounds stored with an L2 evict_last policy (the scoring 2 us slower, the chain
// within 1 us); four copies of pass 0's histogram against same-word atomics; the pick's first
// digit from every block's histogram of its votes (global atomics) instead of its own pass;
// warp-aggregated (__match_any_sync) atomics in the pick (slower).
// Thirty-first session (H100, clock64 stamps in block 0, scratch build; 1M, 2257 candidates):
// after the last grid barrier the offsets took 0.9 us, the gather 3.2, the pick's first digit
// 3.3, its next two digits and compaction ~4: latency-bound code run once. Ranking the chosen
// bin's keys directly (a few dozen in a 3%-wide bin) instead of two more radix passes, and
// one scan instead of two for the compaction: the selection 0.7768 -> 0.7760 ms at 1M, 0.4178
// -> 0.4173 at 512K (medians of 8 runs alternating in one call). Tried and dropped: the held
// list's keys in registers with every pass unrolled over 16 slots (0.7811 against 0.7758 ms:
// its first digit 5 us, the rank 5 us), ChooseDigit's shared-memory counts read as 16-byte
// vectors (0.7771 against 0.7760).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/candidate_vote.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_length.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/l2_policy.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/top_k_block.cuh"
#include "kernels/cuda/top_k_digit.cuh"

namespace tokenselect::kernels::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t Round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

using namespace top_k_block;  // NOLINT: the radix select's shape, layout and helpers
using top_k_digit::OrderedKey;

constexpr int kTiles = 16;                 // tiles of 32 tokens per warp in shared memory
constexpr int kTileWords = kTiles * kThreads;
constexpr int kGather = kTileWords;        // the pick: candidates kept in shared memory
constexpr uint32_t kEdgeMaxInBin = 2048;   // T at the chosen bin's edge up to so many keys in it
// The lower bounds' digits. A lower bound is a float in [0, 32] (a soft vote sums at most 32
// heads' probabilities), its key the float's bits: the first digit is bits 30..18 (8 exponent
// and 5 mantissa bits, a bin 3% of a value wide) less kFirstBase, clamped to TopK's kTopBins
// bins (bin 4094 holds [32, 33); bin 0 everything below 2^-123), then two 10-bit digits at bits
// 8 and 0 (the second overlaps the first's low 2 bits, fixed by then).
constexpr int kFirstShift = 18;
constexpr int kFirstBase = 130;
constexpr int kSecondShift = 8;  // then 0
__device__ __forceinline__ uint32_t FirstBin(uint32_t key) {
  return static_cast<uint32_t>(
      min(max(static_cast<int>(key >> kFirstShift) - kFirstBase, 0), kTopBins - 1));
}
constexpr int kBlockSlots = 1024;          // a block's candidates' slots kept in shared memory
constexpr int kPrefetchRows = 8;           // a warp's candidates' rows prefetched into L1
// The dynamic shared memory: the tiles' vote bounds and top terms (warp w's tiles at
// w kTiles 32 + 32 u + lane: conflict-free); later the picker's gathered votes and indices.
constexpr size_t kDynamicBytes = 2 * kTileWords * sizeof(uint32_t);

struct ScreenArgs {
  int32_t* out;            // [min(k, n)] the picks
  uint32_t k;
  // The bound-mode ScoreKeys call ahead: the inputs (n, a bound when device_n is set; skip; the
  // shape), its outputs' places in `work`.
  KeyScoreParams keys;
  // top_k_workspace: the radix select's words; bound / top_term: read, then the picker's spill
  // space; the candidates, their count, the sample's statistics.
  BoundVoteWorkspace work;
  bool list_candidates;    // BoundVoteParams::list_candidates
};

// This thread's cp.async copies committed and waited for (cp_async.cuh).
__device__ __forceinline__ void CpAsyncWaitAll() {
  CpAsyncCommit();
  CpAsyncWait<0>();
}

__device__ __forceinline__ void PrefetchL1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// The key row of a candidate-to-be into L2 (sm_90: one bulk prefetch; before, 128-byte line
// prefetches), so that its scoring finds it there.
__device__ __forceinline__ void PrefetchRow(const char* row, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row),
               "r"(static_cast<uint32_t>(bytes))
               : "memory");
#else
  for (int64_t b = 0; b < bytes; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
#endif
}

// The picker's pick (after every block's candidates are scored): the top k of `total` candidates,
// vote_of(j) / index_of(j) for the j-th in index order, as TopK picks (OrderedKey, ties to
// lower j), written to out ascending. hist: kTopBins words of 8-byte aligned shared memory.
// The k-th largest is found by its RankKey (the key, then the lower j): a first digit of
// PickBin's 3%-wide bins, then, with at most kRankMax keys in the chosen bin, each of them
// ranked against the others directly (one round: no further passes); else TopK's three radix
// passes (12, 10 and 10 bits) and a scan for the cut among equal keys. Then one compaction.
constexpr uint32_t kRankMax = kThreads;
__device__ __forceinline__ uint32_t PickBin(uint32_t key) {  // monotone in key
  return key < 0x80000000u ? 0u : FirstBin(key & 0x7fffffffu);  // NaN and negatives in bin 0
}
__device__ __forceinline__ uint64_t RankKey(uint32_t key, uint32_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - j);
}

template <class VoteOf, class IndexOf>
__device__ void PickFromList(VoteOf vote_of, IndexOf index_of, uint32_t total, uint32_t k,
                             int32_t* out, uint32_t* hist) {
  __shared__ uint64_t cut;  // the k-th largest RankKey: the picks are those at or above it
  __shared__ uint32_t listed;
  const int lane = threadIdx.x & 31;
  // Thread t's share of the list for the scans: [first, last).
  const uint32_t per = (total + blockDim.x - 1) / blockDim.x;
  const uint32_t first = min(total, threadIdx.x * per), last = min(total, first + per);
  for (int b = threadIdx.x; b < kTopBins; b += blockDim.x) hist[b] = 0u;
  if (threadIdx.x == 0) {
    listed = 0u;
    cut = 0u;  // every candidate (unreachable: the list holds at least k)
  }
  __syncthreads();
#pragma unroll 1
  for (uint32_t j = threadIdx.x; j < total; j += blockDim.x) {
    atomicAdd(&hist[PickBin(OrderedKey(vote_of(j)))], 1u);
  }
  __syncthreads();
  const Digit top = ChooseDigit<kTopBins>([&](int b) { return hist[b]; }, k);
  if (top.count <= kRankMax) {
    // The chosen bin's keys listed (hist is free: ChooseDigit's barriers), then ranked.
    uint64_t* const member = reinterpret_cast<uint64_t*>(hist);
#pragma unroll 1
    for (uint32_t j0 = threadIdx.x - lane; j0 < total; j0 += blockDim.x) {  // warp-uniform
      const uint32_t j = j0 + lane;
      const uint32_t key = j < total ? OrderedKey(vote_of(j)) : 0u;
      const bool in = j < total && PickBin(key) == top.bin;
      const uint32_t slot = WarpAppend(in, &listed);
      if (in) member[slot] = RankKey(key, j);
    }
    __syncthreads();
    if (threadIdx.x < top.count) {
      const uint64_t mine = member[threadIdx.x];
      uint32_t above = 0;
#pragma unroll 4
      for (uint32_t e = 0; e < top.count; ++e) above += member[e] > mine;
      if (above == top.remaining - 1) cut = mine;  // exactly one: the pairs are distinct
    }
  } else {
    // Crowded: TopK's three radix passes give the k-th largest key and how many keys equal to
    // it win; the cut is the last of those in list order.
    uint32_t threshold = 0u, mask = 0u, need = k;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = pass == 0 ? 32 - kTopBits : (pass == 1 ? kLowBits : 0);
      const int bins = pass == 0 ? kTopBins : kLowBins;
      for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0u;
      __syncthreads();
#pragma unroll 1
      for (uint32_t j = threadIdx.x; j < total; j += blockDim.x) {
        const uint32_t key = OrderedKey(vote_of(j));
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
    uint32_t equal = 0u;
#pragma unroll 1
    for (uint32_t j = first; j < last; ++j) equal += OrderedKey(vote_of(j)) == threshold;
    uint32_t before;
    BlockExclusiveScan(equal, &before);
    if (before < need && need <= before + equal) {
#pragma unroll 1
      for (uint32_t j = first; j < last; ++j) {
        if (OrderedKey(vote_of(j)) == threshold && ++before == need) cut = RankKey(threshold, j);
      }
    }
  }
  __syncthreads();
  // Thread t compacts its share: one scan of its picks.
  const uint64_t c = cut;
  uint32_t picks = 0u;
#pragma unroll 1
  for (uint32_t j = first; j < last; ++j) picks += RankKey(OrderedKey(vote_of(j)), j) >= c;
  uint32_t at;
  BlockExclusiveScan(picks, &at);
#pragma unroll 1
  for (uint32_t j = first; j < last; ++j) {
    if (RankKey(OrderedKey(vote_of(j)), j) >= c) out[at++] = index_of(j);
  }
}

__global__ void __launch_bounds__(kThreads, 1) ScreenKernel(ScreenArgs a) {
  PdlWait();  // launched as a dependent of the bound-mode scoring
  const KeyScoreParams& keys = a.keys;
  const BoundVoteWorkspace& work = a.work;
  if (Skipped(keys.skip)) return;
  const int64_t n = ResolveLength(keys.device_n, keys.n);
  const uint32_t k = a.k;
  extern __shared__ uint32_t tile_words[];
  uint32_t* const tile_vote = tile_words;             // vote bounds (float bits)
  uint32_t* const tile_top = tile_words + kTileWords;  // top terms
  __shared__ __align__(8) uint32_t hist[kTopBins];  // 8-byte aligned: the pick's ranks
  __shared__ float4 sm_q[candidate_vote::kQueryVecs];
  __shared__ float sm_m[32], sm_inv[32];
  const bool fp8 = keys.kv_type == KvCacheType::kFp8E4M3;
  // The query and the heads' statistics for candidate_vote::SoftVote (the caller of
  // score_candidates waits for the copies and synchronises the block first).
  auto stage = [&] {
    candidate_vote::DispatchShape(fp8, keys.num_kv_heads, [&](auto, auto kv_heads) {
      constexpr int kKv = decltype(kv_heads)::value;
      candidate_vote::StageQuery<kKv>(sm_q, keys.query, threadIdx.x, blockDim.x);
    });
    if (threadIdx.x < keys.num_heads) {
      sm_m[threadIdx.x] = __ldcg(keys.head_max + threadIdx.x);
      sm_inv[threadIdx.x] = __ldcg(keys.head_inv_sum + threadIdx.x);
    }
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // This block's warps score candidates first, first + step, ... below `end` (slot(c) their
  // cache slots, vote(c, v) takes the vote; the caller synchronised the block).
  auto score_candidates = [&](int64_t first, int64_t step, int64_t end, auto&& slot,
                              auto&& vote) {
    candidate_vote::DispatchShape(fp8, keys.num_kv_heads, [&](auto fp8_tag, auto kv_heads) {
      constexpr bool kFp8 = decltype(fp8_tag)::value;
      constexpr int kKv = decltype(kv_heads)::value;
      // The warp's first few rows into L1 at once (their loads overlap instead of following
      // one another).
      constexpr int64_t kRowBytes = candidate_vote::RowBytes(kFp8, kKv);
#pragma unroll 1
      for (int64_t c = first; c < end && c < first + kPrefetchRows * step; c += step) {
        const char* row = static_cast<const char*>(keys.k_cache) + slot(c) * kRowBytes;
        for (int64_t b = 128 * lane; b < kRowBytes; b += 32 * 128) PrefetchL1(row + b);
      }
#pragma unroll 1
      for (int64_t c = first; c < end; c += step) {
        const float v = candidate_vote::SoftVote<kFp8, kKv>(sm_q, sm_m, sm_inv, keys.k_cache,
                                                            keys.k_scale, slot(c), keys.scale);
        if (lane == 0) vote(c, v);
      }
    });
  };
  // The bounds' 128-byte lines of tokens [first, last) (first a multiple of 32), this thread
  // taking lines at, at + step, ...: dropped from L2 unwritten (l2_policy.cuh). Each is read
  // by the block that drops it, before.
  auto discard_bounds = [&](int64_t first, int64_t last, int64_t at, int64_t step) {
    for (int64_t t = first + 32 * at; t < last; t += 32 * step) {
      DiscardL2Line(work.bound + t);
      DiscardL2Line(work.top_term + t);
    }
  };
  if (k >= n) {  // the same branch in every block: every token is a candidate and a pick
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      a.out[i] = static_cast<int32_t>(i);
      work.cand_index[i] = static_cast<int32_t>(i);
      work.cand_slots[i] = keys.slots[i];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *work.count = static_cast<int32_t>(n);
    discard_bounds(0, n, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                   static_cast<int64_t>(gridDim.x) * blockDim.x);
    stage();
    CpAsyncWaitAll();
    __syncthreads();
    score_candidates(static_cast<int64_t>(blockIdx.x) * kWarps + warp,
                     static_cast<int64_t>(gridDim.x) * kWarps, n,
                     [&](int64_t c) { return keys.slots[c]; },
                     [&](int64_t c, float v) { work.cand_vote[c] = v; });
    return;
  }
  const BlockSplit split = SplitForBlock(n, warp);  // top_k_block.cuh
  if (blockIdx.x >= split.blocks) return;
  const uint32_t blocks = split.blocks;
  const int64_t chunk = split.chunk, block_begin = split.block_begin;
  const int64_t begin = split.begin, end = split.end;
  const int tiles = static_cast<int>(min(static_cast<int64_t>(kTiles), (end - begin + 31) / 32));

  // Warp 0: the heads' statistics for inv_a (loaded first: every load below is then in flight
  // at once).
  float stat[4] = {0.0f, 1.0f, 0.0f, 1.0f};
  if (threadIdx.x < keys.num_heads) {
    stat[0] = __ldcg(keys.head_max + threadIdx.x);
    stat[1] = __ldcg(keys.head_inv_sum + threadIdx.x);
    stat[2] = __ldcg(work.sample_max + threadIdx.x);
    stat[3] = __ldcg(work.sample_inv_sum + threadIdx.x);
  }
  // The warp's tiles' raw bounds and top terms: its first kTiles x 32 tokens, contiguous in
  // shared memory (token begin + 32 u + lane at tile_base + 32 u + lane), by 16-byte copies.
  // A copy may read up to 3 tokens past `end`: within the workspace arrays' 256-byte rounding
  // (the copies are 16-byte aligned: begin is a multiple of 32 tokens), and never used.
  const int tile_base = warp * (kTiles * 32);
  const int64_t copied = min(end - begin, static_cast<int64_t>(kTiles * 32));
#pragma unroll 1
  for (int c = lane; 4 * c < copied; c += 32) {
    CpAsyncCa16(&tile_vote[tile_base + 4 * c], work.bound + begin + 4 * c);
    CpAsyncCa16(&tile_top[tile_base + 4 * c], work.top_term + begin + 4 * c);
  }
  for (int b = threadIdx.x; b < kTopBins; b += blockDim.x) hist[b] = 0;
  __shared__ float inv_a[32];
  __shared__ bool usable;
  if (threadIdx.x < 32) {
    const int h = threadIdx.x;
    float v = 1.0f;
    if (h < keys.num_heads) v = expf((stat[2] - logf(stat[3])) - (stat[0] - logf(stat[1])));
    inv_a[h] = v;
    const bool ok = __all_sync(0xffffffffu, isfinite(v) && v > 0.0f);
    if (h == 0) usable = ok;
  }
  CpAsyncWaitAll();
  __syncthreads();  // inv_a, usable, hist
  float inv_lo = INFINITY, inv_hi = 0.0f;
  for (int h = 0; h < keys.num_heads; ++h) {
    inv_lo = fminf(inv_lo, inv_a[h]);
    inv_hi = fmaxf(inv_hi, inv_a[h]);
  }
  // The bounds: with inv_a[h] = 1 / a_h, the top term e of head h and the rest
  // r = bound - e, the exact vote lies in [e inv_a[h] + r min(inv_a), e inv_a[h] + r max(inv_a)]
  // (widened by 1e-4 for rounding). Statistics that are not finite, or a token whose bound or
  // top term is not (a term exp(l - C_h) past the fp32 range: a head the sample underestimated
  // by ~88 nats), give the trivial bounds [0, largest key]: every such token a candidate, none
  // raising T.
  // bounds(v, top, &upper): the lower bound's key, *upper the upper bound's. Neither bound is
  // negative or NaN, so a key is the float's bits (ordered as unsigned integers).
  auto bounds = [&](float v, uint32_t top, uint32_t* upper) {
    const float e = __uint_as_float(top & ~31u);
    if (!usable || !isfinite(v) || !isfinite(e)) {  // no bounds: a candidate, T not raised
      *upper = ~0u;
      return 0u;
    }
    const float sure = e * inv_a[top & 31u];
    const float rest = fmaxf(v - e, 0.0f);
    *upper = __float_as_uint((sure + rest * inv_hi) * (1.0f + 1e-4f));
    return __float_as_uint((sure + rest * inv_lo) * (1.0f - 1e-4f));
  };
  // A ceiling of every bound of a token with vote bound v (its key vk: v's bits, ~0u for no
  // bounds): upper <= v max(inv_a) (1 + 1e-4) up to rounding, given a margin.
  auto ceiling = [&](uint32_t vk) {
    return vk == ~0u ? ~0u : __float_as_uint(__uint_as_float(vk) * inv_hi * (1.0f + 1e-3f));
  };
  // fn(lower, upper, index, valid) over the lane's tokens in index order, all 32 lanes
  // together (fn may use warp votes): the tiles' bounds from their raw values in shared memory
  // (computed where they are needed: most tiles are skipped), further tokens' from global
  // memory. A tile whose ceiling is below `floor` holds no token whose bound reaches it: it is
  // skipped.
  __shared__ uint32_t tile_ceiling[kTiles * kWarps];
  auto for_each = [&](uint32_t floor, auto&& fn) {
#pragma unroll 1
    for (int u = 0; u < tiles; ++u) {
      if (tile_ceiling[u * kWarps + warp] < floor) continue;  // warp-uniform
      const int64_t i = begin + 32 * u + lane;
      const int at = tile_base + 32 * u + lane;
      uint32_t lower = 0u, upper = 0u;
      if (i < end) lower = bounds(__uint_as_float(tile_vote[at]), tile_top[at], &upper);
      fn(lower, upper, i, i < end);
    }
#pragma unroll 1
    for (int64_t t = begin + 32 * kTiles; t < end; t += 32) {
      const int64_t i = t + lane;
      uint32_t lower = 0u, upper = 0u;
      if (i < end) lower = bounds(work.bound[i], work.top_term[i], &upper);
      fn(lower, upper, i, i < end);
    }
  };
  // One histogram pass over this block's lower bounds that match `prefix` under `mask`.
  auto histogram = [&](int bins, int shift, uint32_t mask, uint32_t prefix,
                       uint32_t* global_hist) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for_each(prefix, [&](uint32_t key, uint32_t, int64_t, bool valid) {
      if (valid && (key & mask) == prefix) {
        atomicAdd(&hist[(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
      }
    });
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
      if (hist[b] != 0) atomicAdd(&global_hist[b], hist[b]);
    }
  };

  // T, the k-th largest lower bound (or a bound below it: see the edge below). The first
  // digit's pass also finds each tile's ceiling.
  uint32_t* const ws = static_cast<uint32_t*>(work.top_k_workspace);
  uint32_t* const barrier = ws + kBarrier;
  uint32_t barriers = 0;
#pragma unroll 4
  for (int u = 0; u < tiles; ++u) {
    const int at = tile_base + 32 * u + lane;
    uint32_t vk = 0u;
    if (begin + 32 * u + lane < end) {
      const uint32_t v = tile_vote[at];
      uint32_t upper;
      const uint32_t lower = bounds(__uint_as_float(v), tile_top[at], &upper);
      atomicAdd(&hist[FirstBin(lower)], 1u);
      vk = upper == ~0u ? ~0u : v;
    }
    const uint32_t tile_vk = __reduce_max_sync(0xffffffffu, vk);
    if (lane == 0) tile_ceiling[u * kWarps + warp] = ceiling(tile_vk);
  }
#pragma unroll 1
  for (int64_t i = begin + 32 * kTiles + lane; i < end; i += 32) {
    uint32_t upper;
    atomicAdd(&hist[FirstBin(bounds(work.bound[i], work.top_term[i], &upper))], 1u);
  }
  stage();  // the query's copies, waited for before the scoring
  __syncthreads();
  for (int b = threadIdx.x; b < kTopBins; b += blockDim.x) {
    if (hist[b] != 0) atomicAdd(&ws[kHist0 + b], hist[b]);
  }
  GridBarrier(barrier, ++barriers * blocks);
  const Digit top = ChooseDigitGlobal<kTopBins>(ws + kHist0, k);
  // The chosen bin's lower edge (0 for the bottom bin).
  uint32_t threshold = top.bin == 0 ? 0u : (top.bin + kFirstBase) << kFirstShift;
  uint32_t need = top.remaining;
  uint32_t mask = ~0u << kFirstShift;
  auto take = [&](const Digit& d, int shift) {
    threshold |= d.bin << shift;
    need = d.remaining;
    mask |= static_cast<uint32_t>(kLowBins - 1) << shift;
  };
  // The same branch in every block. A chosen bin with few keys leaves T at its lower edge (below
  // the k-th largest lower bound: a few more candidates, and no list, barrier or further
  // passes); else the bin's keys are listed and its low 20 bits found in every block, or with
  // more than kMaxCandidates keys by two more grid-wide passes.
  if (top.count <= kEdgeMaxInBin || top.bin == 0 || top.bin == kTopBins - 1) {
    // T stays B's lower edge (always for the clamped end bins).
  } else if (top.count <= kMaxCandidates) {
    // The keys in the chosen bin to a list, then its low 20 bits in every block.
    const uint32_t top_bin = top.bin;
    uint32_t* list = ws + kCand;
    for_each(threshold, [&](uint32_t key, uint32_t, int64_t, bool valid) {
      const bool in_bin = valid && FirstBin(key) == top_bin;
      const uint32_t slot = WarpAppend(in_bin, &ws[kCandCount]);
      if (in_bin) list[slot] = key;
    });
    GridBarrier(barrier, ++barriers * blocks);
    const int count = static_cast<int>(top.count);
    uint32_t ckey[kCandPerThread];
#pragma unroll
    for (int u = 0; u < kCandPerThread; ++u) {
      const int j = static_cast<int>(threadIdx.x) + kThreads * u;
      ckey[u] = j < count ? __ldcg(&list[j]) : 0u;
      if (kThreads * (u + 1) >= count) break;  // the same in every thread
    }
    LowDigitsOfList(&threshold, &mask, &need, ckey, count, kSecondShift, hist);
  } else {
    // Crowded bin: the low 20 bits by two more passes over every key.
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      const int shift = pass == 0 ? kSecondShift : 0;
      uint32_t* global_hist = ws + (pass == 0 ? kHist1 : kHist2);
      histogram(kLowBins, shift, mask, threshold, global_hist);
      GridBarrier(barrier, ++barriers * blocks);
      take(ChooseDigitGlobal<kLowBins>(global_hist, need), shift);
    }
  }
  PdlAllowDependents();  // every block is resident: the kernel after may launch

  // The candidates: this block's, in index order, from cand_index[block_begin] on.
  const int64_t row_bytes = candidate_vote::RowBytes(fp8, keys.num_kv_heads);
  const uint32_t cut = threshold;
  // Pass masks: tile u's kept in tile_pass (read back by the same warp), further tiles'
  // computed again.
  auto further_mask = [&](int64_t t) {
    const int64_t i = t + lane;
    uint32_t upper = 0u;
    if (i < end) bounds(work.bound[i], work.top_term[i], &upper);
    return __ballot_sync(0xffffffffu, i < end && upper >= cut);
  };
  __shared__ uint32_t tile_pass[kTiles * kWarps];
  __shared__ uint32_t warp_counts[kWarps];
  uint32_t passed = 0;
#pragma unroll 1
  for (int u = 0; u < tiles; ++u) {
    uint32_t m = 0u;
    if (tile_ceiling[u * kWarps + warp] >= cut) {  // warp-uniform
      const int64_t i = begin + 32 * u + lane;
      const int at = tile_base + 32 * u + lane;
      uint32_t upper = 0u;
      if (i < end) bounds(__uint_as_float(tile_vote[at]), tile_top[at], &upper);
      m = __ballot_sync(0xffffffffu, i < end && upper >= cut);
      if (i < end && upper >= cut) PrefetchL1(keys.slots + i);  // read by the listing below
    }
    if (lane == 0) tile_pass[u * kWarps + warp] = m;
    passed += __popc(m);
  }
#pragma unroll 1
  for (int64_t t = begin + 32 * kTiles; t < end; t += 32) passed += __popc(further_mask(t));
  if (lane == 0) warp_counts[warp] = passed;
  __syncthreads();
  uint32_t run = 0, block_count = 0;
  for (int w = 0; w < kWarps; ++w) {
    run += w < warp ? warp_counts[w] : 0u;
    block_count += warp_counts[w];
  }
  // The block's first kBlockSlots candidates' slots also in shared memory, for the scoring.
  __shared__ int32_t block_slots[kBlockSlots];
  const unsigned lanes_below = (1u << lane) - 1u;
  auto list = [&](uint32_t m, int64_t i) {
    if ((m >> lane) & 1u) {
      const uint32_t c = run + __popc(m & lanes_below);
      const int32_t slot = keys.slots[i];
      PrefetchRow(static_cast<const char*>(keys.k_cache) + slot * row_bytes, row_bytes);
      work.cand_index[block_begin + c] = static_cast<int32_t>(i);
      work.cand_slots[block_begin + c] = slot;
      if (c < kBlockSlots) block_slots[c] = slot;
    }
    run += __popc(m);
  };
#pragma unroll 1
  for (int u = 0; u < tiles; ++u) {
    const uint32_t m = tile_pass[u * kWarps + warp];
    if (m != 0u) list(m, begin + 32 * u + lane);
  }
#pragma unroll 1
  for (int64_t t = begin + 32 * kTiles; t < end; t += 32) list(further_mask(t), t + lane);
  discard_bounds(begin, end, lane, 32);  // the warp's last read of them was above
  if (threadIdx.x == 0) ws[kEqual + blockIdx.x] = block_count;
  CpAsyncWaitAll();
  __syncthreads();  // the list entries above are visible to the block; the staged query
  score_candidates(warp, kWarps, block_count,
                   [&](int64_t c) {
                     return c < kBlockSlots ? block_slots[c] : work.cand_slots[block_begin + c];
                   },
                   [&](int64_t c, float v) { work.cand_vote[block_begin + c] = v; });
  // The last block to finish its scoring picks; the others leave (none waits).
  if (!GridArriveLast(barrier, ++barriers * blocks)) return;

  // Every block's candidates, gathered in block order (which is index order).
  __shared__ uint32_t seg_first[kMaxBlocks];  // the gathered list's first entry of block b
  // The segments' offsets: thread t scans blocks 2t and 2t + 1 (kMaxBlocks = 2 kThreads).
  static_assert(kMaxBlocks <= 2 * kThreads, "two blocks' counts per thread");
  const uint32_t b0 = 2 * threadIdx.x;
  const uint32_t c0 = b0 < blocks ? __ldcg(&ws[kEqual + b0]) : 0u;
  const uint32_t c1 = b0 + 1 < blocks ? __ldcg(&ws[kEqual + b0 + 1]) : 0u;
  uint32_t before;
  const uint32_t total = BlockExclusiveScan(c0 + c1, &before);
  if (b0 < blocks) seg_first[b0] = before;
  if (b0 + 1 < blocks) seg_first[b0 + 1] = before + c0;
  __syncthreads();
  uint32_t* const g_vote = tile_vote;  // [kGather]: vote bits
  uint32_t* const g_index = tile_top;  // [kGather]
  float* const spill_vote = work.bound;     // entries from kGather on
  uint32_t* const spill_index = work.top_term;
  // Warp w copies blocks w, w + kWarps, ...: cp.async into shared memory (one round trip).
  for (uint32_t b = warp; b < blocks; b += kWarps) {
    const uint32_t first = seg_first[b];
    const uint32_t c = (b + 1 < blocks ? seg_first[b + 1] : total) - first;
    const int64_t src = static_cast<int64_t>(b) * chunk;
    for (uint32_t e = lane; e < c; e += 32) {
      const uint32_t j = first + e;
      if (j < kGather) {
        CpAsyncCa4(&g_vote[j], work.cand_vote + src + e);
        CpAsyncCa4(&g_index[j], work.cand_index + src + e);
      } else {
        spill_vote[j] = __ldcg(work.cand_vote + src + e);
        spill_index[j] = static_cast<uint32_t>(__ldcg(work.cand_index + src + e));
      }
    }
  }
  CpAsyncWaitAll();
  __syncthreads();
  auto vote_of = [&](uint32_t j) {
    return j < kGather ? __uint_as_float(g_vote[j]) : spill_vote[j];
  };
  auto index_of = [&](uint32_t j) {
    return static_cast<int32_t>(j < kGather ? g_index[j] : spill_index[j]);
  };
  // The list in one piece when asked (BoundVoteParams::list_candidates): cand_index /
  // cand_vote [0, total); every read of their segments is done.
  if (a.list_candidates) {
    for (uint32_t j = threadIdx.x; j < total; j += kThreads) {
      work.cand_index[j] = index_of(j);
      work.cand_vote[j] = vote_of(j);
    }
  }
  if (threadIdx.x == 0) *work.count = static_cast<int32_t>(total);
  PickFromList(vote_of, index_of, total, k, a.out, hist);
  // Every other block has left: the picker clears the control words for the next call.
  for (int w = threadIdx.x; w < kControlWords; w += blockDim.x) ws[w] = 0u;
}

cudaError_t Screen(const ScreenArgs& args, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  TS_CUDA_RETURN_IF_ERROR(OptInSharedMemoryOnce(ScreenKernel, kDynamicBytes, &configured));
  int device = 0, sms = 0;
  TS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = LaunchBlocks(args.keys.n, sms);
  return LaunchPdl(ScreenKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                   kDynamicBytes, stream, /*cooperative=*/true, args);
}

}  // namespace

size_t BoundVoteWorkspaceBytes(int64_t n, int64_t num_heads) {
  const size_t per_token = Round(static_cast<size_t>(n) * 4);
  return Round(ScoreKeysWorkspaceBytes(num_heads)) + Round(TopKWorkspaceBytes(n)) +
         5 * per_token + 2 * Round(static_cast<size_t>(num_heads) * 4) + kAlign;
}

BoundVoteWorkspace CarveBoundVoteWorkspace(void* workspace, int64_t n, int64_t num_heads) {
  char* at = static_cast<char*>(workspace);
  auto take = [&](size_t bytes) {
    char* p = at;
    at += Round(bytes);
    return p;
  };
  const size_t per_token = static_cast<size_t>(n) * 4;
  const size_t per_head = static_cast<size_t>(num_heads) * 4;
  BoundVoteWorkspace w;
  w.score_workspace = take(ScoreKeysWorkspaceBytes(num_heads));
  w.top_k_workspace = take(TopKWorkspaceBytes(n));
  w.bound = reinterpret_cast<float*>(take(per_token));
  w.top_term = reinterpret_cast<uint32_t*>(take(per_token));
  w.cand_index = reinterpret_cast<int32_t*>(take(per_token));
  w.cand_slots = reinterpret_cast<int32_t*>(take(per_token));
  w.cand_vote = reinterpret_cast<float*>(take(per_token));
  w.sample_max = reinterpret_cast<float*>(take(per_head));
  w.sample_inv_sum = reinterpret_cast<float*>(take(per_head));
  w.count = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  return w;
}

cudaError_t BoundVoteSelect(const BoundVoteParams& p, cudaStream_t stream) {
  const KeyScoreParams& in = p.score;
  if (in.n < 0 || in.n > INT32_MAX || p.k < 0 || p.out == nullptr || in.head_max == nullptr ||
      in.head_inv_sum == nullptr || p.workspace == nullptr || in.slots == nullptr ||
      in.query == nullptr || in.k_cache == nullptr ||
      reinterpret_cast<uintptr_t>(in.query) % 16 != 0 ||
      (in.kv_type == KvCacheType::kFp8E4M3 && in.k_scale == nullptr) ||
      !BoundVoteSupported(in.num_heads, in.num_kv_heads, in.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (in.n == 0 || p.k == 0) return cudaSuccess;
  const BoundVoteWorkspace w = CarveBoundVoteWorkspace(p.workspace, in.n, in.num_heads);
  KeyScoreParams sp = in;
  sp.logits = nullptr;
  sp.workspace = w.score_workspace;
  sp.vote_bound = w.bound;
  sp.vote_top = w.top_term;
  sp.sample_max = w.sample_max;
  sp.sample_inv_sum = w.sample_inv_sum;
  TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  if (p.launches < 2) return cudaSuccess;
  ScreenArgs screen;
  screen.out = p.out;
  screen.k = static_cast<uint32_t>(std::min(p.k, sp.n));
  screen.keys = sp;
  screen.work = w;
  screen.list_candidates = p.list_candidates;
  return Screen(screen, stream);
}

}  // namespace tokenselect::kernels::cuda
