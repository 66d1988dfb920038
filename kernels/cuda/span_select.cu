// tokenselect_span selection on the GPU: SpanSelect and its workspace (span_scoring.h).
//
// Reads the query, the span index (CSR) and the index tokens' keys; writes the span scores, the
// kept tokens and their soft votes, and the selected set. The span scores: ScoreKeys over every
// index vector's key (selection.h; reads (index vectors) * H_kv * d * 2 bytes of keys at the
// scoring kernel's bandwidth), then SpanScoresKernel, a warp per span over those logits (L2-hot:
// (index vectors) * H * 4 bytes). Until the thirty-seventh session a warp per span read its
// vectors' keys itself (the group-score kernel InfLLM still uses): latency-bound where spans are
// short: scores + sort 0.219 ms against 0.179 ms now, SpanSelect 0.281 against 0.239 ms, for 44K
// spans of 1-5 tokens at 128K (H100, bench_span_cuda --quick --tiny; 0.094 against 0.088 ms with
// the default 64-512-token spans). Per kernel there (ncu, no cache control): ScoreKeys over the
// 61K vectors 68 us (125 MB), ChooseSpansKernel 70 us (one block; most of it the index-order
// merge over all 44K spans), the sort 20 us, SpanScoresKernel 19 us, the soft vote ~40 us.
//
// SpanSelect after the span scores:
//   - CUB's stable radix sort of (~ordered(score), span) puts spans best first, ties by lower
//     index, which is span_policy.cc's (score desc, clipped begin asc) since spans are sorted by
//     begin; unscored spans (NaN) sort last.
//   - ChooseSpansKernel (one block of 512): the greedy budget walk is sequential by definition
//     (a span that does not fit is skipped, later ones may fit). Per batch of 4096 spans in sorted
//     order (8 consecutive per thread), a block scan of the lengths of those that could still fit
//     accepts the longest prefix that fits; the first that does not is rejected; repeat on the
//     rest, and leave the batch once nothing in it can fit. Every round but the last of a batch
//     accepts a span, so it costs (batches + accepted spans) rounds, not S. Then one
//     pass in index order merges the kept ranges (chosen spans, spans without index tokens, the
//     tail past covered_end) into disjoint intervals with a running max of their ends.
//   - KeptListKernel expands the intervals to tokens and slots (binary search per entry), padding
//     to max_kept with a valid slot. ScoreKeys runs over all max_kept entries (its statistics are
//     discarded); KeptStats recomputes the per-head max and sum-exp over the first m and sets the
//     padded logits to -inf, so their votes are 0 and lose every tie to real tokens (lower index);
//     TopK over max_kept then returns the real picks first, and the first min(m, k) are the picks.
//     No host round trip for m, at the cost of scoring up to token_budget padded rows (L2 hits of
//     one slot).
//   - With a skip flag set (a selection-cache hit: span_scoring.h's ApplySelectionCache) every
//     kernel returns at once; CUB's sort still runs (its length comes from the host) over the
//     workspace as it is.
//   - The workspace needs no initialisation: the two areas that must be zero at launch
//     (ScoreKeys' scratch, TopK's control words) are carved first and cleared by the first part.
//
// Measured (H200, Llama-3-8B shape, budget 128 / 2048 / 512, span budget 8192, one CUDA graph,
// L2 cold; bench_span_cuda): at N = 1M SpanSelect takes 0.125 ms against 0.681 ms for the exact
// soft vote, reading 48 MB of keys instead of 2146 MB; at 128K 0.098 ms against 0.128 ms. The
// span path is launch- and latency-bound, not bandwidth-bound: span scores + CUB sort 42 us
// (128K) to 69 us (1M), the greedy walk ~5 us, the soft vote over 8192 rows 43 us (of which TopK's
// 7 launches are a large share).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/span_scoring.h"
#include "kernels/cuda/span_scoring_internal.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using span_internal::AssembleArgs;
using span_internal::BaseAssemble;
using span_internal::Carver;
using span_internal::Covers;
using span_internal::GridFor;
using span_internal::kChooseThreads;
using span_internal::kNumCounters;
using span_internal::LaunchAssemble;
using span_internal::LaunchSelectAll;
using span_internal::MaxOp;
using span_internal::MinOp;
using span_internal::OrderedKey;
using span_internal::ValidProblem;
using span_internal::WarpSum;

constexpr int kChooseItems = 8;  // spans per thread in ChooseSpansKernel
constexpr int kChooseBatch = kChooseThreads * kChooseItems;
constexpr int kMaxStatBlocks = 256;

// ---------------------------------------------------------------------------------------------
// Span scores.

constexpr int kScoreWarps = 8;  // spans per block of SpanScoresKernel

// Span i's entry for SpanSelect's sort (best first, ties by lower index, NaN last) and its
// cleared chosen flag.
__device__ __forceinline__ void WriteSortEntry(float score, int64_t i, uint32_t* sort_keys,
                                               int32_t* sort_values, int32_t* chosen) {
  sort_keys[i] = ~OrderedKey(score);
  sort_values[i] = static_cast<int32_t>(i);
  chosen[i] = 0;
}

// Index vector v's cache slot; for an index token at or past N (a stale index: its span is not
// scored) token 0's, so that ScoreKeys reads a valid row.
__global__ void VectorSlotsKernel(int32_t* __restrict__ out, const int32_t* __restrict__ tokens,
                                  const int32_t* __restrict__ slots, int64_t n, int64_t num_tokens,
                                  const int32_t* skip) {
  if (Skipped(skip)) return;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t t = tokens[v];
    out[v] = slots[t < num_tokens ? t : 0];
  }
}

struct SpanScoresArgs {
  float* scores;
  uint32_t* sort_keys;
  int32_t* sort_values;
  int32_t* chosen;
  const float* vec_logits;  // ScoreKeys' logits of the index vectors (LogitIndex over num_vectors)
  const int32_t* span_begin;
  const int32_t* span_end;
  const int32_t* vector_indptr;
  const int32_t* vector_tokens;
  int64_t num_spans, num_vectors, cand_begin, cand_end, num_tokens;
  int num_heads;
  const int32_t* skip;
};

// A warp per span: lane l takes heads l, l + 32, ..., each head's maximum over the span's index
// vectors, and the lanes' sums add up by xor shuffles (a fixed order). NaN for a span outside the
// candidates, without index vectors, or with an index token at or past N.
__global__ void SpanScoresKernel(SpanScoresArgs a) {
  if (Skipped(a.skip)) return;
  const int lane = threadIdx.x & 31;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kScoreWarps + (threadIdx.x >> 5);
       s < a.num_spans; s += static_cast<int64_t>(gridDim.x) * kScoreWarps) {
    const int64_t b = max(static_cast<int64_t>(a.span_begin[s]), a.cand_begin);
    const int64_t e = min(static_cast<int64_t>(a.span_end[s]), a.cand_end);
    const int64_t i0 = a.vector_indptr[s], i1 = a.vector_indptr[s + 1];
    const bool valid = b < e && i1 > i0 && a.vector_tokens[i1 - 1] < a.num_tokens;
    float total = 0.0f;
    if (valid) {  // warp-uniform
      for (int h = lane; h < a.num_heads; h += 32) {
        float best = -INFINITY;
        for (int64_t v = i0; v < i1; ++v) {
          best = fmaxf(best, a.vec_logits[LogitIndex(v, h, a.num_vectors, a.num_heads)]);
        }
        total += best;
      }
      total = WarpSum(total);
    }
    if (lane == 0) {
      const float score = valid ? total : __int_as_float(0x7fffffff);
      a.scores[s] = score;
      WriteSortEntry(score, s, a.sort_keys, a.sort_values, a.chosen);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Span choice and the kept list.

struct ChooseArgs {
  int32_t* chosen = nullptr;
  int32_t* ivl_begin = nullptr;  // [num_spans + 1]
  int32_t* ivl_offset = nullptr;  // [num_spans + 1]: first kept entry of the interval
  // [kNumCounters]: [0] kept intervals, [1] kept entries m (clipped to max_kept), [2] picks
  // min(m, k).
  int32_t* counters = nullptr;
  int32_t* num_kept = nullptr;  // the true m
  const uint32_t* sorted_keys = nullptr;
  const int32_t* sorted_spans = nullptr;
  const int32_t* span_begin = nullptr;
  const int32_t* span_end = nullptr;
  const int32_t* vector_indptr = nullptr;
  int64_t num_spans = 0;
  int64_t cand_begin = 0;
  int64_t cand_end = 0;
  int64_t covered_end = 0;
  int64_t budget = 0;
  int64_t k = 0;
  int64_t max_kept = 0;
  const int32_t* skip = nullptr;
};

__global__ void __launch_bounds__(kChooseThreads) ChooseSpansKernel(ChooseArgs a) {
  using ScanI64 = cub::BlockScan<long long, kChooseThreads>;
  using ScanInt = cub::BlockScan<int, kChooseThreads>;
  using ReduceInt = cub::BlockReduce<int, kChooseThreads>;
  if (Skipped(a.skip)) return;
  __shared__ typename ScanI64::TempStorage scan64;
  __shared__ typename ScanI64::TempStorage scan64b;
  __shared__ typename ScanInt::TempStorage scan_int;
  __shared__ typename ScanInt::TempStorage scan_int2;
  __shared__ typename ReduceInt::TempStorage reduce;
  __shared__ long long s_remaining;
  __shared__ int s_stop;
  const int tid = threadIdx.x;
  const int cb = static_cast<int>(a.cand_begin);
  const int ce = static_cast<int>(a.cand_end);
  if (tid == 0) s_remaining = a.budget;
  __syncthreads();

  // 1. The greedy walk in score order, kChooseBatch spans at a time (kChooseItems consecutive
  //    ones per thread).
  for (int64_t base = 0; base < a.num_spans && s_remaining > 0; base += kChooseBatch) {
    int sid[kChooseItems];
    long long len[kChooseItems];
    bool pending[kChooseItems];
#pragma unroll
    for (int i = 0; i < kChooseItems; ++i) {
      const int64_t idx = base + tid * kChooseItems + i;
      sid[i] = 0;
      len[i] = 0;
      pending[i] = false;
      if (idx < a.num_spans && a.sorted_keys[idx] != 0xffffffffu) {  // scored: range non-empty
        sid[i] = a.sorted_spans[idx];
        len[i] = min(a.span_end[sid[i]], ce) - max(a.span_begin[sid[i]], cb);
        pending[i] = true;
      }
    }
    while (true) {
      const long long r = s_remaining;
      bool cand[kChooseItems];
      long long in[kChooseItems];
      bool any = false;
#pragma unroll
      for (int i = 0; i < kChooseItems; ++i) {
        cand[i] = pending[i] && len[i] <= r;
        in[i] = cand[i] ? len[i] : 0;
        any = any || cand[i];
      }
      // Also orders every read of s_remaining before the write below.
      if (!__syncthreads_or(any)) break;  // nothing left in this batch can fit
      long long excl[kChooseItems];
      long long total = 0;
      ScanI64(scan64).ExclusiveSum(in, excl, total);
      int my_fail = kChooseBatch;
#pragma unroll
      for (int i = kChooseItems - 1; i >= 0; --i) {
        if (cand[i] && excl[i] + len[i] > r) my_fail = tid * kChooseItems + i;
      }
      const int first_fail = ReduceInt(reduce).Reduce(my_fail, MinOp());
      if (tid == 0) s_stop = first_fail;
      __syncthreads();
      const int p = s_stop;
#pragma unroll
      for (int i = 0; i < kChooseItems; ++i) {
        const int pos = tid * kChooseItems + i;
        if (cand[i] && pos < p) a.chosen[sid[i]] = 1;
        if (pos <= p) pending[i] = false;
        if (pos == p) s_remaining = r - excl[i];
      }
      if (p >= kChooseBatch && tid == 0) s_remaining = r - total;
      __syncthreads();
      if (p >= kChooseBatch) break;
    }
  }
  __syncthreads();  // chosen[] written by this block is visible to it

  // 2. Kept ranges in index order, merged.
  __shared__ int s_running_end;
  __shared__ long long s_offset;
  __shared__ int s_intervals;
  if (tid == 0) {
    s_running_end = cb;
    s_offset = 0;
    s_intervals = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < a.num_spans; base += kChooseBatch) {
    int b[kChooseItems], ends[kChooseItems];
#pragma unroll
    for (int i = 0; i < kChooseItems; ++i) {
      const int64_t idx = base + tid * kChooseItems + i;
      b[i] = 0;
      ends[i] = INT_MIN;  // not kept
      if (idx < a.num_spans) {
        const int bb = max(a.span_begin[idx], cb);
        const int ee = min(a.span_end[idx], ce);
        if (bb < ee && (a.chosen[idx] != 0 || a.vector_indptr[idx + 1] == a.vector_indptr[idx])) {
          b[i] = bb;
          ends[i] = ee;
        }
      }
    }
    const int running = s_running_end;
    int prev_end[kChooseItems];
    int max_end = 0;
    ScanInt(scan_int).ExclusiveScan(ends, prev_end, running, MaxOp(), max_end);
    long long len[kChooseItems];
    int has[kChooseItems];
#pragma unroll
    for (int i = 0; i < kChooseItems; ++i) {
      b[i] = max(b[i], prev_end[i]);  // the effective begin: after every earlier kept range
      len[i] = ends[i] != INT_MIN ? max(0, ends[i] - b[i]) : 0;
      has[i] = len[i] > 0 ? 1 : 0;
    }
    long long off[kChooseItems];
    long long total_len = 0;
    ScanI64(scan64b).ExclusiveSum(len, off, total_len);
    int slot[kChooseItems];
    int total_slots = 0;
    ScanInt(scan_int2).ExclusiveSum(has, slot, total_slots);
#pragma unroll
    for (int i = 0; i < kChooseItems; ++i) {
      if (has[i]) {
        a.ivl_begin[s_intervals + slot[i]] = b[i];
        a.ivl_offset[s_intervals + slot[i]] = static_cast<int32_t>(s_offset + off[i]);
      }
    }
    __syncthreads();
    if (tid == 0) {
      s_running_end = max(running, max_end);
      s_offset += total_len;
      s_intervals += total_slots;
    }
    __syncthreads();
  }
  if (tid == 0) {
    const int covered = static_cast<int>(a.covered_end < ce ? a.covered_end : ce);
    const int tail = max(max(covered, cb), s_running_end);
    if (tail < ce) {
      a.ivl_begin[s_intervals] = tail;
      a.ivl_offset[s_intervals] = static_cast<int32_t>(s_offset);
      s_offset += ce - tail;
      ++s_intervals;
    }
    const long long m = s_offset;
    const long long mc = m < a.max_kept ? m : a.max_kept;
    a.counters[0] = s_intervals;
    a.counters[1] = static_cast<int32_t>(mc);
    a.counters[2] = static_cast<int32_t>(mc < a.k ? mc : a.k);
    *a.num_kept = static_cast<int32_t>(m);
  }
}

// Entry j < m: its token (binary search over the intervals) and slot; j >= m: token -1 and a
// valid pad slot.
__global__ void KeptListKernel(int32_t* kept_tokens, int32_t* kept_slots,
                               const int32_t* __restrict__ ivl_begin,
                               const int32_t* __restrict__ ivl_offset,
                               const int32_t* __restrict__ counters,
                               const int32_t* __restrict__ slots, int64_t max_kept,
                               int64_t pad_token, const int32_t* skip) {
  if (Skipped(skip)) return;
  const int num_intervals = counters[0];
  const int m = counters[1];
  const int32_t pad_slot = slots[pad_token];
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < max_kept;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (j < m) {
      int lo = 0, hi = num_intervals - 1;  // the last interval with offset <= j
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (ivl_offset[mid] <= j) lo = mid;
        else hi = mid - 1;
      }
      const int32_t token = ivl_begin[lo] + static_cast<int32_t>(j - ivl_offset[lo]);
      kept_tokens[j] = token;
      kept_slots[j] = slots[token];
    } else {
      kept_tokens[j] = -1;
      kept_slots[j] = pad_slot;
    }
  }
}

// Per block of entries and head: (max, sum exp(s - max)) over entries < m; entries >= m get
// logits -inf. Block: x over heads (strided), y over entries.
__global__ void KeptStatsKernel(float* logits, float2* partial, const int32_t* counters, int64_t n,
                                int num_heads, int64_t chunk, const int32_t* skip) {
  if (Skipped(skip)) return;
  __shared__ float2 sm[8][32];
  const int64_t m = counters[1];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min(n, begin + chunk);
  const int64_t live_end = min(end, m);
  for (int h0 = 0; h0 < num_heads; h0 += 32) {
    const int h = h0 + threadIdx.x;
    float mx = -INFINITY, l = 0.0f;
    if (h < num_heads) {
      // Loads only (no stores in this loop), so that they can be in flight together.
#pragma unroll 4
      for (int64_t j = begin + threadIdx.y; j < live_end; j += blockDim.y) {
        const float v = logits[LogitIndex(j, h, n, num_heads)];
        if (v > mx) {
          l = l * expf(mx - v) + 1.0f;
          mx = v;
        } else {
          l += expf(v - mx);
        }
      }
      for (int64_t j = max(begin, m) + threadIdx.y; j < end; j += blockDim.y) {
        logits[LogitIndex(j, h, n, num_heads)] = -INFINITY;
      }
    }
    sm[threadIdx.y][threadIdx.x] = make_float2(mx, l);
    __syncthreads();
    if (threadIdx.y == 0 && h < num_heads) {
      float2 acc = sm[0][threadIdx.x];
      for (int y = 1; y < static_cast<int>(blockDim.y); ++y) {
        const float2 o = sm[y][threadIdx.x];
        const float nm = fmaxf(acc.x, o.x);
        if (nm != -INFINITY) acc = make_float2(nm, acc.y * expf(acc.x - nm) + o.y * expf(o.x - nm));
      }
      partial[static_cast<int64_t>(blockIdx.x) * num_heads + h] = acc;
    }
    __syncthreads();
  }
}

// Block (32, 32): x over heads, y over the partials (strided; loads in flight together), then a
// fixed-order combine over y.
__global__ void CombineStatsKernel(float* head_max, float* head_inv_sum,
                                   const float2* __restrict__ partial, int blocks, int num_heads,
                                   const int32_t* skip) {
  if (Skipped(skip)) return;
  __shared__ float2 sm[32][33];
  for (int h0 = 0; h0 < num_heads; h0 += 32) {
    const int h = h0 + threadIdx.x;
    float2 acc = make_float2(-INFINITY, 0.0f);
    if (h < num_heads) {
#pragma unroll 4
      for (int b = threadIdx.y; b < blocks; b += blockDim.y) {
        const float2 o = partial[static_cast<int64_t>(b) * num_heads + h];
        const float nm = fmaxf(acc.x, o.x);
        if (nm != -INFINITY) acc = make_float2(nm, acc.y * expf(acc.x - nm) + o.y * expf(o.x - nm));
      }
    }
    sm[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && h < num_heads) {
      for (int y = 1; y < static_cast<int>(blockDim.y); ++y) {
        const float2 o = sm[y][threadIdx.x];
        const float nm = fmaxf(acc.x, o.x);
        if (nm != -INFINITY) acc = make_float2(nm, acc.y * expf(acc.x - nm) + o.y * expf(o.x - nm));
      }
      const bool empty = acc.x == -INFINITY;
      head_max[h] = empty ? 0.0f : acc.x;
      head_inv_sum[h] = empty ? 0.0f : 1.0f / acc.y;
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------
// Workspace.

size_t SortTempBytes(int64_t num_spans) {
  size_t bytes = 0;
  if (num_spans > 0) {
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                    static_cast<uint32_t*>(nullptr),
                                    static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), num_spans);
  }
  return bytes;
}

struct SpanWorkspace {
  int32_t* vec_slots;  // [num_vectors]
  float* vec_logits;   // [num_vectors * num_heads] (LogitIndex)
  uint32_t* keys_in;
  uint32_t* keys_out;
  int32_t* values_in;
  int32_t* values_out;
  int32_t* chosen;
  int32_t* ivl_begin;
  int32_t* ivl_offset;
  int32_t* counters;
  void* sort_temp;
  size_t sort_temp_bytes;
  int32_t* kept_slots;
  float* logits;
  float2* partial;
  float* head_max;
  float* head_inv_sum;
  void* score_ws;
  void* topk_ws;
  int32_t* topk_out;
};

SpanWorkspace CarveSpan(Carver* c, int64_t num_spans, int64_t num_vectors, int64_t max_kept,
                        int64_t num_heads, int64_t k) {
  SpanWorkspace w;
  // First the two scratch areas that must be zero at launch (SpanSelect clears that prefix), so
  // that where they lie does not move with the sizes.
  w.score_ws = c->Take<char>(static_cast<int64_t>(ScoreKeysWorkspaceBytes(num_heads)));
  w.topk_ws = c->Take<char>(static_cast<int64_t>(TopKWorkspaceBytes(max_kept)));
  w.vec_slots = c->Take<int32_t>(num_vectors);
  w.vec_logits = c->Take<float>(num_vectors * num_heads);
  w.keys_in = c->Take<uint32_t>(num_spans);
  w.keys_out = c->Take<uint32_t>(num_spans);
  w.values_in = c->Take<int32_t>(num_spans);
  w.values_out = c->Take<int32_t>(num_spans);
  w.chosen = c->Take<int32_t>(num_spans);
  w.ivl_begin = c->Take<int32_t>(num_spans + 1);
  w.ivl_offset = c->Take<int32_t>(num_spans + 1);
  w.counters = c->Take<int32_t>(kNumCounters);
  w.sort_temp_bytes = SortTempBytes(num_spans);
  w.sort_temp = c->Take<char>(static_cast<int64_t>(w.sort_temp_bytes));
  w.kept_slots = c->Take<int32_t>(max_kept);
  w.logits = c->Take<float>(max_kept * num_heads);
  w.partial = c->Take<float2>(kMaxStatBlocks * num_heads);
  w.head_max = c->Take<float>(num_heads);
  w.head_inv_sum = c->Take<float>(num_heads);
  w.topk_out = c->Take<int32_t>(std::min(k, max_kept));
  return w;
}

}  // namespace

int64_t SpanMaxKept(const int32_t* span_begin, const int32_t* span_end,
                    const int32_t* vector_indptr, int64_t num_spans, int64_t covered_end,
                    int64_t num_tokens, int64_t n_init, int64_t n_local, int64_t token_budget) {
  const int64_t begin = n_init;
  const int64_t end = num_tokens - n_local;
  if (end <= begin) return 0;
  int64_t always = 0;
  for (int64_t i = 0; i < num_spans; ++i) {
    if (vector_indptr[i + 1] != vector_indptr[i]) continue;
    const int64_t b = std::max<int64_t>(span_begin[i], begin);
    const int64_t e = std::min<int64_t>(span_end[i], end);
    if (b < e) always += e - b;
  }
  const int64_t tail = std::max(covered_end, begin);
  if (tail < end) always += end - tail;
  return std::min(end - begin, token_budget + always);
}

size_t SpanSelectWorkspaceBytes(int64_t num_spans, int64_t num_vectors, int64_t max_kept,
                                int64_t num_heads, int64_t k) {
  Carver c(nullptr);
  CarveSpan(&c, num_spans, num_vectors, max_kept, num_heads, k);
  return c.used();
}

namespace {

// Span i's sort entry from its (summed) score, as SpanScoresKernel writes it on one GPU.
__global__ void SortKeysKernel(const float* __restrict__ scores, uint32_t* sort_keys,
                               int32_t* sort_values, int32_t* chosen, int64_t n,
                               const int32_t* skip) {
  if (Skipped(skip)) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    WriteSortEntry(scores[i], i, sort_keys, sort_values, chosen);
  }
}

// ScoreKeys of the problem's query over the keys of `slots` [n] into logits, with the
// workspace's statistics and scoring scratch.
KeyScoreParams ScoreRows(const SpanSelectParams& p, const SpanWorkspace& w, const int32_t* slots,
                         int64_t n, float* logits) {
  const SelectionProblem& pr = p.problem;
  KeyScoreParams sp;
  sp.logits = logits;
  sp.head_max = w.head_max;
  sp.head_inv_sum = w.head_inv_sum;
  sp.query = pr.query;
  sp.k_cache = pr.k_cache;
  sp.kv_type = pr.kv_type;
  sp.k_scale = pr.k_scale;
  sp.slots = slots;
  sp.workspace = w.score_ws;
  sp.n = n;
  sp.num_heads = pr.num_heads;
  sp.num_kv_heads = pr.num_kv_heads;
  sp.head_dim = pr.head_dim;
  sp.scale = pr.scale;
  sp.skip = p.skip;
  return sp;
}

// What the three parts check and share. `trivial`: a covering budget or k = 0, where only the
// last part does anything (the CPU policy scores nothing).
struct SpanStep {
  bool valid = false;
  bool trivial = false;
  SpanWorkspace w{};
  int64_t begin = 0, end = 0;
};

SpanStep PrepareSpanStep(const SpanSelectParams& p) {
  const SelectionProblem& pr = p.problem;
  const SpanIndexView& ix = p.index;
  SpanStep st;
  st.valid = ValidProblem(pr) && ix.num_spans >= 0 && ix.num_vectors >= 0 &&
             ix.num_vectors <= INT32_MAX && ix.num_spans <= INT32_MAX - 1 && p.token_budget >= 0 &&
             p.max_kept >= 0 && p.max_kept <= INT32_MAX &&
             // No lookup when the budget covers the cache (selection_cache.h), so no skip either.
             !(Covers(pr) && p.skip != nullptr);
  st.trivial = Covers(pr) || pr.k == 0;
  st.begin = pr.n_init;
  st.end = pr.num_tokens - pr.n_local;
  if (st.valid && !st.trivial) {
    Carver carver(p.workspace);
    st.w = CarveSpan(&carver, ix.num_spans, ix.num_vectors, p.max_kept, pr.num_heads, pr.k);
  }
  return st;
}

// 1. Span scores (and, on one GPU, their sort entries): ScoreKeys over every index vector's key,
// then SpanScoresKernel.
cudaError_t ScoreSpansPart(const SpanSelectParams& p, const SpanStep& st, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  const SpanIndexView& ix = p.index;
  // ScoreKeys' scratch and TopK's control words (the workspace's first bytes) must be zero; the
  // rest needs no initialisation.
  const size_t zero_bytes =
      static_cast<size_t>(static_cast<char*>(st.w.topk_ws) - static_cast<char*>(p.workspace)) +
      TopKWorkspaceBytes(0);
  TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.workspace, 0, zero_bytes, stream));
  if (ix.num_spans == 0) return cudaSuccess;
  if (ix.num_vectors > 0) {
    VectorSlotsKernel<<<GridFor(ix.num_vectors, 256, 1024), 256, 0, stream>>>(
        st.w.vec_slots, ix.vector_tokens, pr.slots, ix.num_vectors, pr.num_tokens, p.skip);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    // (head_max / head_inv_sum are unused here: the soft vote's statistics overwrite them.)
    const KeyScoreParams sp = ScoreRows(p, st.w, st.w.vec_slots, ix.num_vectors, st.w.vec_logits);
    TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  }
  SpanScoresArgs a;
  a.scores = p.span_scores;
  a.sort_keys = st.w.keys_in;
  a.sort_values = st.w.values_in;
  a.chosen = st.w.chosen;
  a.vec_logits = st.w.vec_logits;
  a.span_begin = ix.span_begin;
  a.span_end = ix.span_end;
  a.vector_indptr = ix.vector_indptr;
  a.vector_tokens = ix.vector_tokens;
  a.num_spans = ix.num_spans;
  a.num_vectors = ix.num_vectors;
  a.cand_begin = st.begin;
  a.cand_end = st.end;
  a.num_tokens = pr.num_tokens;
  a.num_heads = static_cast<int>(pr.num_heads);
  a.skip = p.skip;
  SpanScoresKernel<<<GridFor(ix.num_spans, kScoreWarps, 4096), kScoreWarps * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

// 2. Best first (rekey: the sort entries from the summed scores first), the budget walk and the
// kept intervals, then the kept list and its soft votes (padded to max_kept).
cudaError_t VoteKeptPart(const SpanSelectParams& p, const SpanStep& st, bool rekey,
                         cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  const SpanIndexView& ix = p.index;
  const SpanWorkspace& w = st.w;
  if (ix.num_spans > 0) {
    if (rekey) {
      SortKeysKernel<<<GridFor(ix.num_spans, 256, 1024), 256, 0, stream>>>(
          p.span_scores, w.keys_in, w.values_in, w.chosen, ix.num_spans, p.skip);
      TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    size_t temp_bytes = w.sort_temp_bytes;
    TS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(w.sort_temp, temp_bytes, w.keys_in,
                                                            w.keys_out, w.values_in, w.values_out,
                                                            ix.num_spans, 0, 32, stream));
  }
  ChooseArgs ch;
  ch.chosen = w.chosen;
  ch.ivl_begin = w.ivl_begin;
  ch.ivl_offset = w.ivl_offset;
  ch.counters = w.counters;
  ch.num_kept = p.num_kept;
  ch.sorted_keys = w.keys_out;
  ch.sorted_spans = w.values_out;
  ch.span_begin = ix.span_begin;
  ch.span_end = ix.span_end;
  ch.vector_indptr = ix.vector_indptr;
  ch.num_spans = ix.num_spans;
  ch.cand_begin = st.begin;
  ch.cand_end = st.end;
  ch.covered_end = ix.covered_end;
  ch.budget = p.token_budget;
  ch.k = pr.k;
  ch.max_kept = p.max_kept;
  ch.skip = p.skip;
  ChooseSpansKernel<<<1, kChooseThreads, 0, stream>>>(ch);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int64_t n = p.max_kept;
  if (n == 0) return cudaSuccess;
  KeptListKernel<<<GridFor(n, 256, 2048), 256, 0, stream>>>(p.kept_tokens, w.kept_slots,
                                                            w.ivl_begin, w.ivl_offset, w.counters,
                                                            pr.slots, n, st.begin, p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // head_max / head_inv_sum are overwritten by the statistics over the first m below.
  const KeyScoreParams sp = ScoreRows(p, w, w.kept_slots, n, w.logits);
  TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  const int stat_blocks = GridFor(n, 64, kMaxStatBlocks);
  const int64_t chunk = (n + stat_blocks - 1) / stat_blocks;
  KeptStatsKernel<<<stat_blocks, dim3(32, 8), 0, stream>>>(
      w.logits, w.partial, w.counters, n, static_cast<int>(pr.num_heads), chunk, p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CombineStatsKernel<<<1, dim3(32, 32), 0, stream>>>(
      w.head_max, w.head_inv_sum, w.partial, stat_blocks, static_cast<int>(pr.num_heads), p.skip);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  VoteParams vp;
  vp.vote = p.kept_votes;
  vp.logits = w.logits;
  vp.head_max = w.head_max;
  vp.head_inv_sum = w.head_inv_sum;
  vp.n = n;
  vp.num_heads = pr.num_heads;
  vp.mode = VoteMode::kSoftVote;
  vp.skip = p.skip;
  return VoteFromLogits(vp, stream);
}

// 3. The top k of the votes and the selected set (or the trivial cases' set).
cudaError_t PickTokensPart(const SpanSelectParams& p, const SpanStep& st, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (Covers(pr)) return LaunchSelectAll(p.out, pr.num_tokens, stream);
  AssembleArgs asm_args = BaseAssemble(p.out, pr);
  asm_args.skip = p.skip;
  if (pr.k == 0) {  // the CPU policy scores nothing
    TS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p.span_scores, 0xff, p.index.num_spans * sizeof(float), stream));
    TS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p.kept_tokens, 0xff, p.max_kept * sizeof(int32_t), stream));
    TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.num_kept, 0, sizeof(int32_t), stream));
    return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  }
  asm_args.picks = st.w.topk_out;
  asm_args.map = p.kept_tokens;
  asm_args.num_picks_dev = st.w.counters + 2;
  asm_args.unit = 1;
  asm_args.begin = 0;
  asm_args.end = pr.num_tokens;
  if (p.max_kept > 0) {
    TopKParams tp;
    tp.out = st.w.topk_out;
    tp.scores = p.kept_votes;
    tp.workspace = st.w.topk_ws;
    tp.n = p.max_kept;
    tp.k = pr.k;
    tp.skip = p.skip;
    TS_CUDA_RETURN_IF_ERROR(TopK(tp, stream));
  }
  return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
}

}  // namespace

cudaError_t SpanSelect(const SpanSelectParams& p, cudaStream_t stream) {
  const SpanStep st = PrepareSpanStep(p);
  if (!st.valid) return cudaErrorInvalidValue;
  if (!st.trivial) {
    TS_CUDA_RETURN_IF_ERROR(ScoreSpansPart(p, st, stream));
    TS_CUDA_RETURN_IF_ERROR(VoteKeptPart(p, st, /*rekey=*/false, stream));
  }
  return PickTokensPart(p, st, stream);
}

cudaError_t SpanScoreSpans(const SpanSelectParams& p, cudaStream_t stream) {
  const SpanStep st = PrepareSpanStep(p);
  if (!st.valid) return cudaErrorInvalidValue;
  return st.trivial ? cudaSuccess : ScoreSpansPart(p, st, stream);
}

cudaError_t SpanVoteKept(const SpanSelectParams& p, cudaStream_t stream) {
  const SpanStep st = PrepareSpanStep(p);
  if (!st.valid) return cudaErrorInvalidValue;
  return st.trivial ? cudaSuccess : VoteKeptPart(p, st, /*rekey=*/true, stream);
}

cudaError_t SpanPickTokens(const SpanSelectParams& p, cudaStream_t stream) {
  const SpanStep st = PrepareSpanStep(p);
  if (!st.valid) return cudaErrorInvalidValue;
  return PickTokensPart(p, st, stream);
}

}  // namespace tokenselect::kernels::cuda
