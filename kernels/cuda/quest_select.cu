// Quest selection on the GPU: QuestBuildPageBounds, QuestSelect (= QuestScorePages, then
// QuestChoosePages: split so that tensor-parallel ranks can sum their page scores in between)
// and its workspace (span_scoring.h).
//
// Reads every candidate key once (bounds), then only the bounds and the query (selection); writes
// the page bounds, the page scores and the selected set.
//
// Quest: QuestBoundsKernel, one block per page, threads over the row's 16-byte chunks, bf16
// min/max over the page's tokens (exact: min/max of bf16 values are bf16). FP8 keys: 8-byte
// chunks of 8 e4m3, dequantized to bf16 (exact) first, so the bounds are those of the
// dequantized keys. QuestScoreKernel, one
// warp per page: 2 * H_kv * d bf16 of bounds, max(q * lo, q * hi) per channel and head, in fp32.
// The page choice: F full pages and maybe a short last page of r tokens; the greedy takes the
// top q = k / page_size full pages, except that the short page, taken if it fits at its turn
// (its rank rho among the full pages decides: page_size * min(rho, q) + r <= k), leaves room for
// floor((k - r) / page_size) full pages, which is q or q - 1. So: TopK(F, q), rho by a counting
// kernel, and QuestChooseKernel drops the lowest-ranked of the q when needed and appends the short
// page (the highest page index, so it stays last in ascending order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kv_cache_load.cuh"
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
using span_internal::kThreads;
using span_internal::kWarpsPerBlock;
using span_internal::LaunchAssemble;
using span_internal::LaunchSelectAll;
using span_internal::MinOp;
using span_internal::NumSms;
using span_internal::NumUnits;
using span_internal::OrderedKey;
using kv_internal::Bf16x8ToFloat;
using span_internal::ValidProblem;
using span_internal::WarpSum;

// 8 keys of a chunk as 8 bf16: bf16 as they are, FP8 dequantized with the chunk's head scale.
__device__ __forceinline__ uint4 KeysAsBf16(const uint4& raw, const float*, int64_t) {
  return raw;
}
__device__ __forceinline__ uint4 KeysAsBf16(const uint2& raw, const float* scale, int64_t head) {
  return kv_internal::Fp8x8ToBf16x8(raw, __ldg(scale + head));
}

// Raw: uint4 (8 bf16) or uint2 (8 e4m3, with k_scale per head of vecs_per_head chunks).
template <typename Raw>
__global__ void QuestBoundsKernel(uint4* __restrict__ bounds, const Raw* __restrict__ keys,
                                  const int32_t* __restrict__ slots, int64_t begin, int64_t end,
                                  int64_t page_size, int64_t row_vecs,
                                  const float* __restrict__ k_scale, int64_t vecs_per_head) {
  const int64_t page = blockIdx.x;
  const int64_t p0 = begin + page * page_size;
  const int64_t p1 = min(end, p0 + page_size);
  for (int64_t c = threadIdx.x; c < row_vecs; c += blockDim.x) {
    const int64_t head = c / vecs_per_head;
    uint4 first = KeysAsBf16(
        __ldg(keys + static_cast<int64_t>(__ldg(slots + p0)) * row_vecs + c), k_scale, head);
    __nv_bfloat162 lo[4], hi[4];
    const uint32_t* fw = reinterpret_cast<const uint32_t*>(&first);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = *reinterpret_cast<const __nv_bfloat162*>(fw + i);
      hi[i] = lo[i];
    }
#pragma unroll 4
    for (int64_t t = p0 + 1; t < p1; ++t) {
      const uint4 raw = KeysAsBf16(
          __ldg(keys + static_cast<int64_t>(__ldg(slots + t)) * row_vecs + c), k_scale, head);
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
                     int num_kv_heads, float scale, int parts) {
  constexpr int L = D / 8;
  extern __shared__ float sq[];
  for (int i = threadIdx.x; i < num_heads * D; i += blockDim.x) sq[i] = query[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = num_heads / num_kv_heads;
  const int row_vecs = num_kv_heads * L;
  // The KV heads in `parts` equal groups, each scored alone (scaled) and the groups added in a
  // fixed binary tree: a page's score is then the same sum whether one GPU holds the groups or
  // tensor-parallel ranks do (TP-invariant numerics; parts 1 otherwise).
  const int part_vecs = row_vecs / parts;
  for (int64_t page = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; page < num_pages;
       page += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const uint4* lo_row = bounds + page * 2 * row_vecs;
    const uint4* hi_row = lo_row + row_vecs;
    float left = 0.0f, right = 0.0f;  // the tree's two halves: parts 0-1 and 2-3
    for (int part = 0; part < parts; ++part) {
      float acc = 0.0f;
#pragma unroll 4
      for (int c = part * part_vecs + lane; c < (part + 1) * part_vecs; c += 32) {
        float lo[8], hi[8];
        Bf16x8ToFloat(__ldg(lo_row + c), lo);
        Bf16x8ToFloat(__ldg(hi_row + c), hi);
        const int kv = c / L;
        const int sub = c % L;
        for (int gi = 0; gi < group; ++gi) {
          const float* q = sq + (kv * group + gi) * D + sub * 8;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc += fmaxf(q[e] * lo[e], q[e] * hi[e]);
        }
      }
      const float v = scale * WarpSum(acc);
      if (part == 0) left = v;
      if (part == 1) left += v;
      if (part == 2) right = v;
      if (part == 3) right += v;
    }
    if (lane == 0) scores[page] = parts == 4 ? left + right : left;
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
// Workspace.

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

}  // namespace

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
  if (pr.kv_type == KvCacheType::kFp8E4M3) {
    if (pr.k_scale == nullptr) return cudaErrorInvalidValue;
    QuestBoundsKernel<<<static_cast<int>(pages), threads, 0, stream>>>(
        reinterpret_cast<uint4*>(p.page_bounds), static_cast<const uint2*>(pr.k_cache), pr.slots,
        pr.n_init, pr.num_tokens - pr.n_local, p.page_size, row_vecs, pr.k_scale,
        pr.head_dim / 8);
  } else {
    QuestBoundsKernel<<<static_cast<int>(pages), threads, 0, stream>>>(
        reinterpret_cast<uint4*>(p.page_bounds), static_cast<const uint4*>(pr.k_cache), pr.slots,
        pr.n_init, pr.num_tokens - pr.n_local, p.page_size, row_vecs, nullptr, pr.head_dim / 8);
  }
  return cudaGetLastError();
}

size_t QuestSelectWorkspaceBytes(int64_t num_pages, int64_t k, int64_t page_size) {
  Carver c(nullptr);
  CarveQuest(&c, num_pages, k, std::max<int64_t>(page_size, 1));
  return c.used();
}

cudaError_t QuestScorePages(const QuestSelectParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  const int parts = p.head_parts;
  if (!ValidProblem(pr) || p.page_size <= 0 || (parts != 1 && parts != 2 && parts != 4) ||
      pr.num_kv_heads % parts != 0) {
    return cudaErrorInvalidValue;
  }
  if (Covers(pr) || pr.k == 0) return cudaSuccess;  // QuestChoosePages reads no score
  const int64_t pages = QuestNumPages(pr, p.page_size);
  const size_t smem = static_cast<size_t>(pr.num_heads) * pr.head_dim * sizeof(float);
  const int grid = GridFor(pages, kWarpsPerBlock, static_cast<int64_t>(NumSms()) * 16);
  const uint4* bounds = reinterpret_cast<const uint4*>(p.page_bounds);
  const int h = static_cast<int>(pr.num_heads);
  const int h_kv = static_cast<int>(pr.num_kv_heads);
  if (pr.head_dim == 64) {
    QuestScoreKernel<64><<<grid, kThreads, smem, stream>>>(p.page_scores, bounds, pr.query, pages,
                                                           h, h_kv, pr.scale, parts);
  } else {
    QuestScoreKernel<128><<<grid, kThreads, smem, stream>>>(p.page_scores, bounds, pr.query, pages,
                                                            h, h_kv, pr.scale, parts);
  }
  return cudaGetLastError();
}

cudaError_t QuestChoosePages(const QuestSelectParams& p, cudaStream_t stream) {
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
  // This workspace needs no initialisation; TopK's part must be zero at launch.
  TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.topk_ws, 0, TopKWorkspaceBytes(0), stream));
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

cudaError_t QuestSelect(const QuestSelectParams& p, cudaStream_t stream) {
  TS_CUDA_RETURN_IF_ERROR(QuestScorePages(p, stream));
  return QuestChoosePages(p, stream);
}

}  // namespace tokenselect::kernels::cuda
