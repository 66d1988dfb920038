// Chunked-prefill attention over token-index lists (prefill_attention.h): a flash-attention-2
// style tensor-core kernel, its split-KV merge, the generic CUDA-core fallback and the selection
// query of a chunk.
//
// PrefillKernel<D, G>: block (query tile, kv head x split, request), 4 warps, mma.sync m16n8k16
// (bf16 in, fp32 accumulate; sm_80+), the flash-attention-2 layout: 128 rows per block, 32 per
// warp (two m16 tiles, so every K and V fragment read from shared memory feeds two mma), 64-entry
// key tiles.
//   M packing (GQA): row r = query q0 + r / G, head kv * G + r % G, so the G query heads of a kv
//     head share every key and value read (and every RoPE rotation of a key): a 512-query chunk
//     at g = 4 is 16 query tiles per kv head, 128 blocks at the Llama-3-8B shape; PlanPrefillSplits
//     adds KV splits up to about one wave of 2 blocks per SM.
//   Q: the tile's rows are rotated at q_positions (fp32 RoPE, HF rotate_half), pre-scaled by
//     scale * log2(e) and rounded to bf16 into shared memory once; the A fragments are re-read
//     with ldmatrix at every k-step (the registers hold O: 32 x d and S: 32 x 64 per warp).
//   K/V: tiles gathered by slot with cp.async (16 B per copy) into double-buffered, XOR-swizzled
//     shared memory (16 B chunk c of row r at c ^ (r & 7): conflict-free ldmatrix, and the
//     k-step's chunk is one XOR of a per-thread base address); slots come two tiles ahead through
//     a shared ring, positions with the tile. Once a K tile lands, the block rotates it in place
//     (fp32 cos/sin of float(position) * inv_freq with the two-part 2*pi reduction of
//     decode_attention_internal.h, rounded to bf16): each key is rotated once per 128 rows.
//   S = Q K^T, masked by the per-row prefix limit min(visible, split end) only on tiles that reach
//     past the smallest limit of the block; tiles past the largest visible prefix are never
//     loaded. Online softmax (base 2) on the C fragments, rows reduced over the quad; P becomes
//     the A fragments of O += P V in registers (bf16), V's B fragments come from ldmatrix.trans.
//   One split: the block writes bf16 O / l directly (zeros for rows with nothing visible).
//   num_splits > 1: each split covers a 64-aligned range of the request's list and writes its
//     normalised fp32 partial output and log2-sum-exp; PrefillMergeKernel (one warp per (query,
//     head)) combines them.
//   Registers: 255 at d = 128 with no spill (sm_80 and sm_90, nvcc 13.0): the rotate loop is
//     not unrolled and inv_freq lives in shared memory to stay there.
// Precision: rotated q and k are rounded to bf16 before the dot product (as flash attention with
// fused RoPE does), scores and softmax in fp32, P in bf16 for the P V product, fp32 accumulation.
// FP8 cache (kFp8; instantiated in prefill_attention_fp8.cu): the cp.async copies bring raw
// e4m3 rows (16 B = 16 elements per copy, half the bytes) into double-buffered raw tiles; once a
// tile lands, one pass dequantizes its K and V (e4m3 -> half -> float, times the kv head's
// scale, exact in bf16) into single-buffered bf16 tiles (the raw tiles double-buffer the loads;
// the same shared memory as bf16), and from there on it is the bf16 code (rotate, S, softmax,
// P V): bit for bit the bf16 result over the dequantized cache. One extra barrier per tile.
//
// GatherListKernel<D, kFp8>: grid (list entries / 32 or 64, kv head, request); writes entry j of
// request b's list to row kv_indptr[b] + j of a [num_kv_heads][capacity + kBN][D] bf16 K and V
// (capacity = batch x max_kv_len; kBN zero rows after the last list): the key dequantized
// (FP8) and rotated at its position exactly as the attention kernel rotates a landed tile
// (Rotate8 on the bf16 values, rounded to bf16), the value dequantized or copied; then
// PrefillKernel<kGathered> runs the bf16 kernel's loop without the per-tile rotation (and the
// FP8 dequantization), its tiles copied from consecutive rows. A thread per (entry, rotate_half
// chunk): 16 key and 16 value elements.
//
// SimplePrefillKernel: block (query row, head), 256 threads, the SimpleDecodeKernel scheme
// (simple_attention.cu) over the visible prefix of the request's list; either cache type.
//
// SelectionQueryKernel: a cluster of 8 blocks per head on sm_90 (one block elsewhere, and for
// one query), threads (query sub-group, rotate_half pair).
//
// Measured on H200 (bench/prefill_cuda_bench.cu, Llama-3-8B shape, chunk 512, 2 splits):
// dense chunk over 1M cached tokens + the chunk 33.1 ms (266 TFLOP/s; 1 split: 48.8 ms; PyTorch
// flash attention on contiguous pre-rotated K/V, same run: 30.2 ms); TokenSelect list of 2688
// selected + 512 chunk entries 0.120 ms read from the cache, 0.101 ms gathered (gather pass
// included); one TP=2 rank's list (16 / 4 heads) on an FP8 cache 0.083 ms against 0.060 ms
// gathered (4 splits; fourteenth session).
#include "kernels/cuda/prefill_attention.h"

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/prefill_attention_kernel.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using internal::RopeSinCos;
using prefill_internal::kBN;
using prefill_internal::kBM;
using prefill_internal::kMaxSplits;
using prefill_internal::kMinSplitTiles;

bool HasListPointers(const PrefillAttentionParams& p) {
  return p.out != nullptr && p.q != nullptr && p.q_positions != nullptr &&
         p.q_indptr != nullptr && p.visible != nullptr && p.k_cache != nullptr &&
         p.v_cache != nullptr && p.kv_indptr != nullptr && p.kv_indices != nullptr &&
         p.kv_positions != nullptr && p.inv_freq != nullptr &&
         (p.kv_type == KvCacheType::kBf16 || (p.k_scale != nullptr && p.v_scale != nullptr));
}

// ---- The gathered list. ----

constexpr int kGatherThreads = 256;

template <int D, bool kFp8>
__global__ void __launch_bounds__(kGatherThreads)
    GatherListKernel(PrefillAttentionParams p, prefill_internal::SplitWorkspace ws) {
  constexpr int kHalfChunks = D / 16;  // threads per entry
  constexpr int kEntries = kGatherThreads / kHalfChunks;
  const int kv = blockIdx.y, b = blockIdx.z;
  const int64_t list_begin = p.kv_indptr[b];
  const int len = static_cast<int>(p.kv_indptr[b + 1] - list_begin);
  const int j =
      static_cast<int>(blockIdx.x) * kEntries + static_cast<int>(threadIdx.x) / kHalfChunks;
  const int hc = static_cast<int>(threadIdx.x) % kHalfChunks;
  const int64_t row = kv * (ws.capacity + prefill_internal::kBN) + list_begin + j;
  if (j >= len) {
    // The last request's list is followed by kBN zero rows (the attention kernel's last tile
    // reads them, masked).
    if (b + 1 == static_cast<int>(gridDim.z) && j < len + prefill_internal::kBN &&
        list_begin + j < ws.capacity + prefill_internal::kBN) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(ws.gathered_k + row * D + hc * 8) = zero;
      *reinterpret_cast<uint4*>(ws.gathered_k + row * D + D / 2 + hc * 8) = zero;
      *reinterpret_cast<uint4*>(ws.gathered_v + row * D + hc * 8) = zero;
      *reinterpret_cast<uint4*>(ws.gathered_v + row * D + D / 2 + hc * 8) = zero;
    }
    return;
  }
  if (list_begin + j >= ws.capacity) return;
  const int64_t src = static_cast<int64_t>(__ldg(p.kv_indices + list_begin + j)) *
                          p.num_kv_heads * D + kv * D + hc * 8;
  float x[8], y[8];
  uint4 v_lo, v_hi;
  if constexpr (kFp8) {
    const uint8_t* k = static_cast<const uint8_t*>(p.k_cache) + src;
    const uint8_t* v = static_cast<const uint8_t*>(p.v_cache) + src;
    const float ks = __ldg(p.k_scale + kv), vs = __ldg(p.v_scale + kv);
    kv_internal::Bf16x8ToFloat(
        kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(k), ks), x);
    kv_internal::Bf16x8ToFloat(
        kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(k + D / 2), ks), y);
    v_lo = kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(v), vs);
    v_hi = kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(v + D / 2), vs);
  } else {
    const __nv_bfloat16* k = static_cast<const __nv_bfloat16*>(p.k_cache) + src;
    const __nv_bfloat16* v = static_cast<const __nv_bfloat16*>(p.v_cache) + src;
    kv_internal::Bf16x8ToFloat(*reinterpret_cast<const uint4*>(k), x);
    kv_internal::Bf16x8ToFloat(*reinterpret_cast<const uint4*>(k + D / 2), y);
    v_lo = *reinterpret_cast<const uint4*>(v);
    v_hi = *reinterpret_cast<const uint4*>(v + D / 2);
  }
  float freq[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) freq[e] = __ldg(p.inv_freq + hc * 8 + e);
  prefill_internal::Rotate8(x, y, static_cast<float>(__ldg(p.kv_positions + list_begin + j)),
                            freq, 1.0f);
  const int64_t dst = row * D + hc * 8;
  *reinterpret_cast<uint4*>(ws.gathered_k + dst) = prefill_internal::Pack8(x);
  *reinterpret_cast<uint4*>(ws.gathered_k + dst + D / 2) = prefill_internal::Pack8(y);
  *reinterpret_cast<uint4*>(ws.gathered_v + dst) = v_lo;
  *reinterpret_cast<uint4*>(ws.gathered_v + dst + D / 2) = v_hi;
}

template <int D>
cudaError_t LaunchGather(const PrefillAttentionParams& p,
                         const prefill_internal::SplitWorkspace& ws, cudaStream_t stream) {
  constexpr int kEntries = kGatherThreads / (D / 16);
  const dim3 grid(static_cast<unsigned>((p.max_kv_len + prefill_internal::kBN + kEntries - 1) /
                                        kEntries),
                  static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.batch));
  if (p.kv_type == KvCacheType::kFp8E4M3) {
    GatherListKernel<D, true><<<grid, kGatherThreads, 0, stream>>>(p, ws);
  } else {
    GatherListKernel<D, false><<<grid, kGatherThreads, 0, stream>>>(p, ws);
  }
  return cudaGetLastError();
}

bool Gathers(const PrefillAttentionParams& p) {
  if (p.batch <= 0 || p.max_kv_len <= 0) return false;
  switch (p.gather) {
    case PrefillGather::kOn: return true;
    case PrefillGather::kOff: return false;
    default:
      return PrefillGathersList(p.batch, p.num_heads, p.num_kv_heads, p.max_q_len, p.max_kv_len);
  }
}

// ---- Generic fallback. ----

constexpr int kSimpleThreads = 256;
constexpr int kSimpleMaxDim = 256;

template <bool kFp8>
__global__ void __launch_bounds__(kSimpleThreads) SimplePrefillKernel(PrefillAttentionParams p) {
  __shared__ float q[kSimpleMaxDim];
  __shared__ float scores[kSimpleThreads];
  __shared__ float tile_max_sm, tile_sum_sm;
  const int64_t i = blockIdx.x;  // query row
  const int head = blockIdx.y;
  const int d = static_cast<int>(p.head_dim), half = d / 2;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kv_head = head / group;
  // Request of row i: the last b with q_indptr[b] <= i (empty requests skipped).
  int lo = 0, hi = static_cast<int>(p.batch) - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.q_indptr[mid] <= i) lo = mid; else hi = mid - 1;
  }
  const int b = lo;
  const int64_t list_begin = p.kv_indptr[b];
  const int len = static_cast<int>(p.kv_indptr[b + 1] - list_begin);
  const int vis = min(max(p.visible[i], 0), len);
  const int64_t q_off = i * p.q_row_stride + static_cast<int64_t>(head) * d;
  const float q_pos = static_cast<float>(p.q_positions[i]);
  for (int e = threadIdx.x; e < d; e += kSimpleThreads) {
    const int f = e < half ? e : e - half;
    float s, c;
    sincosf(q_pos * p.inv_freq[f], &s, &c);
    const float x = __bfloat162float(p.q[q_off + e]);
    const float partner = __bfloat162float(p.q[q_off + (e < half ? e + half : e - half)]);
    q[e] = (e < half ? x * c - partner * s : x * c + partner * s) * p.scale;
  }
  __syncthreads();
  const int64_t row = p.num_kv_heads * d;
  const float k_scale = kFp8 ? p.k_scale[kv_head] : 1.0f, v_scale = kFp8 ? p.v_scale[kv_head] : 1.0f;
  const int32_t* indices = p.kv_indices + list_begin;
  const int32_t* positions = p.kv_positions + list_begin;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;  // acc: dim threadIdx.x
  for (int tile = 0; tile < vis; tile += kSimpleThreads) {
    const int e = tile + static_cast<int>(threadIdx.x);
    float score = -INFINITY;
    if (e < vis) {
      const int64_t k = static_cast<int64_t>(indices[e]) * row + kv_head * d;
      const float pos = static_cast<float>(positions[e]);
      score = 0.0f;
      for (int f = 0; f < half; ++f) {
        float s, c;
        sincosf(pos * p.inv_freq[f], &s, &c);
        const float x1 = kv_internal::LoadKvElement<kFp8>(p.k_cache, k + f, k_scale);
        const float x2 = kv_internal::LoadKvElement<kFp8>(p.k_cache, k + f + half, k_scale);
        score = fmaf(q[f], x1 * c - x2 * s, score);
        score = fmaf(q[f + half], x2 * c + x1 * s, score);
      }
    }
    scores[threadIdx.x] = score;
    __syncthreads();
    const int count = min(kSimpleThreads, vis - tile);
    if (threadIdx.x == 0) {
      float tile_max = -INFINITY;
      for (int u = 0; u < count; ++u) tile_max = fmaxf(tile_max, scores[u]);
      tile_max_sm = tile_max;
    }
    __syncthreads();
    const float new_m = fmaxf(m, tile_max_sm);
    const float correction = expf(m - new_m);  // 0 on the first tile (m = -inf)
    __syncthreads();
    scores[threadIdx.x] = static_cast<int>(threadIdx.x) < count
                              ? expf(scores[threadIdx.x] - new_m) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int u = 0; u < count; ++u) sum += scores[u];
      tile_sum_sm = sum;
    }
    __syncthreads();
    l = l * correction + tile_sum_sm;
    if (static_cast<int>(threadIdx.x) < d) {
      float a = acc * correction;
      for (int u = 0; u < count; ++u) {
        const int64_t v = static_cast<int64_t>(indices[tile + u]) * row + kv_head * d;
        a = fmaf(scores[u], kv_internal::LoadKvElement<kFp8>(p.v_cache, v + threadIdx.x, v_scale),
                 a);
      }
      acc = a;
    }
    m = new_m;
    __syncthreads();
  }
  if (static_cast<int>(threadIdx.x) < d) {
    p.out[(i * p.num_heads + head) * d + threadIdx.x] =
        __float2bfloat16_rn(l > 0.0f ? acc / l : 0.0f);
  }
}

// ---- Selection query. ----

// One block per head where thread-block clusters are missing (sm_80); on sm_90 a cluster of
// kSelCluster blocks per head, which meet in distributed shared memory.
constexpr int kSelThreads = 1024;
constexpr int kSelClusterThreads = 256;
constexpr int kSelCluster = 8;
constexpr int kSelBatch = 16;  // queries a thread loads before it adds them

// The blocks of head blockIdx.y are ranks 0 .. kBlocks - 1 (blockIdx.x; a cluster when kBlocks
// > 1). Thread (sub, pair) of rank r sums the rotated pair over queries g, g + subs, ... in that
// order (g = r * local subs + sub; subs = kBlocks * kThreads / (head_dim / 2)), issuing the loads
// of kSelBatch queries before it adds any; each block sums its subs in order, then rank 0 sums
// the blocks in rank order. A fixed order for a given kBlocks: deterministic, and every head's
// result is independent of the head count (tensor parallelism).
//
// One block of 1024 threads per head (16 blocks for a TP=2 rank of Llama-3-8B) loading four
// queries per round trip took 9.0 us per layer on a 512-query chunk (sixteenth-session trace,
// H200): latency and the rotations of 512 x 64 pairs on 16 multiprocessors.
template <int kBlocks, int kThreads>
__global__ void __launch_bounds__(kThreads)
    SelectionQueryKernel(float* out, const __nv_bfloat16* q, int64_t q_row_stride, int num_q,
                         int head_dim, int n_local, const float* inv_freq) {
  __shared__ float2 red[kThreads];
  __shared__ float2 block_sum[kThreads];  // [half]: this block's subs summed
  const int head = blockIdx.y;
  const int rank = kBlocks > 1 ? static_cast<int>(blockIdx.x) : 0;
  const int half = head_dim / 2;  // <= 256 <= kThreads
  const int local_subs = kThreads / half;
  const int subs = kBlocks * local_subs;
  const int pair = static_cast<int>(threadIdx.x) % half;
  const int local_sub = static_cast<int>(threadIdx.x) / half;
  float ax = 0.0f, ay = 0.0f;
  if (local_sub < local_subs) {
    const float f = inv_freq[pair];
    const __nv_bfloat16* base = q + static_cast<int64_t>(head) * head_dim + pair;
    for (int i0 = rank * local_subs + local_sub; i0 < num_q; i0 += kSelBatch * subs) {
      __nv_bfloat16 xb[kSelBatch], yb[kSelBatch];
#pragma unroll
      for (int u = 0; u < kSelBatch; ++u) {
        const int i = i0 + u * subs;
        if (i < num_q) {
          const __nv_bfloat16* row = base + static_cast<int64_t>(i) * q_row_stride;
          xb[u] = row[0];
          yb[u] = row[half];
        }
      }
#pragma unroll
      for (int u = 0; u < kSelBatch; ++u) {
        const int i = i0 + u * subs;
        if (i < num_q) {
          const float x = __bfloat162float(xb[u]), y = __bfloat162float(yb[u]);
          float sn, cs;
          RopeSinCos(static_cast<float>(n_local + i) * f, &sn, &cs);
          ax += x * cs - y * sn;
          ay += y * cs + x * sn;
        }
      }
    }
  }
  red[threadIdx.x] = make_float2(ax, ay);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < half) {
    float sx = 0.0f, sy = 0.0f;
    for (int s = 0; s < local_subs; ++s) {
      const float2 v = red[s * half + threadIdx.x];
      sx += v.x;
      sy += v.y;
    }
    block_sum[threadIdx.x] = make_float2(sx, sy);
  }
  const float inv = 1.0f / static_cast<float>(num_q);
  if constexpr (kBlocks == 1) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < half) {
      const float2 v = block_sum[threadIdx.x];
      out[static_cast<int64_t>(head) * head_dim + threadIdx.x] = v.x * inv;
      out[static_cast<int64_t>(head) * head_dim + threadIdx.x + half] = v.y * inv;
    }
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's sums are written
    if (rank == 0 && static_cast<int>(threadIdx.x) < half) {
      float2 v[kBlocks];
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) v[b] = cluster.map_shared_rank(block_sum, b)[threadIdx.x];
      float sx = 0.0f, sy = 0.0f;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        sx += v[b].x;
        sy += v[b].y;
      }
      out[static_cast<int64_t>(head) * head_dim + threadIdx.x] = sx * inv;
      out[static_cast<int64_t>(head) * head_dim + threadIdx.x + half] = sy * inv;
    }
    cluster.sync();  // no block leaves (its shared memory) before rank 0 has read it
#else
    __trap();  // clusters need sm_90: BuildSelectionQuery launches kBlocks = 1 elsewhere
#endif
  }
}

}  // namespace

int PlanPrefillSplits(int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t max_q_len,
                      int64_t max_kv_len, int num_sms) {
  if (batch <= 0 || num_heads <= 0 || num_kv_heads <= 0 || max_q_len <= 0 || max_kv_len <= 0) {
    return 1;
  }
  const int64_t group = std::max<int64_t>(1, num_heads / num_kv_heads);
  const int64_t q_tiles = (max_q_len * group + kBM - 1) / kBM;
  const int64_t units = batch * num_kv_heads * q_tiles;
  // About one wave of 2 blocks per multiprocessor; each range at least kMinSplitTiles key
  // tiles. Measured on H200 (512-query chunk, Llama-3-8B shape, 128 blocks unsplit): 2 splits
  // 265 TFLOP/s against 180 for 1 split (one block per SM hides too little latency).
  const int64_t slots = 2 * static_cast<int64_t>(std::max(1, num_sms));
  const int64_t want = (slots + units / 2) / units;
  const int64_t most = std::max<int64_t>(1, max_kv_len / (kMinSplitTiles * kBN));
  const int64_t cap = std::min<int64_t>(kMaxSplits, 65535 / num_kv_heads);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, most), 1, std::max<int64_t>(1, cap)));
}

bool PrefillGathersList(int64_t batch, int64_t num_heads, int64_t num_kv_heads,
                        int64_t max_q_len, int64_t max_kv_len) {
  if (batch <= 0 || num_kv_heads <= 0 || max_q_len <= 0 || max_kv_len <= 0) return false;
  const int64_t group = std::max<int64_t>(1, num_heads / num_kv_heads);
  return max_q_len * group > kBM && batch * max_kv_len <= kPrefillGatherMaxEntries;
}

size_t PrefillAttentionWorkspaceBytes(const PrefillAttentionParams& p) {
  return static_cast<size_t>((Gathers(p) ? prefill_internal::GatheredBytes(p) : 0) +
                             prefill_internal::PartialBytes(p));
}

cudaError_t PrepareAttentionKernels() {
  using prefill_internal::KvSource;
  for (cudaError_t e : {prefill_internal::ConfigurePrefillKernels<KvSource::kBf16Cache>(),
                        prefill_internal::ConfigurePrefillKernelsGathered(),
                        prefill_internal::ConfigurePrefillKernelsFp8(),
                        internal::ConfigureDecodeMmaKernels(),
                        score_internal::ConfigureScoreKeysMmaKernels()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.total_q < 0 || p.batch > 65535 || p.total_q > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorInvalidValue;
  const int64_t group = p.num_heads / p.num_kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8) return cudaErrorInvalidValue;
  if (p.num_splits < 1 || p.num_splits > kMaxSplits ||
      p.num_kv_heads * p.num_splits > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.total_q == 0) return cudaSuccess;
  if (!HasListPointers(p) || (PrefillAttentionWorkspaceBytes(p) > 0 && p.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.q_row_stride < p.num_heads * p.head_dim || p.max_q_len < 1 ||
      p.max_q_len * group > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  using prefill_internal::KvSource;
  const bool gathered = Gathers(p);
  const prefill_internal::SplitWorkspace ws = prefill_internal::CarveWorkspace(p, gathered);
  if (gathered) {
    TS_CUDA_RETURN_IF_ERROR(p.head_dim == 64 ? LaunchGather<64>(p, ws, stream)
                                             : LaunchGather<128>(p, ws, stream));
    return prefill_internal::PrefillAttentionGathered(p, ws, group, stream);
  }
  return p.kv_type == KvCacheType::kFp8E4M3
             ? prefill_internal::PrefillAttentionFp8(p, ws, group, stream)
             : prefill_internal::DispatchPrefillDim<KvSource::kBf16Cache>(p, ws, group, stream);
}

cudaError_t SimplePrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.total_q < 0 || p.total_q > INT32_MAX || p.head_dim <= 0 ||
      p.head_dim > kSimpleMaxDim || p.head_dim % 2 != 0 || p.num_kv_heads <= 0 ||
      p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.num_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.total_q == 0) return cudaSuccess;
  if (!HasListPointers(p) || p.q_row_stride < p.num_heads * p.head_dim) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.total_q), static_cast<unsigned>(p.num_heads));
  if (p.kv_type == KvCacheType::kFp8E4M3) {
    SimplePrefillKernel<true><<<grid, kSimpleThreads, 0, stream>>>(p);
  } else {
    SimplePrefillKernel<false><<<grid, kSimpleThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t BuildSelectionQuery(float* out, const __nv_bfloat16* q, int64_t q_row_stride,
                                int64_t num_q, int64_t num_heads, int64_t head_dim,
                                int64_t n_local, const float* inv_freq, cudaStream_t stream) {
  if (out == nullptr || q == nullptr || inv_freq == nullptr || num_q < 1 || num_heads < 1 ||
      num_heads > INT32_MAX || head_dim < 2 || head_dim > 512 || head_dim % 2 != 0 ||
      q_row_stride < num_heads * head_dim || n_local < 0 || n_local + num_q - 1 > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (num_heads > 65535) return cudaErrorInvalidValue;  // grid y
  const int nq = static_cast<int>(num_q), dim = static_cast<int>(head_dim);
  const int local = static_cast<int>(n_local);
  if (num_q > 1 && DeviceIsSm90OrLater()) {  // thread-block clusters
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kSelCluster, static_cast<unsigned>(num_heads));
    config.blockDim = dim3(kSelClusterThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = kSelCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, SelectionQueryKernel<kSelCluster, kSelClusterThreads>, out,
                              q, q_row_stride, nq, dim, local, inv_freq);
  }
  SelectionQueryKernel<1, kSelThreads>
      <<<dim3(1, static_cast<unsigned>(num_heads)), kSelThreads, 0, stream>>>(
          out, q, q_row_stride, nq, dim, local, inv_freq);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
