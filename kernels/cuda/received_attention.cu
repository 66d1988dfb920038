// The received attention of a forward step's new tokens (span_scoring.h, ChunkReceivedAttention)
// and the chunk's attention map (span_detection.h, ChunkAttentionMap): the GPU twins of
// engine/selection/chunk_attention.cc's ReceivedAttention and ChunkAttentionMap.
//
// ChunkReceivedAttention: three launches, no atomics, so the result does not depend on the
// schedule:
//   RowStatsKernel   grid (row tiles, heads): each row's softmax maximum and 1 / sum over its
//                    causal prefix of the chunk
//   ColumnsKernel    grid (column tiles, heads): per head, the probabilities each column gets
//                    from the rows at or below it, summed over those rows
//   HeadSumKernel    received[j] = the per-head column sums added in head order
// ChunkAttentionMap: RowStatsKernel, then MapKernel (grid (column tiles, row tiles, head parts):
// each part's heads' probabilities added in order into its tile) and SumMapPartsKernel (the
// parts added in order), then the map's column sums in double.
// RowStatsKernel's grid has a third dimension, the key splits: split s takes a row tile's key
// tiles s, s + splits, ..., and MergeRowStatsKernel merges the splits' (max, sum) in order.
// Thirty-seventh session, H100, c = 512, 32 heads (bench_span_cuda --detect, ncu): row
// statistics 316 us and the map 494 us with one block per (row tile, head) and per tile pair
// (2 warps per SM for the map) before the splits and parts.
// Tiles of kTile rows (or columns) x kTile keys; the tile's queries and keys are rotated (RoPE at
// their true positions) as they are loaded into shared memory as fp32. A thread computes a 4 x 4
// block of a tile's logits (8 shared-memory loads per 16 multiply-adds); the 8 threads that share
// rows (pass 1) or columns (pass 2) combine by xor shuffles in a fixed order. The two passes
// compute each logit by the same code (QuadLogits: the same products summed in the same order),
// so the probabilities of pass 2 are those whose sums pass 1 took.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/span_detection.h"
#include "kernels/cuda/span_scoring.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kQuad = 4;                          // a thread's rows (and columns) per tile
constexpr int kParts = 8;                         // threads sharing a row (or column) group
constexpr int kThreads = kTile / kQuad * kParts;  // 64
// Parallelism beyond a (tile, head) per block: a row tile's keys are split among up to
// kStatSplits blocks (their partial statistics merged in split order), and the map's heads among
// up to kMapParts blocks per tile pair (their partial maps added in part order), the latter for
// chunks of up to kMapPartsMaxChunk tokens (the partials take parts * c^2 floats).
constexpr int kStatSplits = 4;
constexpr int kMapParts = 8;
constexpr int64_t kMapPartsMaxChunk = 1024;

int StatSplits(int64_t num_new) {
  const int64_t tiles = (num_new + kTile - 1) / kTile;
  return static_cast<int>(tiles < kStatSplits ? tiles : kStatSplits);
}

int MapParts(int64_t num_new, int64_t num_heads) {
  if (num_new > kMapPartsMaxChunk) return 1;
  return static_cast<int>(num_heads < kMapParts ? num_heads : kMapParts);
}

struct Views {
  const __nv_bfloat16* q;
  int64_t q_row_stride;
  const void* k_cache;
  const float* k_scale;
  const int32_t* slots;
  int64_t first_position;
  int num_new, num_heads, num_kv_heads;
  const float* inv_freq;
  float scale;
  float* row_max;      // [num_heads, num_new]
  float* row_inv_sum;  // [num_heads, num_new]
  float* column_sums;  // [num_heads, num_new]
  float* stat_partial;  // [2, splits, num_heads, num_new]: each split's (max, sum), when splits > 1
  float* map_partial;   // [parts, num_new, num_new]: each part's heads' map, when parts > 1
  int splits;
  int parts;
};

// Rows [t0, t0 + kTile) of the chunk, head h, rotated at their positions, into tile[kTile][D+1]
// (rows past the chunk are zero). Keys when kKeys (h is then the KV head).
template <int D, bool kKeys, bool kFp8>
__device__ void LoadRotated(const Views& v, int t0, int h, float (*tile)[D + 1]) {
  constexpr int kHalf = D / 2;
  for (int idx = threadIdx.x; idx < kTile * kHalf; idx += blockDim.x) {
    const int r = idx / kHalf, e = idx % kHalf;
    const int t = t0 + r;
    float x = 0.0f, y = 0.0f;
    if (t < v.num_new) {
      if constexpr (kKeys) {
        const int64_t base = (static_cast<int64_t>(v.slots[t]) * v.num_kv_heads + h) * D;
        const float s = kFp8 ? v.k_scale[h] : 1.0f;
        x = kv_internal::LoadKvElement<kFp8>(v.k_cache, base + e, s);
        y = kv_internal::LoadKvElement<kFp8>(v.k_cache, base + e + kHalf, s);
      } else {
        const __nv_bfloat16* row = v.q + t * v.q_row_stride + static_cast<int64_t>(h) * D;
        x = __bfloat162float(row[e]);
        y = __bfloat162float(row[e + kHalf]);
      }
      float sn, cs;
      internal::RopeSinCos(static_cast<float>(v.first_position + t) * v.inv_freq[e], &sn, &cs);
      const float a = x;
      x = a * cs - y * sn;
      y = y * cs + a * sn;
    }
    tile[r][e] = x;
    tile[r][e + kHalf] = y;
  }
}

// A thread's kQuad x kQuad logits: rows a[i] . columns b[j] over D, scaled. Both operands are
// tiles in shared memory (padded rows: the 8 column groups' rows fall in different banks).
template <int D>
__device__ __forceinline__ void QuadLogits(const float (*rows)[D + 1], const float (*cols)[D + 1],
                                           int r0, int rstep, int c0, int cstep, float scale,
                                           float (&s)[kQuad][kQuad]) {
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
#pragma unroll
    for (int j = 0; j < kQuad; ++j) s[i][j] = 0.0f;
  }
#pragma unroll 8
  for (int e = 0; e < D; ++e) {
    float x[kQuad], y[kQuad];
#pragma unroll
    for (int i = 0; i < kQuad; ++i) x[i] = rows[r0 + i * rstep][e];
#pragma unroll
    for (int j = 0; j < kQuad; ++j) y[j] = cols[c0 + j * cstep][e];
#pragma unroll
    for (int i = 0; i < kQuad; ++i) {
#pragma unroll
      for (int j = 0; j < kQuad; ++j) s[i][j] = fmaf(x[i], y[j], s[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
#pragma unroll
    for (int j = 0; j < kQuad; ++j) s[i][j] *= scale;
  }
}

// (m, z) <- the merge of two softmax partials (max, sum of exp(s - max)) with (om, oz); an empty
// partial has max -inf and sum 0.
__device__ __forceinline__ void MergeMaxSum(float om, float oz, float* m, float* z) {
  const float nm = fmaxf(*m, om);
  if (nm != -INFINITY) {
    *z = (*m == -INFINITY ? 0.0f : *z * expf(*m - nm)) +
         (om == -INFINITY ? 0.0f : oz * expf(om - nm));
  }
  *m = nm;
}

// Pass 1. Thread t owns rows 4 * (t / 8) + i of the tile and, in each key tile, columns
// (t % 8) + 8 * j (i, j < 4); the 8 threads of a row group combine by xor shuffles.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) RowStatsKernel(Views v) {
  __shared__ float sq[kTile][D + 1];
  __shared__ float sk[kTile][D + 1];
  const int h = blockIdx.y, kv = h / (v.num_heads / v.num_kv_heads);
  const int r0 = blockIdx.x * kTile;
  const int split = blockIdx.z;  // key tiles split, split + splits, ... up to the diagonal
  const int rg = threadIdx.x / kParts, part = threadIdx.x % kParts;
  LoadRotated<D, false, kFp8>(v, r0, h, sq);
  float m[kQuad], z[kQuad];
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
    m[i] = -INFINITY;
    z[i] = 0.0f;
  }
  for (int c0 = split * kTile; c0 <= r0; c0 += v.splits * kTile) {
    __syncthreads();  // the previous key tile is consumed (and the query tile loaded)
    LoadRotated<D, true, kFp8>(v, c0, kv, sk);
    __syncthreads();
    float s[kQuad][kQuad];
    QuadLogits<D>(sq, sk, kQuad * rg, 1, part, kParts, v.scale, s);
#pragma unroll
    for (int i = 0; i < kQuad; ++i) {
      const int row = r0 + kQuad * rg + i;
#pragma unroll
      for (int j = 0; j < kQuad; ++j) {
        const int col = c0 + part + kParts * j;
        if (row >= v.num_new || col > row) continue;
        if (s[i][j] > m[i]) {
          z[i] = z[i] * expf(m[i] - s[i][j]) + 1.0f;  // m = -inf: z is 0 and expf(-inf) 0
          m[i] = s[i][j];
        } else {
          z[i] += expf(s[i][j] - m[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
#pragma unroll
    for (int off = 1; off < kParts; off <<= 1) {
      MergeMaxSum(__shfl_xor_sync(0xffffffffu, m[i], off), __shfl_xor_sync(0xffffffffu, z[i], off),
                  &m[i], &z[i]);
    }
    const int row = r0 + kQuad * rg + i;
    if (part == 0 && row < v.num_new) {
      const int64_t at = static_cast<int64_t>(h) * v.num_new + row;
      if (v.splits == 1) {
        v.row_max[at] = m[i];
        v.row_inv_sum[at] = 1.0f / z[i];
      } else {
        const int64_t plane = static_cast<int64_t>(v.num_heads) * v.num_new;
        v.stat_partial[split * plane + at] = m[i];
        v.stat_partial[(v.splits + split) * plane + at] = z[i];
      }
    }
  }
}

// The splits' (max, sum) of each head and row merged in split order.
__global__ void MergeRowStatsKernel(Views v) {
  const int64_t plane = static_cast<int64_t>(v.num_heads) * v.num_new;
  for (int64_t at = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; at < plane;
       at += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float m = -INFINITY, z = 0.0f;
    for (int s = 0; s < v.splits; ++s) {
      MergeMaxSum(v.stat_partial[s * plane + at], v.stat_partial[(v.splits + s) * plane + at], &m,
                  &z);
    }
    v.row_max[at] = m;
    v.row_inv_sum[at] = 1.0f / z;
  }
}

// Head h's row statistics of rows [r0, r0 + kTile) into sm / sz (zero past the chunk).
__device__ __forceinline__ void LoadRowStats(const Views& v, int r0, int h, float* sm, float* sz) {
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const int row = r0 + i;
    const bool in = row < v.num_new;
    sm[i] = in ? v.row_max[static_cast<int64_t>(h) * v.num_new + row] : 0.0f;
    sz[i] = in ? v.row_inv_sum[static_cast<int64_t>(h) * v.num_new + row] : 0.0f;
  }
}

// The causal probabilities of a tile pair as pass 2's thread layout owns them: for row
// part + 8 i and column 4 cg + j (col <= row < num_new), add(i, j, e, z) with e the row's
// exponential and z its 1 / sum (their product is the probability; callers write the product
// so that it is formed, and rounded, as before).
template <int D, typename Add>
__device__ __forceinline__ void ForTileProbabilities(const Views& v, const float (*sq)[D + 1],
                                                     const float (*sk)[D + 1], const float* sm,
                                                     const float* sz, int r0, int c0, int cg,
                                                     int part, Add add) {
  // s[i][j]: row part + 8 i, column 4 cg + j - the same products in the same order as pass 1.
  float s[kQuad][kQuad];
  QuadLogits<D>(sq, sk, part, kParts, kQuad * cg, 1, v.scale, s);
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
    const int ri = part + kParts * i, row = r0 + ri;
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      const int col = c0 + kQuad * cg + j;
      if (row >= v.num_new || col > row) continue;
      add(i, j, expf(s[i][j] - sm[ri]), sz[ri]);
    }
  }
}

// Pass 2. Thread t owns columns 4 * (t / 8) + j of the tile and, in each query tile, rows
// (t % 8) + 8 * i; the 8 threads of a column group add up by xor shuffles.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) ColumnsKernel(Views v) {
  __shared__ float sq[kTile][D + 1];
  __shared__ float sk[kTile][D + 1];
  __shared__ float sm[kTile], sz[kTile];
  const int h = blockIdx.y, kv = h / (v.num_heads / v.num_kv_heads);
  const int c0 = blockIdx.x * kTile;
  const int cg = threadIdx.x / kParts, part = threadIdx.x % kParts;
  LoadRotated<D, true, kFp8>(v, c0, kv, sk);
  float acc[kQuad] = {};
  for (int r0 = c0; r0 < v.num_new; r0 += kTile) {
    __syncthreads();
    LoadRotated<D, false, kFp8>(v, r0, h, sq);
    LoadRowStats(v, r0, h, sm, sz);
    __syncthreads();
    ForTileProbabilities<D>(v, sq, sk, sm, sz, r0, c0, cg, part,
                            [&](int, int j, float e, float z) { acc[j] += e * z; });
  }
#pragma unroll
  for (int j = 0; j < kQuad; ++j) {
#pragma unroll
    for (int off = 1; off < kParts; off <<= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
    const int col = c0 + kQuad * cg + j;
    if (part == 0 && col < v.num_new) {
      v.column_sums[static_cast<int64_t>(h) * v.num_new + col] = acc[j];
    }
  }
}

__global__ void HeadSumKernel(float* __restrict__ received, const float* __restrict__ column_sums,
                              int num_new, int num_heads) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= num_new) return;
  float sum = 0.0f;
  for (int h = 0; h < num_heads; ++h) sum += column_sums[static_cast<int64_t>(h) * num_new + j];
  received[j] = sum;
}

// The map: grid (column tiles, row tiles). Thread t owns columns 4 * (t / 8) + j and rows
// (t % 8) + 8 * i of its tile; heads are added in order into registers, each probability computed
// as in pass 2 (the same logits, row maximum and 1 / sum). Tiles above the diagonal write zeros.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) MapKernel(Views v, float* __restrict__ map) {
  __shared__ float sq[kTile][D + 1];
  __shared__ float sk[kTile][D + 1];
  __shared__ float sm[kTile], sz[kTile];
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  const int cg = threadIdx.x / kParts, part = threadIdx.x % kParts;
  const int group = v.num_heads / v.num_kv_heads;
  // This block's heads: part blockIdx.z of the map's parts.
  const int h_begin = blockIdx.z * v.num_heads / v.parts;
  const int h_end = (blockIdx.z + 1) * v.num_heads / v.parts;
  float acc[kQuad][kQuad] = {};
  if (c0 <= r0 + kTile - 1) {
    for (int h = h_begin; h < h_end; ++h) {
      __syncthreads();  // the previous head's tiles are consumed
      if (h == h_begin || h % group == 0) LoadRotated<D, true, kFp8>(v, c0, h / group, sk);
      LoadRotated<D, false, kFp8>(v, r0, h, sq);
      LoadRowStats(v, r0, h, sm, sz);
      __syncthreads();
      ForTileProbabilities<D>(v, sq, sk, sm, sz, r0, c0, cg, part,
                              [&](int i, int j, float e, float z) { acc[i][j] += e * z; });
    }
  }
  float* out =
      v.parts == 1 ? map : v.map_partial + static_cast<int64_t>(blockIdx.z) * v.num_new * v.num_new;
#pragma unroll
  for (int i = 0; i < kQuad; ++i) {
    const int row = r0 + part + kParts * i;
    if (row >= v.num_new) continue;
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      const int col = c0 + kQuad * cg + j;
      if (col < v.num_new) out[static_cast<int64_t>(row) * v.num_new + col] = acc[i][j];
    }
  }
}

// map = the parts' maps added in part order.
__global__ void SumMapPartsKernel(Views v, float* __restrict__ map) {
  const int64_t size = static_cast<int64_t>(v.num_new) * v.num_new;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < size;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = v.map_partial[i];
    for (int p = 1; p < v.parts; ++p) sum += v.map_partial[p * size + i];
    map[i] = sum;
  }
}

// received[j] = sum_{i >= j} map[i, j] in double, rows in order (the CPU's ReceivedAttention).
__global__ void MapColumnSumsKernel(float* __restrict__ received, const float* __restrict__ map,
                                    int num_new) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= num_new) return;
  double sum = 0.0;
  for (int i = j; i < num_new; ++i) sum += map[static_cast<int64_t>(i) * num_new + j];
  received[j] = static_cast<float>(sum);
}

}  // namespace

size_t ReceivedAttentionWorkspaceBytes(int64_t num_new, int64_t num_heads) {
  const int64_t plane = std::max<int64_t>(num_new, 1) * std::max<int64_t>(num_heads, 1);
  // Row statistics and column sums, then the splits' partial statistics.
  return static_cast<size_t>((3 + 2 * StatSplits(std::max<int64_t>(num_new, 1))) * plane) *
         sizeof(float);
}

size_t ChunkAttentionMapWorkspaceBytes(int64_t num_new, int64_t num_heads) {
  // Enough for every chunk of up to num_new tokens: the largest chunk with partial maps is
  // min(num_new, kMapPartsMaxChunk).
  const int64_t c = std::min(std::max<int64_t>(num_new, 1), kMapPartsMaxChunk);
  const int parts = MapParts(c, std::max<int64_t>(num_heads, 1));
  return ReceivedAttentionWorkspaceBytes(num_new, num_heads) +
         (parts > 1 ? static_cast<size_t>(parts * c * c) * sizeof(float) : 0);
}

namespace {

bool ValidParams(const ReceivedAttentionParams& p) {
  const bool fp8 = p.kv_type == KvCacheType::kFp8E4M3;
  return !(p.received == nullptr || p.workspace == nullptr || p.q == nullptr ||
           p.k_cache == nullptr || p.slots == nullptr || p.inv_freq == nullptr ||
           (fp8 && p.k_scale == nullptr) || p.num_new < 1 || p.num_new > INT32_MAX / 2 ||
           p.num_heads < 1 || p.num_kv_heads < 1 || p.num_heads % p.num_kv_heads != 0 ||
           p.num_heads > 65535 || (p.head_dim != 64 && p.head_dim != 128) ||
           p.q_row_stride < p.num_heads * p.head_dim || p.first_position < 0 ||
           !std::isfinite(p.scale) || p.scale <= 0.0f);
}

Views MakeViews(const ReceivedAttentionParams& p) {
  float* ws = static_cast<float*>(p.workspace);
  Views v;
  v.q = p.q;
  v.q_row_stride = p.q_row_stride;
  v.k_cache = p.k_cache;
  v.k_scale = p.k_scale;
  v.slots = p.slots;
  v.first_position = p.first_position;
  v.num_new = static_cast<int>(p.num_new);
  v.num_heads = static_cast<int>(p.num_heads);
  v.num_kv_heads = static_cast<int>(p.num_kv_heads);
  v.inv_freq = p.inv_freq;
  v.scale = p.scale;
  const int64_t plane = p.num_new * p.num_heads;
  v.row_max = ws;
  v.row_inv_sum = ws + plane;
  v.column_sums = ws + 2 * plane;
  v.splits = StatSplits(p.num_new);
  v.stat_partial = ws + 3 * plane;
  v.parts = 1;  // ChunkAttentionMap sets its own
  v.map_partial = ws + (3 + 2 * v.splits) * plane;
  return v;
}

// The row statistics, then pass 2 (map == nullptr) or the map.
template <int D, bool kFp8>
cudaError_t LaunchPasses(const Views& v, float* map, cudaStream_t stream) {
  const int tiles = (v.num_new + kTile - 1) / kTile;
  RowStatsKernel<D, kFp8><<<dim3(tiles, v.num_heads, v.splits), kThreads, 0, stream>>>(v);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (v.splits > 1) {
    const int64_t plane = static_cast<int64_t>(v.num_heads) * v.num_new;
    MergeRowStatsKernel<<<static_cast<int>(std::min<int64_t>((plane + 255) / 256, 1024)), 256, 0,
                          stream>>>(v);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (map == nullptr) {
    ColumnsKernel<D, kFp8><<<dim3(tiles, v.num_heads), kThreads, 0, stream>>>(v);
    return cudaGetLastError();
  }
  MapKernel<D, kFp8><<<dim3(tiles, tiles, v.parts), kThreads, 0, stream>>>(v, map);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (v.parts > 1) {
    const int64_t size = static_cast<int64_t>(v.num_new) * v.num_new;
    SumMapPartsKernel<<<static_cast<int>(std::min<int64_t>((size + 255) / 256, 2048)), 256, 0,
                        stream>>>(v, map);
  }
  return cudaGetLastError();
}

cudaError_t Passes(const ReceivedAttentionParams& p, const Views& v, float* map,
                   cudaStream_t stream) {
  const bool fp8 = p.kv_type == KvCacheType::kFp8E4M3;
  if (p.head_dim == 64) {
    return fp8 ? LaunchPasses<64, true>(v, map, stream) : LaunchPasses<64, false>(v, map, stream);
  }
  return fp8 ? LaunchPasses<128, true>(v, map, stream) : LaunchPasses<128, false>(v, map, stream);
}

}  // namespace

cudaError_t ChunkReceivedAttention(const ReceivedAttentionParams& p, cudaStream_t stream) {
  if (!ValidParams(p)) return cudaErrorInvalidValue;
  const Views v = MakeViews(p);
  TS_CUDA_RETURN_IF_ERROR(Passes(p, v, nullptr, stream));
  HeadSumKernel<<<(v.num_new + 255) / 256, 256, 0, stream>>>(p.received, v.column_sums, v.num_new,
                                                             v.num_heads);
  return cudaGetLastError();
}

cudaError_t ChunkAttentionMap(const ReceivedAttentionParams& p, float* map, cudaStream_t stream) {
  if (!ValidParams(p) || map == nullptr) return cudaErrorInvalidValue;
  Views v = MakeViews(p);
  v.parts = MapParts(p.num_new, p.num_heads);
  TS_CUDA_RETURN_IF_ERROR(Passes(p, v, map, stream));
  MapColumnSumsKernel<<<(v.num_new + 127) / 128, 128, 0, stream>>>(p.received, map, v.num_new);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
