// SimpleDecodeAttention (simple_attention.h).
//
// Block (query head, request), 256 threads. The query head is rotated at q_positions[b] into
// shared memory (fp32, pre-scaled). The list is walked in tiles of 256 entries: thread t takes
// entry t of the tile, rotates its key row on the fly (cos/sin of float(position) * inv_freq[i]
// with the accurate sincosf) and writes its score to shared memory; the block then updates an
// online softmax (running max m, sum l) and thread j < head_dim accumulates acc[j] over the
// tile's values. Output bf16(acc / l). Reads 4 d bytes per entry and head (K and V rows), so a
// KV row is re-read by each of the g heads of its group: fine for small models and tests. An FP8
// cache is read element by element (LoadKvElement: e4m3 -> float times the kv head's scale).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/simple_attention.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxDim = 256;

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) SimpleDecodeKernel(DecodeAttentionParams p) {
  __shared__ float q[kMaxDim];
  __shared__ float scores[kThreads];
  __shared__ float tile_max_sm, tile_sum_sm;
  const int head = blockIdx.x, b = blockIdx.y;
  const int d = static_cast<int>(p.head_dim), half = d / 2;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kv_head = head / group;
  const int64_t q_off = (static_cast<int64_t>(b) * p.num_heads + head) * d;
  const float q_pos = static_cast<float>(p.q_positions[b]);
  for (int i = threadIdx.x; i < d; i += kThreads) {
    const int f = i < half ? i : i - half;
    float s, c;
    sincosf(q_pos * p.inv_freq[f], &s, &c);
    const float x = __bfloat162float(p.q[q_off + i]);
    const float partner = __bfloat162float(p.q[q_off + (i < half ? i + half : i - half)]);
    q[i] = (i < half ? x * c - partner * s : x * c + partner * s) * p.scale;
  }
  __syncthreads();
  const int32_t begin = p.indptr[b], end = p.indptr[b + 1];
  const int64_t row = p.num_kv_heads * d;
  const float k_scale = kFp8 ? p.k_scale[kv_head] : 1.0f, v_scale = kFp8 ? p.v_scale[kv_head] : 1.0f;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;  // acc: dim threadIdx.x
  for (int32_t tile = begin; tile < end; tile += kThreads) {
    const int32_t e = tile + static_cast<int32_t>(threadIdx.x);
    float score = -INFINITY;
    if (e < end) {
      const int64_t k = static_cast<int64_t>(p.indices[e]) * row + kv_head * d;
      const float pos = static_cast<float>(p.kv_positions[e]);
      score = 0.0f;
      for (int i = 0; i < half; ++i) {
        float s, c;
        sincosf(pos * p.inv_freq[i], &s, &c);
        const float x1 = kv_internal::LoadKvElement<kFp8>(p.k_cache, k + i, k_scale);
        const float x2 = kv_internal::LoadKvElement<kFp8>(p.k_cache, k + i + half, k_scale);
        score = fmaf(q[i], x1 * c - x2 * s, score);
        score = fmaf(q[i + half], x2 * c + x1 * s, score);
      }
    }
    scores[threadIdx.x] = score;
    __syncthreads();
    if (threadIdx.x == 0) {
      float tile_max = -INFINITY;
      const int count = min(kThreads, end - tile);
      for (int t = 0; t < count; ++t) tile_max = fmaxf(tile_max, scores[t]);
      tile_max_sm = tile_max;
    }
    __syncthreads();
    const float new_m = fmaxf(m, tile_max_sm);
    const float correction = expf(m - new_m);  // 0 on the first tile (m = -inf)
    const int count = min(kThreads, end - tile);
    __syncthreads();
    scores[threadIdx.x] = threadIdx.x < count ? expf(scores[threadIdx.x] - new_m) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int t = 0; t < count; ++t) sum += scores[t];
      tile_sum_sm = sum;
    }
    __syncthreads();
    l = l * correction + tile_sum_sm;
    if (static_cast<int>(threadIdx.x) < d) {
      float a = acc * correction;
      for (int t = 0; t < count; ++t) {
        const int64_t v = static_cast<int64_t>(p.indices[tile + t]) * row + kv_head * d;
        a = fmaf(scores[t], kv_internal::LoadKvElement<kFp8>(p.v_cache, v + threadIdx.x, v_scale),
                 a);
      }
      acc = a;
    }
    m = new_m;
    __syncthreads();
  }
  if (static_cast<int>(threadIdx.x) < d) {
    p.out[q_off + threadIdx.x] = __float2bfloat16_rn(l > 0.0f ? acc / l : 0.0f);
  }
}

}  // namespace

cudaError_t SimpleDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.head_dim <= 0 || p.head_dim > kMaxDim || p.head_dim % 2 != 0 ||
      p.num_kv_heads <= 0 || p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 ||
      p.batch > 65535 || p.num_heads > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  if (p.kv_type == KvCacheType::kFp8E4M3) {
    if (p.k_scale == nullptr || p.v_scale == nullptr) return cudaErrorInvalidValue;
    SimpleDecodeKernel<true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    SimpleDecodeKernel<false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
