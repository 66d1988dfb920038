// Row-wise and elementwise ops of the forward pass (model_ops.h). All memory-bound and small next
// to the GEMMs; written for clarity with coalesced accesses, not tuned further.
//
// EmbeddingKernel: block per token, threads stride over the row: bf16 read, fp32 written.
// RmsNormKernel:   block (256 threads) per row. Pass 1 (optionally x += add, written back) sums
//                  squares in fp32 per thread, then a warp-shuffle + shared-memory tree; pass 2
//                  re-reads the row (L1/L2 hits) and writes bf16. Bytes: 4 dim read (+8 dim with
//                  add), 2 dim written.
// SwiGluKernel:    grid-stride over rows * cols; expf (full precision, not __expf).
// KvAppendKernel:  block per new token; threads copy the k and v rows in 16-byte chunks when the
//                  row, stride and pointers allow it (the common case: d = 64/128), else 2-byte
//                  elements. Slots outside the cache are skipped.
// KvAppendFp8Kernel: the same mapping for an FP8 cache: 8 bf16 in (16 B), 8 e4m3 out (8 B) per
//                  thread and chunk, x * (1 / scale) (exact: powers of two) then the satfinite
//                  conversion; or one element at a time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/model_ops.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void EmbeddingKernel(EmbeddingParams p) {
  const int64_t t = blockIdx.x;
  const int32_t id = p.ids[t];
  float* out = p.out + t * p.dim;
  if (id < 0 || id >= p.vocab) {
    for (int64_t j = threadIdx.x; j < p.dim; j += blockDim.x) out[j] = __int_as_float(0x7fffffff);
    return;
  }
  const __nv_bfloat16* row = p.table + static_cast<int64_t>(id) * p.dim;
  for (int64_t j = threadIdx.x; j < p.dim; j += blockDim.x) out[j] = __bfloat162float(row[j]);
}

// Sum over the block (kThreads threads); every thread gets the result.
__device__ float BlockSum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];  // same order in every thread
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  __shared__ float partial[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* x = p.x + r * p.dim;
  const float* add = p.add != nullptr ? p.add + r * p.dim : nullptr;
  float sum_squares = 0.0f;
  for (int64_t j = threadIdx.x; j < p.dim; j += kThreads) {
    float v = x[j];
    if (add != nullptr) {
      v += add[j];
      x[j] = v;
    }
    sum_squares = fmaf(v, v, sum_squares);
  }
  const float total = BlockSum(sum_squares, partial);
  const float variance = total / static_cast<float>(p.dim);
  const float inv_rms = 1.0f / sqrtf(variance + p.eps);
  __nv_bfloat16* out = p.out + r * p.dim;
  for (int64_t j = threadIdx.x; j < p.dim; j += kThreads) {
    out[j] = __float2bfloat16_rn(__bfloat162float(p.weight[j]) * (x[j] * inv_rms));
  }
}

__global__ void AddKernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void SwiGluKernel(SwiGluParams p) {
  const int64_t n = p.rows * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, j = i - r * p.cols;
    const float g = __bfloat162float(p.gate[r * p.in_stride + j]);
    const float u = __bfloat162float(p.up[r * p.in_stride + j]);
    p.out[i] = __float2bfloat16_rn((g / (1.0f + expf(-g))) * u);
  }
}

template <bool kVector>
__global__ void KvAppendKernel(KvAppendParams p) {
  const int64_t t = blockIdx.x;
  const int32_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;
  const __nv_bfloat16* k = p.k + t * p.src_stride;
  const __nv_bfloat16* v = p.v + t * p.src_stride;
  __nv_bfloat16* kc = static_cast<__nv_bfloat16*>(p.k_cache) + static_cast<int64_t>(slot) * p.row;
  __nv_bfloat16* vc = static_cast<__nv_bfloat16*>(p.v_cache) + static_cast<int64_t>(slot) * p.row;
  if constexpr (kVector) {
    const int64_t chunks = p.row / 8;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      reinterpret_cast<uint4*>(kc)[c] = reinterpret_cast<const uint4*>(k)[c];
      reinterpret_cast<uint4*>(vc)[c] = reinterpret_cast<const uint4*>(v)[c];
    }
  } else {
    for (int64_t j = threadIdx.x; j < p.row; j += blockDim.x) {
      kc[j] = k[j];
      vc[j] = v[j];
    }
  }
}

// 8 values (x * inv) as 8 e4m3 bytes, element 0 in the lowest byte.
__device__ __forceinline__ uint2 QuantizeFp8x8(const uint4& raw, float inv) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = kv_internal::FloatToFp8(__uint_as_float(w[i] << 16) * inv);
    const uint32_t hi = kv_internal::FloatToFp8(__uint_as_float(w[i] & 0xffff0000u) * inv);
    out[i / 2] |= (lo | (hi << 8)) << (16 * (i % 2));
  }
  return make_uint2(out[0], out[1]);
}

template <bool kVector>
__global__ void KvAppendFp8Kernel(KvAppendParams p) {
  const int64_t t = blockIdx.x;
  const int32_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;
  const __nv_bfloat16* k = p.k + t * p.src_stride;
  const __nv_bfloat16* v = p.v + t * p.src_stride;
  uint8_t* kc = static_cast<uint8_t*>(p.k_cache) + static_cast<int64_t>(slot) * p.row;
  uint8_t* vc = static_cast<uint8_t*>(p.v_cache) + static_cast<int64_t>(slot) * p.row;
  if constexpr (kVector) {  // head_dim % 8 == 0: a chunk lies in one head
    const int64_t chunks = p.row / 8;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int64_t head = c * 8 / p.head_dim;
      const float k_inv = 1.0f / p.k_scale[head], v_inv = 1.0f / p.v_scale[head];
      reinterpret_cast<uint2*>(kc)[c] =
          QuantizeFp8x8(reinterpret_cast<const uint4*>(k)[c], k_inv);
      reinterpret_cast<uint2*>(vc)[c] =
          QuantizeFp8x8(reinterpret_cast<const uint4*>(v)[c], v_inv);
    }
  } else {
    for (int64_t j = threadIdx.x; j < p.row; j += blockDim.x) {
      const int64_t head = j / p.head_dim;
      kc[j] = kv_internal::FloatToFp8(__bfloat162float(k[j]) * (1.0f / p.k_scale[head]));
      vc[j] = kv_internal::FloatToFp8(__bfloat162float(v[j]) * (1.0f / p.v_scale[head]));
    }
  }
}

__global__ void __launch_bounds__(kThreads) KvRowBoundsKernel(KvRowBoundsParams p) {
  __shared__ double partial[kThreads];
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* w = p.w + r * p.hidden;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < p.hidden; j += kThreads) {
    const double x = static_cast<double>(__bfloat162float(w[j])) *
                     static_cast<double>(__bfloat162float(p.norm[j]));  // exact
    sum = fma(x, x, sum);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double b = p.bias != nullptr ? fabs(static_cast<double>(__bfloat162float(p.bias[r]))) : 0.0;
    p.out[r] = sqrt(static_cast<double>(p.hidden)) * sqrt(partial[0]) + b;
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int GridFor(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
}

}  // namespace

cudaError_t KvRowBounds(const KvRowBoundsParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.hidden < 0 || p.rows > INT32_MAX) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (p.out == nullptr || p.w == nullptr || p.norm == nullptr) return cudaErrorInvalidValue;
  KvRowBoundsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t Embedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.dim < 0 || p.num_tokens > INT32_MAX) return cudaErrorInvalidValue;
  if (p.num_tokens == 0 || p.dim == 0) return cudaSuccess;
  if (p.out == nullptr || p.table == nullptr || p.ids == nullptr) return cudaErrorInvalidValue;
  EmbeddingKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0 || p.rows > INT32_MAX) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.out == nullptr || p.x == nullptr || p.weight == nullptr) return cudaErrorInvalidValue;
  RmsNormKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t AddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t SwiGlu(const SwiGluParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0 || p.in_stride < p.cols) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.out == nullptr || p.gate == nullptr || p.up == nullptr) return cudaErrorInvalidValue;
  SwiGluKernel<<<GridFor(p.rows * p.cols), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t KvAppend(const KvAppendParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.row < 0 || p.src_stride < p.row || p.num_tokens > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0 || p.row == 0) return cudaSuccess;
  if (p.k_cache == nullptr || p.v_cache == nullptr || p.k == nullptr || p.v == nullptr ||
      p.slots == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>(p.num_tokens);
  if (p.kv_type == KvCacheType::kFp8E4M3) {
    if (p.k_scale == nullptr || p.v_scale == nullptr || p.head_dim <= 0 ||
        p.row % p.head_dim != 0) {
      return cudaErrorInvalidValue;
    }
    const bool vector8 = p.head_dim % 8 == 0 && p.src_stride % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(p.k_cache) % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(p.v_cache) % 8 == 0 && Aligned16(p.k) &&
                         Aligned16(p.v);
    if (vector8) {
      KvAppendFp8Kernel<true><<<blocks, 128, 0, stream>>>(p);
    } else {
      KvAppendFp8Kernel<false><<<blocks, 128, 0, stream>>>(p);
    }
    return cudaGetLastError();
  }
  const bool vector = p.row % 8 == 0 && p.src_stride % 8 == 0 && Aligned16(p.k_cache) &&
                      Aligned16(p.v_cache) && Aligned16(p.k) && Aligned16(p.v);
  if (vector) {
    KvAppendKernel<true><<<blocks, 128, 0, stream>>>(p);
  } else {
    KvAppendKernel<false><<<blocks, 128, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
