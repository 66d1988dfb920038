// Row-wise and elementwise ops of the forward pass (model_ops.h). All memory-bound and small next
// to the GEMMs; written for clarity with coalesced accesses, not tuned further.
//
// At decode (one row) these ops are latency-bound: a loop of dependent scalar loads costs one
// memory round trip per iteration (RmsNorm of a 4096 row took 7.8 us, the embedding 7.1 us on an
// H200; bench/trace). So the common shapes take vector paths that issue all of a thread's loads
// at once (16-byte loads, unrolled), with the scalar kernels kept for odd sizes and alignments.
//
// EmbeddingKernel: block per token, threads stride over the row: bf16 read, fp32 written
//                  (8 elements per 16-byte load when dim % 8 == 0 and the pointers allow).
// RmsNormKernel:   block (256 threads) per row. Pass 1 (optionally x += add, written back) sums
//                  squares in fp32 per thread, then a warp-shuffle + shared-memory tree; pass 2
//                  re-reads the row (L1/L2 hits) and writes bf16. Bytes: 4 dim read (+8 dim with
//                  add), 2 dim written. RmsNormVecKernel<V> (dim % 4 == 0, dim <= 1024 V, aligned):
//                  thread t holds float4s t, t + 256, ... of the row in registers (and its
//                  weights, loaded before the reduction), so the row is read once.
// SwiGluKernel:    grid-stride over rows * cols; expf (full precision, not __expf); 8 elements
//                  per 16-byte load when cols and in_stride are multiples of 8.
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

// dim % 8 == 0, table and out 16-byte aligned: every load of a thread issued before any store.
__global__ void EmbeddingVecKernel(EmbeddingParams p) {
  constexpr int kUnroll = 4;
  const int64_t t = blockIdx.x;
  const int32_t id = p.ids[t];
  float4* out = reinterpret_cast<float4*>(p.out + t * p.dim);
  const int64_t n8 = p.dim / 8;
  if (id < 0 || id >= p.vocab) {
    const float nan = __int_as_float(0x7fffffff);
    for (int64_t j = threadIdx.x; j < 2 * n8; j += blockDim.x) {
      out[j] = make_float4(nan, nan, nan, nan);
    }
    return;
  }
  const uint4* row = reinterpret_cast<const uint4*>(p.table + static_cast<int64_t>(id) * p.dim);
  for (int64_t j0 = threadIdx.x; j0 < n8; j0 += kUnroll * blockDim.x) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + u * blockDim.x;
      if (j < n8) raw[u] = __ldg(row + j);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + u * blockDim.x;
      if (j < n8) {
        float f[8];
        kv_internal::Bf16x8ToFloat(raw[u], f);
        out[2 * j] = make_float4(f[0], f[1], f[2], f[3]);
        out[2 * j + 1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
  }
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

// 4 bf16 as 8 bytes.
__device__ __forceinline__ uint2 PackBf16x4(float a, float b, float c, float d) {
  const uint32_t lo = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
                      (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16);
  const uint32_t hi = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(c))) |
                      (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(d))) << 16);
  return make_uint2(lo, hi);
}

// kVec float4s per thread: dim / 4 <= kVec * kThreads. x, add 16-byte and weight, out 8-byte
// aligned (the launcher checks).
template <int kVec>
__global__ void __launch_bounds__(kThreads) RmsNormVecKernel(RmsNormParams p) {
  __shared__ float partial[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int n4 = static_cast<int>(p.dim / 4);
  float4* x = reinterpret_cast<float4*>(p.x + r * p.dim);
  const float4* add =
      p.add != nullptr ? reinterpret_cast<const float4*>(p.add + r * p.dim) : nullptr;
  const uint2* weight = reinterpret_cast<const uint2*>(p.weight);
  float4 v[kVec];
  uint2 w[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j < n4) {
      v[i] = x[j];
      w[i] = __ldg(weight + j);
    }
  }
  float sum_squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j < n4) {
      if (add != nullptr) {
        const float4 a = add[j];
        v[i].x += a.x;
        v[i].y += a.y;
        v[i].z += a.z;
        v[i].w += a.w;
        x[j] = v[i];
      }
      sum_squares = fmaf(v[i].x, v[i].x, sum_squares);
      sum_squares = fmaf(v[i].y, v[i].y, sum_squares);
      sum_squares = fmaf(v[i].z, v[i].z, sum_squares);
      sum_squares = fmaf(v[i].w, v[i].w, sum_squares);
    }
  }
  const float total = BlockSum(sum_squares, partial);
  const float variance = total / static_cast<float>(p.dim);
  const float inv_rms = 1.0f / sqrtf(variance + p.eps);
  uint2* out = reinterpret_cast<uint2*>(p.out + r * p.dim);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j < n4) {
      const float w0 = __uint_as_float(w[i].x << 16), w1 = __uint_as_float(w[i].x & 0xffff0000u);
      const float w2 = __uint_as_float(w[i].y << 16), w3 = __uint_as_float(w[i].y & 0xffff0000u);
      out[j] = PackBf16x4(w0 * (v[i].x * inv_rms), w1 * (v[i].y * inv_rms),
                          w2 * (v[i].z * inv_rms), w3 * (v[i].w * inv_rms));
    }
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

// cols and in_stride multiples of 8, pointers 16-byte aligned: 8 elements per thread and step.
__global__ void SwiGluVecKernel(SwiGluParams p) {
  const int64_t cols8 = p.cols / 8;
  const int64_t n8 = p.rows * cols8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols8, c = i - r * cols8;
    const uint4 graw = __ldg(reinterpret_cast<const uint4*>(p.gate + r * p.in_stride) + c);
    const uint4 uraw = __ldg(reinterpret_cast<const uint4*>(p.up + r * p.in_stride) + c);
    float g[8], u[8], y[8];
    kv_internal::Bf16x8ToFloat(graw, g);
    kv_internal::Bf16x8ToFloat(uraw, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = (g[e] / (1.0f + expf(-g[e]))) * u[e];
    const uint2 lo = PackBf16x4(y[0], y[1], y[2], y[3]);
    const uint2 hi = PackBf16x4(y[4], y[5], y[6], y[7]);
    reinterpret_cast<uint4*>(p.out + r * p.cols)[c] = make_uint4(lo.x, lo.y, hi.x, hi.y);
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
// Null counts as aligned (an absent optional input).
bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

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
  if (p.dim % 8 == 0 && Aligned(p.table, 16) && Aligned(p.out, 16)) {
    EmbeddingVecKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  } else {
    EmbeddingKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim < 0 || p.rows > INT32_MAX) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.out == nullptr || p.x == nullptr || p.weight == nullptr) return cudaErrorInvalidValue;
  const unsigned rows = static_cast<unsigned>(p.rows);
  const int64_t vecs = (p.dim / 4 + kThreads - 1) / kThreads;  // float4s per thread
  const bool vector = p.dim % 4 == 0 && Aligned(p.x, 16) && Aligned(p.add, 16) &&
                      Aligned(p.weight, 8) && Aligned(p.out, 8);
  if (vector && vecs <= 1) {
    RmsNormVecKernel<1><<<rows, kThreads, 0, stream>>>(p);
  } else if (vector && vecs <= 2) {
    RmsNormVecKernel<2><<<rows, kThreads, 0, stream>>>(p);
  } else if (vector && vecs <= 4) {
    RmsNormVecKernel<4><<<rows, kThreads, 0, stream>>>(p);
  } else if (vector && vecs <= 8) {
    RmsNormVecKernel<8><<<rows, kThreads, 0, stream>>>(p);
  } else {
    RmsNormKernel<<<rows, kThreads, 0, stream>>>(p);
  }
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
  if (p.cols % 8 == 0 && p.in_stride % 8 == 0 && Aligned(p.gate, 16) && Aligned(p.up, 16) &&
      Aligned(p.out, 16)) {
    SwiGluVecKernel<<<GridFor(p.rows * p.cols / 8), kThreads, 0, stream>>>(p);
  } else {
    SwiGluKernel<<<GridFor(p.rows * p.cols), kThreads, 0, stream>>>(p);
  }
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
