// Selection scoring and soft vote (selection.h: ScoreKeys, VoteFromLogits).
//
// Since the seventh session ScoreKeys runs key_scores_mma.cu's tensor-core kernel for head_dim
// 128 and a query-head group of 4 (Llama-3-8B at TP = 1, 2, 4); the lane kernel below serves
// every other shape. In the same runs (H200, 1M keys, scrambled pages) the tensor-core kernel took
// 0.572 ms for bf16 keys against 0.655 ms here (equal at 512K: 0.299 / 0.298 ms) and 0.330 ms
// for FP8 keys against 0.484 ms here.
//
// Napkin math (Llama-3-8B: H = 32, H_kv = 8, d = 128, bf16 keys): a token's key row is
// H_kv * d * 2 = 2048 B; its logits are H * 4 = 128 B. Choices for the soft vote, per token:
//   (a) write logits in pass 1, re-read them in pass 2:  2048 + 128 + 128 + 4 = 2308 B (89% keys)
//   (b) pass 1 statistics only, pass 2 recomputes:        2 * 2048 + 4       = 4100 B (50% keys)
// so (a): at 1M tokens that is 2.15 GiB, ~0.5 ms at 4.3 TB/s, against 0.47 ms for the keys alone.
//
// ScoreKeysKernel (pass 1). Reads each key row once; writes logits (n x H fp32, LogitIndex) and
// one (max, sum-exp) pair per (block, head); the last block of each group of 32 combines the
// group's, and the last group's combines the groups into head_max and head_inv_sum
// (FinishScoreStats).
// Work mapping: a kv head's d-vector is read by L = d / 8 lanes, 16 bytes each; a
// warp covers 32 / L kv heads ("column"), kv_warps columns cover a token's whole row, and `rows`
// such groups of warps walk the block's token range, T = 32 / g tokens per step for g = 4, 16 / g
// otherwise (StepValues). The lane keeps the g query heads of its kv head (8 dims each) in registers, so q is
// never re-read; each key is used for all g heads. The g * T partial dot products of a step are
// reduced across the L lanes by a reduce-scatter (each lane keeps g T / L of the sums): ~30
// shuffles per step instead of g * T * log2(L). Each lane then owns fixed (token, head) slots and
// keeps an online max/sum for them; the block combines those in shared memory. All loads of a
// step are unconditional (clamped indices) and the next step's slot ids are prefetched.
// Measured (H200, Llama-3-8B shape, 1M tokens): 0.60 ms, 3.57 TB/s of keys (84% of a measured
// 4.25 TB/s device copy). Two fixes got it there from 1.92 ms: the reduce-scatter written as a
// plain loop nest was only partly unrolled (run-time indexed sums), and ?: blends compiled to
// divergent branches; both showed as 930 instructions per token in Nsight Compute.
// Tried for issue 6, none faster (1M tokens; this kernel measured 0.611-0.636 ms over the runs,
// a pure streaming read 4.5 TB/s): keys staged through shared memory by cp.async, 3 stages
// (0.663 ms); a tensor-core version (K . Q^T with mma.sync, q split into bf16 hi + lo, 8 warps
// over the kv heads of a 16-token tile, cp.async stages): 0.610 ms, and its 2-part q split left
// logit errors ~3e-5 that broke the test's vote-sum tolerance; it with L2 prefetch 2 / 4 tiles
// ahead: 0.723 / 0.972 ms; contiguous instead of paged slots: 0.622 ms (0.636 paged, same run).
// All land at ~3.4-3.5 TB/s of keys. What helped: issuing the next step's key loads right after
// this step's dot products (before its reduce-scatter and statistics), for G = 2 and 4 where the
// extra registers fit under 128 (2 blocks of 256 threads per SM still): 0.585 ms at 1M, 3.67 TB/s
// of keys (80% of a measured 4.57 TB/s pure read). bench_read_pattern_cuda shows the access
// pattern itself reaches ~4.2 TB/s with enough loads in flight per SM.
// Also tried (sixth session, H200): the keys staged in shared memory by the bulk-copy engine
// (cp.async.bulk on an mbarrier, whole 2 KiB rows or whole 16-token pages per copy, 3 stages of
// 32 KiB, 2 blocks per SM, a __syncthreads per tile, the same lane arithmetic reading the tile):
// logits bit for bit the same, but 0.597-0.648 ms at 1M against 0.568-0.574 ms for this kernel in
// the same runs (FP8 keys 0.536 vs 0.484 ms; TP=2 decode 308 vs 288 us per layer), so it was not
// kept. More bytes in flight did not help once the per-tile block barrier was added.

// FP8 keys (kFp8): each lane loads 8 B (its 8 dims as e4m3) instead of 16 and converts them
// (e4m3 -> half -> float) before the same arithmetic: the same coalescing (a warp reads 32 x 8
// contiguous bytes per kv-head group) and half the bytes. The kv head's power-of-two scale is
// folded into the lane's query registers instead (q * s times float(e4m3) is exactly q times
// the dequantized key), so the logits are bit for bit those of the dequantized bf16 keys.

// The skip flag (selection.h): every kernel returns before writing anything when it is set; the
// score kernel's workspace counter then stays at 0, ready for the next launch.
//
// VoteKernel (pass 2). A lane per token, reading the token's 16 bytes of each 4-head chunk (a
// warp's load: 512 contiguous bytes of one chunk); the per-head statistics in shared memory
// (broadcast reads). The heads are summed in a fixed order (4 per chunk, then a pairwise tree
// over the chunks), so equal logits give equal votes. Other head counts: one thread per token,
// heads in order.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/key_scores_internal.cuh"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/top_k_digit.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using score_internal::CarveScoreWorkspace;
using score_internal::CombineStats;
using score_internal::FinishScoreStats;
using score_internal::PlanScoreGrid;
using score_internal::ResidentBlocks;
using score_internal::ScoreGrid;
using score_internal::ScoreWorkspace;

constexpr int kMaxScoreThreads = 512;
// (token, head) partial sums per lane group per step: 32 for groups of 4, else 16 (key
// loads of a step stay at 16 x 16 B per lane for small groups; for groups of 8 the 64 query
// registers leave no room for 32 sums on sm_80 once the end is a device value).
template <int G>
__host__ __device__ constexpr int StepValues() { return G == 4 ? 32 : 16; }

// 8 FP8 keys (one lane's dims) as fp32, times their kv head's scale.
__device__ __forceinline__ void UnpackKeys8(const uint2& raw, float scale, float* out) {
  kv_internal::Fp8x8ToFloat(raw, scale, out);
}
__device__ __forceinline__ void UnpackKeys8(const uint4& raw, float, float* out) {
  kv_internal::Bf16x8ToFloat(raw, out);
}

// mask ? a : b, bitwise.
__device__ __forceinline__ float Blend(float a, float b, uint32_t mask) {
  return __uint_as_float((__float_as_uint(a) & mask) | (__float_as_uint(b) & ~mask));
}

// One reduce-scatter step per level, all indices compile-time constants (a plain loop nest was
// only partly unrolled and indexed the sums at run time). At offset kOff the lane with that bit
// set keeps the upper half of its kHalf * 2 sums and sends the lower half to its partner.
template <int kOff, int kHalf>
struct ReduceScatter {
  static __device__ __forceinline__ void Run(float* v, int sub) {
    const uint32_t upper = (sub & kOff) != 0 ? 0xffffffffu : 0u;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      // Bitwise blends (one LOP3 each): a ?: here became divergent branches.
      const float send = Blend(v[i], v[i + kHalf], upper);
      const float keep = Blend(v[i + kHalf], v[i], upper);
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
    }
    ReduceScatter<kOff / 2, kHalf / 2>::Run(v, sub);
  }
};
template <int kHalf>
struct ReduceScatter<0, kHalf> {
  static __device__ __forceinline__ void Run(float*, int) {}
};

template <int D, int G, bool kFp8>
__global__ void __launch_bounds__(kMaxScoreThreads)
    ScoreKeysKernel(KeyScoreParams p, ScoreWorkspace ws, int kv_warps, int rows, int64_t chunk) {
  using Raw = std::conditional_t<kFp8, uint2, uint4>;  // a lane's 8 dims
  constexpr int L = D / 8;           // lanes per kv head
  constexpr int KPW = 32 / L;        // kv heads per warp
  constexpr int NV = StepValues<G>();
  constexpr int T = NV / G;          // tokens per step
  constexpr int VPL = NV / L;        // sums each lane keeps after the reduce-scatter
  extern __shared__ float2 sm_stats[];  // [rows][kv_warps][32][VPL]
  if (p.skip != nullptr && *p.skip != 0) return;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wk = warp % kv_warps;
  const int row = warp / kv_warps;
  const int sub = lane % L;
  const int kv = wk * KPW + lane / L;
  const bool kv_ok = kv < p.num_kv_heads;
  const int num_heads = static_cast<int>(p.num_heads);
  // Token indices in 32 bits (n < 2^31, ScoreKeys checks): 64-bit ones cost the registers the
  // pipelined instantiations lack once the end is no longer a kernel parameter (a device
  // length). n is at least 1 (selection.h: the loads below clamp to token n - 1).
  const int32_t n = static_cast<int32_t>(max(ResolveLength(p.device_n, p.n), int64_t{1}));
  const int32_t begin = static_cast<int32_t>(blockIdx.x * chunk);
  const int32_t end = static_cast<int32_t>(min(static_cast<int64_t>(n), begin + chunk));

  // FP8: the query times the kv head's key scale (exact), which the key loop leaves out.
  const float k_scale = kFp8 && kv_ok ? p.k_scale[kv] : 1.0f;
  float q[G][8];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      q[gi][e] = kv_ok ? p.query[(kv * G + gi) * D + sub * 8 + e] * k_scale : 0.0f;
    }
  }
  float2 stats[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) stats[i] = make_float2(-INFINITY, 0.0f);

  const Raw* keys = static_cast<const Raw*>(p.k_cache);
  const int64_t row_vecs = p.num_kv_heads * (D / 8);
  // Loads are unconditional (token and kv head clamped into range, results masked later) so that
  // the compiler issues a step's T key loads back to back; the next step's slot ids are fetched
  // before this step's arithmetic, so the slot -> key dependency costs no extra latency.
  const int kv_load = kv_ok ? kv : static_cast<int>(p.num_kv_heads) - 1;
  const int32_t stride = rows * T;
  int32_t base = begin + row * T;
  int32_t slot[T];
#pragma unroll
  for (int t = 0; t < T; ++t) slot[t] = __ldg(p.slots + min(base + t, end - 1));
  // Software pipeline (G = 2, 4: it fits in 128 registers; G = 1, 8 would spill): a step's key
  // loads are issued right after the previous step's dot products, so they are in flight during
  // its reduce-scatter and statistics update (the key registers are free by then; v[] holds the
  // sums). Without it a step's loads are issued at the top of the step.
  constexpr bool kPipeline = G == 2 || G == 4;
  Raw raw[T];
  auto load_keys = [&]() {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      raw[t] = __ldg(keys + static_cast<int64_t>(slot[t]) * row_vecs + kv_load * L + sub);
    }
  };
  if constexpr (kPipeline) {
    load_keys();
#pragma unroll
    for (int t = 0; t < T; ++t) slot[t] = __ldg(p.slots + min(base + stride + t, end - 1));
  }
  for (; base < end; base += stride) {
    if constexpr (!kPipeline) {
      load_keys();
#pragma unroll
      for (int t = 0; t < T; ++t) slot[t] = __ldg(p.slots + min(base + stride + t, end - 1));
    }
    float v[NV];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float k8[8];
      UnpackKeys8(raw[t], 1.0f, k8);
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(q[gi][e], k8[e], acc);
        v[t * G + gi] = acc;
      }
    }
    if constexpr (kPipeline) {
      // The next step's keys (clamped into range past the end: an L2 hit, results unused) and
      // the slot ids of the step after it.
      load_keys();
#pragma unroll
      for (int t = 0; t < T; ++t) slot[t] = __ldg(p.slots + min(base + 2 * stride + t, end - 1));
    }
    // Reduce-scatter over the L lanes of a kv head: afterwards lane `sub` holds the full sums
    // sub*VPL .. sub*VPL+VPL-1.
    ReduceScatter<L / 2, NV / 2>::Run(v, sub);
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int idx = sub * VPL + i;
      const int32_t tok = base + idx / G;
      if (kv_ok && tok < end) {
        const float s = v[i] * p.scale;
        p.logits[LogitIndex(tok, kv * G + idx % G, p.n, num_heads)] = s;
        // Branch-free online update (lanes disagree on "new max" often early on).
        const float m_new = fmaxf(stats[i].x, s);
        stats[i].y = stats[i].y * __expf(stats[i].x - m_new) + __expf(s - m_new);
        stats[i].x = m_new;
      }
    }
  }

  PdlAllowDependents();  // the vote may launch: what is left is this block's statistics
  // Block partials: head h's states sit at fixed (row, column, lane, slot) positions.
#pragma unroll
  for (int i = 0; i < VPL; ++i) sm_stats[threadIdx.x * VPL + i] = stats[i];
  __syncthreads();
  for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
    const int hk = h / G, gi = h % G;
    const int col = hk / KPW, lane_base = (hk % KPW) * L;
    float2 acc = make_float2(-INFINITY, 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int t = 0; t < T; ++t) {
        const int idx = t * G + gi;
        const int thread = (r * kv_warps + col) * 32 + lane_base + idx / VPL;
        acc = CombineStats(acc, sm_stats[thread * VPL + idx % VPL]);
      }
    }
    ws.partial[blockIdx.x * num_heads + h] = acc;
  }

  FinishScoreStats(p, ws);
}

// VoteParams::top_k_workspace: the block's histogram of its votes' first radix digit in shared
// memory (kTopBins words after the statistics), added into the TopK workspace's at the end (its
// non-zero bins only). Every thread constructs it (zeroing its share) and calls Flush. The
// top-k then skips its own first pass and a grid barrier (top_k.cu). H200, same binary, with
// and without (twenty-second session): selection 0.0425 -> 0.0415 ms at 32K on two hosts; at 1M
// 0.5888 -> 0.5874-0.5877 and the decode step 0.6042 -> 0.6028 on one, equal on the other.
class VoteHistogram {
 public:
  __device__ VoteHistogram(const VoteParams& p, float* smem)
      : global_(static_cast<uint32_t*>(p.top_k_workspace)),
        bins_(reinterpret_cast<uint32_t*>(smem)) {
    if (global_ == nullptr) return;
    for (int b = threadIdx.x; b < top_k_digit::kTopBins; b += blockDim.x) bins_[b] = 0u;
    __syncthreads();
  }
  __device__ void Add(float vote) {
    if (global_ != nullptr) {
      atomicAdd(&bins_[top_k_digit::TopDigit(top_k_digit::OrderedKey(vote))], 1u);
    }
  }
  __device__ void Flush() {
    if (global_ == nullptr) return;
    __syncthreads();
    for (int b = threadIdx.x; b < top_k_digit::kTopBins; b += blockDim.x) {
      if (bins_[b] != 0u) atomicAdd(&global_[top_k_digit::kHist0 + b], bins_[b]);
    }
  }

 private:
  uint32_t* global_;
  uint32_t* bins_;
};

// kChunks = num_heads / 4 chunks of 4 heads (LogitIndex: chunk c is a contiguous [n][4] block).
// A lane takes one token of each 32 consecutive ones and loads its 16 bytes of every chunk, so a
// load instruction of the warp reads 512 contiguous bytes of one chunk. (Before, kChunks lanes
// shared a token, one chunk each, their sums meeting in an xor tree: with the chunked layout a
// load then took 8 pieces of 64 bytes, and the vote at 512K went 16.7 -> 24.8 us.) The lane sums
// its chunks in the tree order of that xor butterfly, so the votes keep their bits.
// Tokens per lane and step of VoteKernel<chunks>: at least 4 loads in flight per lane.
__host__ __device__ constexpr int VoteTokensPerLane(int64_t chunks) {
  return chunks >= 4 ? 1 : static_cast<int>(4 / chunks);
}

template <int kChunks>
__global__ void VoteKernel(VoteParams p) {
  extern __shared__ float sm_head[];  // [2 * num_heads]: max, inv_sum; then VoteHistogram's
  PdlWait();  // launched as a dependent of ScoreKeys (or whatever preceded it)
  PdlAllowDependents();  // every block has started: the top-k may launch and wait
  if (p.skip != nullptr && *p.skip != 0) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  const int num_heads = static_cast<int>(p.num_heads);
  const bool soft = p.mode == VoteMode::kSoftVote;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // kUnroll tokens per lane per step, loads first (clamped, results masked). The first step's
  // loads go out before the statistics', so that the two round trips overlap (nineteenth
  // session: the vote at 512K 17.1 -> 16.6-16.7 us).
  constexpr int kUnroll = VoteTokensPerLane(kChunks);
  constexpr int64_t kStep = 32 * kUnroll;
  const float4* chunks = reinterpret_cast<const float4*>(p.logits);  // chunk c: + c * p.n
  float4 s[kUnroll][kChunks];
  auto load_step = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = min(base + u * 32 + lane, n - 1);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) s[u][c] = __ldcs(chunks + c * p.n + j);
    }
  };
  const int64_t first = warp * kStep;
  if (first < n) load_step(first);
  VoteHistogram hist(p, sm_head + 2 * num_heads);
  for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
    sm_head[h] = soft ? p.head_max[h] : 0.0f;
    sm_head[num_heads + h] = soft ? p.head_inv_sum[h] : 1.0f;
  }
  __syncthreads();
  const float4* m4 = reinterpret_cast<const float4*>(sm_head);
  const float4* inv4 = reinterpret_cast<const float4*>(sm_head + num_heads);
  for (int64_t base = first; base < n; base += warps * kStep) {
    if (base != first) load_step(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float v[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 m = m4[c], inv = inv4[c];
        const float sv[4] = {s[u][c].x, s[u][c].y, s[u][c].z, s[u][c].w};
        const float me[4] = {m.x, m.y, m.z, m.w}, ie[4] = {inv.x, inv.y, inv.z, inv.w};
        float vote = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) vote += soft ? expf(sv[e] - me[e]) * ie[e] : sv[e];
        v[c] = vote;
      }
#pragma unroll
      for (int off = 1; off < kChunks; off <<= 1) {
#pragma unroll
        for (int c = 0; c + off < kChunks; c += 2 * off) v[c] += v[c + off];
      }
      const int64_t j = base + u * 32 + lane;
      if (j < n) {
        p.vote[j] = v[0];
        hist.Add(v[0]);
      }
    }
  }
  hist.Flush();
}

// Any head count: one thread per token, heads in order.
__global__ void VoteScalarKernel(VoteParams p) {
  extern __shared__ float sm_head[];
  PdlWait();
  PdlAllowDependents();
  if (p.skip != nullptr && *p.skip != 0) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  const int num_heads = static_cast<int>(p.num_heads);
  const bool soft = p.mode == VoteMode::kSoftVote;
  VoteHistogram hist(p, sm_head + 2 * num_heads);
  if (soft) {
    for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
      sm_head[h] = p.head_max[h];
      sm_head[num_heads + h] = p.head_inv_sum[h];
    }
  }
  __syncthreads();
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float vote = 0.0f;
    for (int h = 0; h < num_heads; ++h) {
      const float s = __ldcs(p.logits + LogitIndex(j, h, p.n, num_heads));
      vote += soft ? expf(s - sm_head[h]) * sm_head[num_heads + h] : s;
    }
    p.vote[j] = vote;
    hist.Add(vote);
  }
  hist.Flush();
}

template <int D, int G, bool kFp8>
cudaError_t LaunchScoreKeys(const KeyScoreParams& p, cudaStream_t stream) {
  constexpr int L = D / 8;
  constexpr int KPW = 32 / L;
  constexpr int NV = StepValues<G>();
  constexpr int T = NV / G;
  const int kv_warps = static_cast<int>((p.num_kv_heads + KPW - 1) / KPW);
  if (kv_warps * 32 > kMaxScoreThreads) return cudaErrorInvalidValue;
  const int rows = std::max(1, 8 / kv_warps);
  const int threads = kv_warps * rows * 32;
  const size_t smem = static_cast<size_t>(threads) * (NV / L) * sizeof(float2);

  static std::atomic<int64_t> resident_cache{0};
  int64_t resident = 0;
  TS_CUDA_RETURN_IF_ERROR(ResidentBlocks(ScoreKeysKernel<D, G, kFp8>, threads, smem,
                                         &resident_cache, &resident));
  const ScoreGrid grid =
      PlanScoreGrid(p.n, static_cast<int64_t>(rows) * T, resident);
  ScoreKeysKernel<D, G, kFp8><<<grid.blocks, threads, smem, stream>>>(
      p, CarveScoreWorkspace(p.workspace, p.num_heads), kv_warps, rows, grid.chunk);
  return cudaGetLastError();
}

template <int D, bool kFp8>
cudaError_t DispatchGroup(const KeyScoreParams& p, int64_t group, cudaStream_t stream) {
  switch (group) {
    case 1: return LaunchScoreKeys<D, 1, kFp8>(p, stream);
    case 2: return LaunchScoreKeys<D, 2, kFp8>(p, stream);
    case 4: return LaunchScoreKeys<D, 4, kFp8>(p, stream);
    case 8: return LaunchScoreKeys<D, 8, kFp8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool kFp8>
cudaError_t DispatchDim(const KeyScoreParams& p, int64_t group, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return DispatchGroup<64, kFp8>(p, group, stream);
    case 128: return DispatchGroup<128, kFp8>(p, group, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

size_t ScoreKeysWorkspaceBytes(int64_t num_heads) {
  return score_internal::ScoreWorkspaceSize(num_heads);
}

cudaError_t ScoreKeys(const KeyScoreParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.n > INT32_MAX - (int64_t{1} << 20) || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  const int64_t group = p.num_heads / p.num_kv_heads;
  if (p.kv_type == KvCacheType::kFp8E4M3 && p.k_scale == nullptr) return cudaErrorInvalidValue;
  // Tensor cores where the shape allows (key_scores_mma.cu), else the lane kernel.
  const cudaError_t mma = score_internal::LaunchScoreKeysMma(p, stream);
  if (mma != cudaErrorNotSupported) return mma;
  if (p.vote_bound != nullptr) return cudaErrorInvalidValue;  // tensor-core shapes only
  if (p.kv_type == KvCacheType::kFp8E4M3) return DispatchDim<true>(p, group, stream);
  return DispatchDim<false>(p, group, stream);
}

cudaError_t VoteFromLogits(const VoteParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.num_heads <= 0 || p.num_heads > 4096) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  const int threads = 256;
  // The statistics, then (top_k_workspace) the histogram's bins.
  const bool histogram = p.top_k_workspace != nullptr;
  if (histogram && reinterpret_cast<uintptr_t>(p.top_k_workspace) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = 2 * p.num_heads * sizeof(float) +
                      (histogram ? top_k_digit::kTopBins * sizeof(uint32_t) : 0);
  const int64_t chunks = p.num_heads / 4;
  const bool vector = p.num_heads % 4 == 0 && chunks <= 32 && (chunks & (chunks - 1)) == 0;
  const int64_t tokens_per_block = vector ? threads * VoteTokensPerLane(chunks) : threads;
  int64_t blocks = (p.n + tokens_per_block - 1) / tokens_per_block;
  void (*kernel)(VoteParams) = VoteScalarKernel;
  switch (vector ? chunks : 0) {
    case 1: kernel = VoteKernel<1>; break;
    case 2: kernel = VoteKernel<2>; break;
    case 4: kernel = VoteKernel<4>; break;
    case 8: kernel = VoteKernel<8>; break;
    case 16: kernel = VoteKernel<16>; break;
    case 32: kernel = VoteKernel<32>; break;
    default: break;
  }
  // At most 4 waves of resident blocks, striding over the rest: on a selection-cache hit every
  // block only reads the skip flag and returns, and launching 8192 of them (1M tokens) cost
  // ~7 us more than 4 waves; the vote itself measured the same (H200, eighteenth session).
  // With the histogram: one wave, each block's bins added once. One occupancy per variant for
  // the instantiations: a bound.
  static std::atomic<int64_t> resident_cache[2] = {};
  int64_t resident = 0;
  TS_CUDA_RETURN_IF_ERROR(
      ResidentBlocks(kernel, threads, smem, &resident_cache[histogram ? 1 : 0], &resident));
  blocks = std::min(blocks, (histogram ? 1 : 4) * resident);
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), smem, stream,
                   /*cooperative=*/false, p);
}

}  // namespace tokenselect::kernels::cuda
