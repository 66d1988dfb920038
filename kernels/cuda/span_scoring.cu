// Span index (tokenselect_span), Quest and InfLLM selection on the GPU (span_scoring.h).
//
// GroupScoreKernel: sum_h max_i scale * q_h . K[slot_i, h / g] for groups of keys: the spans'
// index vectors (slot = slots[vector token]) or InfLLM's representatives (slots given). One warp
// per group; a kv head's d-vector is read by L = d / 8 lanes (16 B each), 32 / L kv heads per
// "pass", and up to 4 passes' loads are issued together per key (a 2 KB Llama-3 row is one
// load per lane per pass, all in flight at once). The query sits in shared memory. Partial dots
// are reduced over the L lanes by xor shuffles; the per-head maxima then sum across the warp in a
// fixed order. Reads (index vectors) * H_kv * d * 2 bytes of keys; latency-bound per group
// (a chain of a few dependent loads), so every group gets its own warp.
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
//
// Quest: QuestBoundsKernel, one block per page, threads over the row's 16-byte chunks, bf16
// min/max over the page's tokens (exact: min/max of bf16 values are bf16). QuestScoreKernel, one
// warp per page: 2 * H_kv * d bf16 of bounds, max(q * lo, q * hi) per channel and head, in fp32.
// The page choice: F full pages and maybe a short last page of r tokens; the greedy takes the
// top q = k / page_size full pages, except that the short page, taken if it fits at its turn
// (its rank rho among the full pages decides: page_size * min(rho, q) + r <= k), leaves room for
// floor((k - r) / page_size) full pages, which is q or q - 1. So: TopK(F, q), rho by a counting
// kernel, and QuestChooseKernel drops the lowest-ranked of the q when needed and appends the short
// page (the highest page index, so it stays last in ascending order).
//
// InfLLM: InfLlmRepsKernel, one warp per block, reps rounds of a warp arg-max over the block's
// received attention, each round restricted to the tokens ranked after the previous pick.
// Scoring is GroupScoreKernel over the representatives; TopK(blocks, k / block_size).
//
// AssembleKernel writes [0, n_init) + the picked units' tokens + [N - n_local, N): units are
// ascending and only the last can be short, so entry p maps to a unit by division.
//
// Measured (H200, Llama-3-8B shape, budget 128 / 2048 / 512, span budget 8192, one CUDA graph,
// L2 cold; bench_span_cuda): at N = 1M SpanSelect takes 0.125 ms against 0.681 ms for the exact
// soft vote, reading 48 MB of keys instead of 2146 MB; at 128K 0.098 ms against 0.128 ms. The
// span path is launch- and latency-bound, not bandwidth-bound: span scores + CUB sort 42 us
// (128K) to 69 us (1M), the greedy walk ~5 us, the soft vote over 8192 rows 43 us (of which TopK's
// 7 launches are a large share).
#include "kernels/cuda/span_scoring.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kChooseThreads = 512;
constexpr int kChooseItems = 8;  // spans per thread in ChooseSpansKernel
constexpr int kChooseBatch = kChooseThreads * kChooseItems;
constexpr int kMaxStatBlocks = 256;
constexpr int kPassChunk = 4;  // kv-head passes whose loads are in flight together
constexpr size_t kAlign = 256;
constexpr int64_t kMaxQueryFloats = 12288;  // 48 KB of shared memory

// Consecutive aligned pieces of a workspace; with a null base it only adds up sizes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T) + kAlign - 1) /
             kAlign * kAlign;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

int NumSms() {
  static int num_sms = 0;
  if (num_sms == 0) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      num_sms = 132;
    }
  }
  return num_sms;
}

int GridFor(int64_t items, int64_t per_block, int64_t max_blocks) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, max_blocks)));
}

bool ValidProblem(const SelectionProblem& p) {
  if (p.num_tokens < 0 || p.num_tokens > INT32_MAX || p.num_heads <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 || p.n_init < 0 || p.k < 0 || p.n_local < 0 ||
      p.n_init + p.k + p.n_local > INT32_MAX || !std::isfinite(p.scale)) {
    return false;
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  return (p.head_dim == 64 || p.head_dim == 128) &&
         (group == 1 || group == 2 || group == 4 || group == 8) &&
         p.num_heads * p.head_dim <= kMaxQueryFloats;
}

bool Covers(const SelectionProblem& p) { return p.n_init + p.k + p.n_local >= p.num_tokens; }

// Calls fn(integral_constant<D>, integral_constant<G>) for the problem's head dim and group.
template <int D, typename Fn>
cudaError_t DispatchGroup(int64_t group, Fn&& fn) {
  switch (group) {
    case 1: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename Fn>
cudaError_t DispatchShape(const SelectionProblem& p, Fn&& fn) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  switch (p.head_dim) {
    case 64: return DispatchGroup<64>(group, fn);
    case 128: return DispatchGroup<128>(group, fn);
    default: return cudaErrorInvalidValue;
  }
}

// top_k.cu's order-preserving key: NaN lowest, -0 == +0.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
  uint32_t u = __float_as_uint(f);
  if (f == 0.0f) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void UnpackBf16x8(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};

// ---------------------------------------------------------------------------------------------
// Group scores.

struct GroupScoreArgs {
  float* scores = nullptr;  // [num_groups]; NaN for a group that is not scored
  // Span mode only: the sort input and the chosen flags (cleared).
  uint32_t* sort_keys = nullptr;
  int32_t* sort_values = nullptr;
  int32_t* chosen = nullptr;
  const float* query = nullptr;
  const uint4* keys = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* span_begin = nullptr;
  const int32_t* span_end = nullptr;
  const int32_t* vector_indptr = nullptr;
  const int32_t* vector_tokens = nullptr;
  const int32_t* rep_slots = nullptr;  // block mode: [num_groups, reps]
  int64_t reps = 0;
  int64_t block_size = 0;
  int64_t num_groups = 0;
  int64_t cand_begin = 0;
  int64_t cand_end = 0;
  int64_t num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  float scale = 1.0f;
};

template <int D, int G, bool kSpan>
__global__ void __launch_bounds__(kThreads) GroupScoreKernel(GroupScoreArgs a) {
  constexpr int L = D / 8;
  constexpr int KPW = 32 / L;
  extern __shared__ float sq[];  // [num_heads * D]
  for (int i = threadIdx.x; i < a.num_heads * D; i += blockDim.x) sq[i] = a.query[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int sub = lane % L;
  const int kv_in_pass = lane / L;
  const int passes = (a.num_kv_heads + KPW - 1) / KPW;
  const int64_t row_vecs = static_cast<int64_t>(a.num_kv_heads) * L;

  auto item_slot = [&](int64_t item) -> int32_t {
    if constexpr (kSpan) {
      return __ldg(a.slots + __ldg(a.vector_tokens + item));
    } else {
      return __ldg(a.rep_slots + item);
    }
  };

  for (int64_t grp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; grp < a.num_groups;
       grp += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    int64_t i0 = 0, i1 = 0;
    bool valid = false;
    if constexpr (kSpan) {
      const int64_t b = max(static_cast<int64_t>(a.span_begin[grp]), a.cand_begin);
      const int64_t e = min(static_cast<int64_t>(a.span_end[grp]), a.cand_end);
      i0 = a.vector_indptr[grp];
      i1 = a.vector_indptr[grp + 1];
      valid = b < e && i1 > i0 && a.vector_tokens[i1 - 1] < a.num_tokens;
    } else {
      const int64_t b0 = a.cand_begin + grp * a.block_size;
      const int64_t b1 = min(a.cand_end, b0 + a.block_size);
      i0 = grp * a.reps;
      i1 = i0 + min(a.reps, b1 - b0);
      valid = i1 > i0;
    }
    float total = 0.0f;
    if (valid) {  // warp-uniform
      for (int c0 = 0; c0 < passes; c0 += kPassChunk) {
        float best[kPassChunk][G];
#pragma unroll
        for (int pp = 0; pp < kPassChunk; ++pp) {
#pragma unroll
          for (int gi = 0; gi < G; ++gi) best[pp][gi] = -INFINITY;
        }
        int32_t next_slot = item_slot(i0);
        for (int64_t it = i0; it < i1; ++it) {
          const int64_t row = static_cast<int64_t>(next_slot) * row_vecs;
          if (it + 1 < i1) next_slot = item_slot(it + 1);
          uint4 raw[kPassChunk];
#pragma unroll
          for (int pp = 0; pp < kPassChunk; ++pp) {
            const int kv = min((c0 + pp) * KPW + kv_in_pass, a.num_kv_heads - 1);
            if (c0 + pp < passes) raw[pp] = __ldg(a.keys + row + kv * L + sub);
          }
#pragma unroll
          for (int pp = 0; pp < kPassChunk; ++pp) {
            if (c0 + pp < passes) {  // warp-uniform
              float k8[8];
              UnpackBf16x8(raw[pp], k8);
              const int kv = min((c0 + pp) * KPW + kv_in_pass, a.num_kv_heads - 1);
#pragma unroll
              for (int gi = 0; gi < G; ++gi) {
                const float4* q4 = reinterpret_cast<const float4*>(sq + (kv * G + gi) * D + sub * 8);
                const float4 qa = q4[0], qb = q4[1];
                float dot = qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] +
                            qb.x * k8[4] + qb.y * k8[5] + qb.z * k8[6] + qb.w * k8[7];
#pragma unroll
                for (int off = L / 2; off > 0; off >>= 1) {
                  dot += __shfl_xor_sync(0xffffffffu, dot, off);
                }
                best[pp][gi] = fmaxf(best[pp][gi], a.scale * dot);
              }
            }
          }
        }
#pragma unroll
        for (int pp = 0; pp < kPassChunk; ++pp) {
          const int kv = (c0 + pp) * KPW + kv_in_pass;
          if (c0 + pp < passes && sub == 0 && kv < a.num_kv_heads) {
#pragma unroll
            for (int gi = 0; gi < G; ++gi) total += best[pp][gi];
          }
        }
      }
      total = WarpSum(total);
    }
    if (lane == 0) {
      const float score = valid ? total : __int_as_float(0x7fffffff);
      a.scores[grp] = score;
      if constexpr (kSpan) {
        a.sort_keys[grp] = ~OrderedKey(score);
        a.sort_values[grp] = static_cast<int32_t>(grp);
        a.chosen[grp] = 0;
      }
    }
  }
}

template <bool kSpan>
cudaError_t LaunchGroupScore(const GroupScoreArgs& a, int64_t head_dim, cudaStream_t stream) {
  if (a.num_groups == 0) return cudaSuccess;
  SelectionProblem shape;
  shape.num_heads = a.num_heads;
  shape.num_kv_heads = a.num_kv_heads;
  shape.head_dim = head_dim;
  const size_t smem = static_cast<size_t>(a.num_heads) * head_dim * sizeof(float);
  const int grid = GridFor(a.num_groups, kWarpsPerBlock, static_cast<int64_t>(NumSms()) * 16);
  return DispatchShape(shape, [&](auto d, auto g) {
    GroupScoreKernel<decltype(d)::value, decltype(g)::value, kSpan>
        <<<grid, kThreads, smem, stream>>>(a);
    return cudaGetLastError();
  });
}

// ---------------------------------------------------------------------------------------------
// Output assembly.

struct AssembleArgs {
  int32_t* out = nullptr;
  int32_t* count = nullptr;
  const int32_t* picks = nullptr;          // ascending unit ids (or indices into map)
  const int32_t* map = nullptr;            // optional: unit id = map[picks[i]]
  const int32_t* num_picks_dev = nullptr;  // else num_picks_host
  int64_t num_picks_host = 0;
  int64_t unit = 1;
  int64_t begin = 0;  // unit u covers [begin + u * unit, min(end, begin + (u + 1) * unit))
  int64_t end = 0;
  int64_t n_init = 0;
  int64_t num_tokens = 0;
  int64_t n_local = 0;
};

__global__ void AssembleKernel(AssembleArgs a) {
  const int64_t np = a.num_picks_dev != nullptr ? *a.num_picks_dev : a.num_picks_host;
  auto unit_of = [&](int64_t i) -> int64_t {
    const int64_t pick = a.picks[i];
    return a.map != nullptr ? a.map[pick] : pick;
  };
  int64_t picked = 0;
  if (np > 0) {
    const int64_t last = unit_of(np - 1);
    const int64_t first = a.begin + last * a.unit;
    picked = (np - 1) * a.unit + (min(a.end, first + a.unit) - first);
  }
  const int64_t local_begin = a.num_tokens - a.n_local;
  const int64_t total = a.n_init + picked + a.n_local;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.count = static_cast<int32_t>(total);
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t v;
    if (p < a.n_init) {
      v = p;
    } else if (p < a.n_init + picked) {
      const int64_t o = p - a.n_init;
      v = a.begin + unit_of(o / a.unit) * a.unit + o % a.unit;
    } else {
      v = local_begin + (p - a.n_init - picked);
    }
    a.out[p] = static_cast<int32_t>(v);
  }
}

cudaError_t LaunchAssemble(const AssembleArgs& a, int64_t capacity, cudaStream_t stream) {
  AssembleKernel<<<GridFor(capacity, 256, 1024), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// The covering budget: every token, no key read.
__global__ void SelectAllKernel(int32_t* out, int32_t* count, int64_t n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *count = static_cast<int32_t>(n);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

cudaError_t LaunchSelectAll(const SelectionOutput& out, int64_t n, cudaStream_t stream) {
  SelectAllKernel<<<GridFor(n, 256, 1024), 256, 0, stream>>>(out.tokens, out.num_selected, n);
  return cudaGetLastError();
}

AssembleArgs BaseAssemble(const SelectionOutput& out, const SelectionProblem& p) {
  AssembleArgs a;
  a.out = out.tokens;
  a.count = out.num_selected;
  a.begin = p.n_init;
  a.end = p.num_tokens - p.n_local;
  a.n_init = p.n_init;
  a.num_tokens = p.num_tokens;
  a.n_local = p.n_local;
  return a;
}

// ---------------------------------------------------------------------------------------------
// Span choice and the kept list.

// counters: [0] kept intervals, [1] kept entries m (clipped to max_kept), [2] picks min(m, k).
constexpr int kNumCounters = 8;

struct ChooseArgs {
  int32_t* chosen = nullptr;
  int32_t* ivl_begin = nullptr;  // [num_spans + 1]
  int32_t* ivl_offset = nullptr;  // [num_spans + 1]: first kept entry of the interval
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
};

__global__ void __launch_bounds__(kChooseThreads) ChooseSpansKernel(ChooseArgs a) {
  using ScanI64 = cub::BlockScan<long long, kChooseThreads>;
  using ScanInt = cub::BlockScan<int, kChooseThreads>;
  using ReduceInt = cub::BlockReduce<int, kChooseThreads>;
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
                               int64_t pad_token) {
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
__global__ void KeptStatsKernel(float* logits, float2* partial, const int32_t* counters,
                                int64_t n, int num_heads, int64_t chunk) {
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
        const float v = logits[j * num_heads + h];
        if (v > mx) {
          l = l * expf(mx - v) + 1.0f;
          mx = v;
        } else {
          l += expf(v - mx);
        }
      }
      for (int64_t j = max(begin, m) + threadIdx.y; j < end; j += blockDim.y) {
        logits[j * num_heads + h] = -INFINITY;
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
                                   const float2* __restrict__ partial, int blocks,
                                   int num_heads) {
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
// Quest kernels.

__global__ void QuestBoundsKernel(uint4* __restrict__ bounds, const uint4* __restrict__ keys,
                                  const int32_t* __restrict__ slots, int64_t begin, int64_t end,
                                  int64_t page_size, int64_t row_vecs) {
  const int64_t page = blockIdx.x;
  const int64_t p0 = begin + page * page_size;
  const int64_t p1 = min(end, p0 + page_size);
  for (int64_t c = threadIdx.x; c < row_vecs; c += blockDim.x) {
    uint4 first = __ldg(keys + static_cast<int64_t>(__ldg(slots + p0)) * row_vecs + c);
    __nv_bfloat162 lo[4], hi[4];
    const uint32_t* fw = reinterpret_cast<const uint32_t*>(&first);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = *reinterpret_cast<const __nv_bfloat162*>(fw + i);
      hi[i] = lo[i];
    }
#pragma unroll 4
    for (int64_t t = p0 + 1; t < p1; ++t) {
      const uint4 raw = __ldg(keys + static_cast<int64_t>(__ldg(slots + t)) * row_vecs + c);
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] = __hmin2(lo[i], v[i]);
        hi[i] = __hmax2(hi[i], v[i]);
      }
    }
    bounds[(page * 2) * row_vecs + c] = *reinterpret_cast<const uint4*>(lo);
    bounds[(page * 2 + 1) * row_vecs + c] = *reinterpret_cast<const uint4*>(hi);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    QuestScoreKernel(float* __restrict__ scores, const uint4* __restrict__ bounds,
                     const float* __restrict__ query, int64_t num_pages, int num_heads,
                     int num_kv_heads, float scale) {
  constexpr int L = D / 8;
  extern __shared__ float sq[];
  for (int i = threadIdx.x; i < num_heads * D; i += blockDim.x) sq[i] = query[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = num_heads / num_kv_heads;
  const int row_vecs = num_kv_heads * L;
  for (int64_t page = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; page < num_pages;
       page += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const uint4* lo_row = bounds + page * 2 * row_vecs;
    const uint4* hi_row = lo_row + row_vecs;
    float acc = 0.0f;
#pragma unroll 4
    for (int c = lane; c < row_vecs; c += 32) {
      float lo[8], hi[8];
      UnpackBf16x8(__ldg(lo_row + c), lo);
      UnpackBf16x8(__ldg(hi_row + c), hi);
      const int kv = c / L;
      const int sub = c % L;
      for (int gi = 0; gi < group; ++gi) {
        const float* q = sq + (kv * group + gi) * D + sub * 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += fmaxf(q[e] * lo[e], q[e] * hi[e]);
      }
    }
    acc = WarpSum(acc);
    if (lane == 0) scores[page] = scale * acc;
  }
}

// rho = #{p < F : !(scores[F] > scores[p])}: full pages ranked before the short page F.
__global__ void RankCountKernel(unsigned int* rho, const float* __restrict__ scores, int64_t F) {
  using Reduce = cub::BlockReduce<int, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  const float s = scores[F];
  int count = 0;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < F;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    count += !(s > scores[p]) ? 1 : 0;
  }
  const int total = Reduce(tmp).Sum(count);
  if (threadIdx.x == 0 && total > 0) atomicAdd(rho, static_cast<unsigned int>(total));
}

// The final page list: the q full pages of TopK, minus the lowest-ranked one when the short page
// leaves room for only q - 1, plus the short page when it is taken. One block.
__global__ void __launch_bounds__(kChooseThreads)
    QuestChooseKernel(int32_t* units, int32_t* num_units, const int32_t* __restrict__ top,
                      const float* __restrict__ scores, const unsigned int* rho, int64_t q,
                      int64_t F, int64_t r, int64_t k, int64_t page_size) {
  using Reduce = cub::BlockReduce<unsigned long long, kChooseThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ long long s_drop;
  const int64_t rank = static_cast<int64_t>(*rho);
  const bool short_taken = r > 0 && page_size * (rank < q ? rank : q) + r <= k;
  const int64_t f = short_taken ? min(F, (k - r) / page_size) : q;
  const bool drop = f < q;
  if (threadIdx.x == 0) s_drop = -1;
  if (drop) {  // block-uniform
    // Lowest-ranked: lowest score, then highest position (= highest page).
    unsigned long long worst = ~0ull;
    for (int64_t i = threadIdx.x; i < q; i += blockDim.x) {
      const unsigned long long key =
          (static_cast<unsigned long long>(OrderedKey(scores[top[i]])) << 32) |
          (0xffffffffull - static_cast<unsigned long long>(i));
      worst = min(worst, key);
    }
    const unsigned long long w = Reduce(tmp).Reduce(worst, MinOp());
    if (threadIdx.x == 0) s_drop = static_cast<long long>(0xffffffffull - (w & 0xffffffffull));
  }
  __syncthreads();
  const long long skip = s_drop;
  for (int64_t i = threadIdx.x; i < q; i += blockDim.x) {
    if (i == skip) continue;
    units[i - (skip >= 0 && i > skip ? 1 : 0)] = top[i];
  }
  if (threadIdx.x == 0) {
    const int64_t n = f;
    if (short_taken) units[n] = static_cast<int32_t>(F);
    *num_units = static_cast<int32_t>(n + (short_taken ? 1 : 0));
  }
}

// ---------------------------------------------------------------------------------------------
// InfLLM representatives.

__global__ void InfLlmRepsKernel(int32_t* __restrict__ rep_slots,
                                 const float* __restrict__ received, int64_t received_size,
                                 const int32_t* __restrict__ slots, int64_t begin, int64_t end,
                                 int64_t block_size, int64_t reps, int64_t num_blocks) {
  const int lane = threadIdx.x & 31;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (blk >= num_blocks) return;
  const int64_t b0 = begin + blk * block_size;
  const int64_t b1 = min(end, b0 + block_size);
  const int64_t count = min(reps, b1 - b0);
  float prev_v = 0.0f;
  int64_t prev_t = -1;
  for (int64_t r = 0; r < count; ++r) {
    float best_v = 0.0f;
    int64_t best_t = -1;
    for (int64_t t = b0 + lane; t < b1; t += 32) {
      const float v = t < received_size ? received[t] : 0.0f;
      const bool after = prev_t < 0 || v < prev_v || (v == prev_v && t > prev_t);
      if (after && (best_t < 0 || v > best_v || (v == best_v && t < best_t))) {
        best_v = v;
        best_t = t;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
      const int64_t ot = __shfl_xor_sync(0xffffffffu, best_t, off);
      if (ot >= 0 && (best_t < 0 || ov > best_v || (ov == best_v && ot < best_t))) {
        best_v = ov;
        best_t = ot;
      }
    }
    if (lane == 0) rep_slots[blk * reps + r] = slots[best_t];
    prev_v = best_v;
    prev_t = best_t;
  }
  for (int64_t r = count + lane; r < reps; r += 32) rep_slots[blk * reps + r] = -1;
}

// ---------------------------------------------------------------------------------------------
// Workspaces.

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

SpanWorkspace CarveSpan(Carver* c, int64_t num_spans, int64_t max_kept, int64_t num_heads,
                        int64_t k) {
  SpanWorkspace w;
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
  w.score_ws = c->Take<char>(static_cast<int64_t>(ScoreKeysWorkspaceBytes(num_heads)));
  w.topk_ws = c->Take<char>(static_cast<int64_t>(TopKWorkspaceBytes(max_kept)));
  w.topk_out = c->Take<int32_t>(std::min(k, max_kept));
  return w;
}

struct QuestWorkspace {
  void* topk_ws;
  int32_t* topk_out;
  int32_t* units;
  unsigned int* counters;  // [0] rho, [1] number of units
};

QuestWorkspace CarveQuest(Carver* c, int64_t num_pages, int64_t k, int64_t page_size) {
  QuestWorkspace w;
  const int64_t q = k / page_size;
  w.topk_ws = c->Take<char>(static_cast<int64_t>(TopKWorkspaceBytes(num_pages)));
  w.topk_out = c->Take<int32_t>(q);
  w.units = c->Take<int32_t>(q + 1);
  w.counters = c->Take<unsigned int>(kNumCounters);
  return w;
}

struct InfLlmWorkspace {
  void* topk_ws;
  int32_t* topk_out;
};

InfLlmWorkspace CarveInfLlm(Carver* c, int64_t num_blocks, int64_t k, int64_t block_size) {
  InfLlmWorkspace w;
  w.topk_ws = c->Take<char>(static_cast<int64_t>(TopKWorkspaceBytes(num_blocks)));
  w.topk_out = c->Take<int32_t>(k / block_size);
  return w;
}

int64_t NumUnits(const SelectionProblem& p, int64_t unit) {
  if (unit <= 0) return 0;
  const int64_t c = p.num_tokens - p.n_local - p.n_init;
  return c > 0 ? (c + unit - 1) / unit : 0;
}

}  // namespace

int64_t SelectionCapacity(const SelectionProblem& p) {
  return std::min(p.num_tokens, p.n_init + p.k + p.n_local);
}

// ---------------------------------------------------------------------------------------------
// tokenselect_span.

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

size_t SpanSelectWorkspaceBytes(int64_t num_spans, int64_t max_kept, int64_t num_heads,
                                int64_t k) {
  Carver c(nullptr);
  CarveSpan(&c, num_spans, max_kept, num_heads, k);
  return c.used();
}

cudaError_t SpanSelect(const SpanSelectParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  const SpanIndexView& ix = p.index;
  if (!ValidProblem(pr) || ix.num_spans < 0 || ix.num_spans > INT32_MAX - 1 ||
      p.token_budget < 0 || p.max_kept < 0 || p.max_kept > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (Covers(pr)) return LaunchSelectAll(p.out, pr.num_tokens, stream);
  const int64_t begin = pr.n_init;
  const int64_t end = pr.num_tokens - pr.n_local;
  AssembleArgs asm_args = BaseAssemble(p.out, pr);
  if (pr.k == 0) {  // the CPU policy scores nothing
    TS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p.span_scores, 0xff, ix.num_spans * sizeof(float), stream));
    TS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p.kept_tokens, 0xff, p.max_kept * sizeof(int32_t), stream));
    TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.num_kept, 0, sizeof(int32_t), stream));
    return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  }
  Carver carver(p.workspace);
  const SpanWorkspace w = CarveSpan(&carver, ix.num_spans, p.max_kept, pr.num_heads, pr.k);

  // 1. Span scores.
  GroupScoreArgs g;
  g.scores = p.span_scores;
  g.sort_keys = w.keys_in;
  g.sort_values = w.values_in;
  g.chosen = w.chosen;
  g.query = pr.query;
  g.keys = reinterpret_cast<const uint4*>(pr.k_cache);
  g.slots = pr.slots;
  g.span_begin = ix.span_begin;
  g.span_end = ix.span_end;
  g.vector_indptr = ix.vector_indptr;
  g.vector_tokens = ix.vector_tokens;
  g.num_groups = ix.num_spans;
  g.cand_begin = begin;
  g.cand_end = end;
  g.num_tokens = pr.num_tokens;
  g.num_heads = static_cast<int>(pr.num_heads);
  g.num_kv_heads = static_cast<int>(pr.num_kv_heads);
  g.scale = pr.scale;
  TS_CUDA_RETURN_IF_ERROR(
      LaunchGroupScore<true>(g, pr.head_dim, stream));

  // 2. Best first, then the budget walk and the kept intervals.
  if (ix.num_spans > 0) {
    size_t temp_bytes = w.sort_temp_bytes;
    TS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
        w.sort_temp, temp_bytes, w.keys_in, w.keys_out, w.values_in, w.values_out, ix.num_spans,
        0, 32, stream));
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
  ch.cand_begin = begin;
  ch.cand_end = end;
  ch.covered_end = ix.covered_end;
  ch.budget = p.token_budget;
  ch.k = pr.k;
  ch.max_kept = p.max_kept;
  ChooseSpansKernel<<<1, kChooseThreads, 0, stream>>>(ch);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  // 3. The exact soft vote over the kept tokens (padded to max_kept).
  const int64_t n = p.max_kept;
  asm_args.picks = w.topk_out;
  asm_args.map = p.kept_tokens;
  asm_args.num_picks_dev = w.counters + 2;
  asm_args.unit = 1;
  asm_args.begin = 0;
  asm_args.end = pr.num_tokens;
  if (n == 0) return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  KeptListKernel<<<GridFor(n, 256, 2048), 256, 0, stream>>>(
      p.kept_tokens, w.kept_slots, w.ivl_begin, w.ivl_offset, w.counters, pr.slots, n, begin);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  KeyScoreParams sp;
  sp.logits = w.logits;
  sp.head_max = w.head_max;  // overwritten by the statistics over the first m below
  sp.head_inv_sum = w.head_inv_sum;
  sp.query = pr.query;
  sp.k_cache = pr.k_cache;
  sp.slots = w.kept_slots;
  sp.workspace = w.score_ws;
  sp.n = n;
  sp.num_heads = pr.num_heads;
  sp.num_kv_heads = pr.num_kv_heads;
  sp.head_dim = pr.head_dim;
  sp.scale = pr.scale;
  TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  const int stat_blocks = GridFor(n, 64, kMaxStatBlocks);
  const int64_t chunk = (n + stat_blocks - 1) / stat_blocks;
  KeptStatsKernel<<<stat_blocks, dim3(32, 8), 0, stream>>>(
      w.logits, w.partial, w.counters, n, static_cast<int>(pr.num_heads), chunk);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CombineStatsKernel<<<1, dim3(32, 32), 0, stream>>>(w.head_max, w.head_inv_sum, w.partial, stat_blocks,
                                            static_cast<int>(pr.num_heads));
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  VoteParams vp;
  vp.vote = p.kept_votes;
  vp.logits = w.logits;
  vp.head_max = w.head_max;
  vp.head_inv_sum = w.head_inv_sum;
  vp.n = n;
  vp.num_heads = pr.num_heads;
  vp.mode = VoteMode::kSoftVote;
  TS_CUDA_RETURN_IF_ERROR(VoteFromLogits(vp, stream));
  TopKParams tp;
  tp.out = w.topk_out;
  tp.scores = p.kept_votes;
  tp.workspace = w.topk_ws;
  tp.n = n;
  tp.k = pr.k;
  TS_CUDA_RETURN_IF_ERROR(TopK(tp, stream));
  return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
}

// ---------------------------------------------------------------------------------------------
// quest.

int64_t QuestNumPages(const SelectionProblem& problem, int64_t page_size) {
  return NumUnits(problem, page_size);
}

cudaError_t QuestBuildPageBounds(const QuestBoundsParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (pr.num_tokens < 0 || pr.num_kv_heads <= 0 || (pr.head_dim != 64 && pr.head_dim != 128) ||
      p.page_size <= 0 || pr.n_init < 0 || pr.n_local < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t pages = QuestNumPages(pr, p.page_size);
  if (pages == 0) return cudaSuccess;
  if (pages > INT32_MAX) return cudaErrorInvalidValue;
  const int64_t row_vecs = pr.num_kv_heads * pr.head_dim / 8;
  const int threads = static_cast<int>(std::min<int64_t>(256, (row_vecs + 31) / 32 * 32));
  QuestBoundsKernel<<<static_cast<int>(pages), threads, 0, stream>>>(
      reinterpret_cast<uint4*>(p.page_bounds), reinterpret_cast<const uint4*>(pr.k_cache),
      pr.slots, pr.n_init, pr.num_tokens - pr.n_local, p.page_size, row_vecs);
  return cudaGetLastError();
}

size_t QuestSelectWorkspaceBytes(int64_t num_pages, int64_t k, int64_t page_size) {
  Carver c(nullptr);
  CarveQuest(&c, num_pages, k, std::max<int64_t>(page_size, 1));
  return c.used();
}

cudaError_t QuestSelect(const QuestSelectParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (!ValidProblem(pr) || p.page_size <= 0) return cudaErrorInvalidValue;
  if (Covers(pr)) return LaunchSelectAll(p.out, pr.num_tokens, stream);
  const int64_t pages = QuestNumPages(pr, p.page_size);
  const int64_t cands = pr.num_tokens - pr.n_local - pr.n_init;
  const int64_t full = cands / p.page_size;
  const int64_t r = cands % p.page_size;
  const int64_t q = pr.k / p.page_size;  // <= full, since cands > k
  AssembleArgs asm_args = BaseAssemble(p.out, pr);
  asm_args.unit = p.page_size;
  if (pr.k == 0) return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  Carver carver(p.workspace);
  const QuestWorkspace w = CarveQuest(&carver, pages, pr.k, p.page_size);
  const size_t smem = static_cast<size_t>(pr.num_heads) * pr.head_dim * sizeof(float);
  const int grid = GridFor(pages, kWarpsPerBlock, static_cast<int64_t>(NumSms()) * 16);
  const uint4* bounds = reinterpret_cast<const uint4*>(p.page_bounds);
  const int h = static_cast<int>(pr.num_heads);
  const int h_kv = static_cast<int>(pr.num_kv_heads);
  if (pr.head_dim == 64) {
    QuestScoreKernel<64><<<grid, kThreads, smem, stream>>>(p.page_scores, bounds, pr.query, pages,
                                                           h, h_kv, pr.scale);
  } else {
    QuestScoreKernel<128><<<grid, kThreads, smem, stream>>>(p.page_scores, bounds, pr.query,
                                                            pages, h, h_kv, pr.scale);
  }
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TopKParams tp;
  tp.out = w.topk_out;
  tp.scores = p.page_scores;
  tp.workspace = w.topk_ws;
  tp.n = full;
  tp.k = q;
  TS_CUDA_RETURN_IF_ERROR(TopK(tp, stream));
  TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.counters, 0, sizeof(unsigned int), stream));
  if (r > 0 && full > 0) {
    RankCountKernel<<<GridFor(full, 256, 1024), 256, 0, stream>>>(w.counters, p.page_scores,
                                                                   full);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  QuestChooseKernel<<<1, kChooseThreads, 0, stream>>>(
      w.units, reinterpret_cast<int32_t*>(w.counters + 1), w.topk_out, p.page_scores, w.counters,
      q, full, r, pr.k, p.page_size);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  asm_args.picks = w.units;
  asm_args.num_picks_dev = reinterpret_cast<const int32_t*>(w.counters + 1);
  return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
}

// ---------------------------------------------------------------------------------------------
// infllm.

int64_t InfLlmNumBlocks(const SelectionProblem& problem, int64_t block_size) {
  return NumUnits(problem, block_size);
}

cudaError_t InfLlmRepresentatives(const InfLlmRepsParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (pr.num_tokens < 0 || p.block_size <= 0 || p.reps <= 0 || p.received_size < 0 ||
      pr.n_init < 0 || pr.n_local < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = InfLlmNumBlocks(pr, p.block_size);
  if (blocks == 0) return cudaSuccess;
  InfLlmRepsKernel<<<GridFor(blocks, kWarpsPerBlock, INT32_MAX), kThreads, 0, stream>>>(
      p.rep_slots, p.received, p.received_size, pr.slots, pr.n_init, pr.num_tokens - pr.n_local,
      p.block_size, p.reps, blocks);
  return cudaGetLastError();
}

size_t InfLlmSelectWorkspaceBytes(int64_t num_blocks, int64_t k, int64_t block_size) {
  Carver c(nullptr);
  CarveInfLlm(&c, num_blocks, k, std::max<int64_t>(block_size, 1));
  return c.used();
}

cudaError_t InfLlmSelect(const InfLlmSelectParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (!ValidProblem(pr) || p.block_size <= 0 || p.reps <= 0) return cudaErrorInvalidValue;
  if (Covers(pr)) return LaunchSelectAll(p.out, pr.num_tokens, stream);
  const int64_t blocks = InfLlmNumBlocks(pr, p.block_size);
  const int64_t keep = std::min(pr.k / p.block_size, blocks);
  AssembleArgs asm_args = BaseAssemble(p.out, pr);
  asm_args.unit = p.block_size;
  if (keep == 0) return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  Carver carver(p.workspace);
  const InfLlmWorkspace w = CarveInfLlm(&carver, blocks, pr.k, p.block_size);
  GroupScoreArgs g;
  g.scores = p.block_scores;
  g.query = pr.query;
  g.keys = reinterpret_cast<const uint4*>(pr.k_cache);
  g.rep_slots = p.rep_slots;
  g.reps = p.reps;
  g.block_size = p.block_size;
  g.num_groups = blocks;
  g.cand_begin = pr.n_init;
  g.cand_end = pr.num_tokens - pr.n_local;
  g.num_tokens = pr.num_tokens;
  g.num_heads = static_cast<int>(pr.num_heads);
  g.num_kv_heads = static_cast<int>(pr.num_kv_heads);
  g.scale = pr.scale;
  TS_CUDA_RETURN_IF_ERROR(
      LaunchGroupScore<false>(g, pr.head_dim, stream));
  TopKParams tp;
  tp.out = w.topk_out;
  tp.scores = p.block_scores;
  tp.workspace = w.topk_ws;
  tp.n = blocks;
  tp.k = keep;
  TS_CUDA_RETURN_IF_ERROR(TopK(tp, stream));
  asm_args.picks = w.topk_out;
  asm_args.num_picks_host = keep;
  return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
}

}  // namespace tokenselect::kernels::cuda
