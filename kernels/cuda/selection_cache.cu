// The selection cache's lookup on the device (selection.h: SelectionCacheCheck), the GPU twin of
// engine/selection/selection_cache.h's Matches + Store for one (request, layer) entry.
//
// One block of 512 threads: each thread accumulates q.c, q.q and c.c over a strided share of the
// dim entries in double (fp32 products are exact in double), the block reduces them (warp
// shuffles, then shared memory), and thread 0 decides: hit = valid && cosine >= theta, with the
// CPU's cosine (clamped to [-1, 1], 0 when either norm is 0; NaN compares false, so it misses).
// On a miss every thread copies its share of the query into the entry and thread 0 marks it
// valid. The decision is read back by the threads through shared memory, after the reduction
// that read the old entry, so the copy never races the cosine.
// Traffic: 2 * dim * 4 B read (+ dim * 4 B written on a miss); one launch of a few microseconds,
// no host synchronisation, CUDA-graph friendly (the outcome lives in device memory only).
// PlaceSlice: a grid-stride copy-or-zero, one element per thread and trip.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kCheckThreads = 512;  // the check: one block
constexpr int kPlaceThreads = 256;   // PlaceSlice's blocks

__device__ __forceinline__ double WarpSum(double x) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__global__ void __launch_bounds__(kCheckThreads) SelectionCacheCheckKernel(CacheCheckParams p) {
  __shared__ double sm_red[3][kCheckThreads / 32];
  __shared__ int sm_hit;
  // The scoring kernel (a programmatic dependent, pdl.cuh) may launch now and wait for this one.
  PdlAllowDependents();
  // The entry's flag is read before the loop, so that its round trip overlaps the others; the
  // loop's loads are unrolled for the same reason (Llama-3-8B: 4096 entries, 8 per thread).
  const int32_t valid = threadIdx.x == 0 ? *p.cached_valid : 0;
  constexpr int kPer = 8;  // entries per thread and trip, loaded before they are summed
  double dot = 0.0, norm_q = 0.0, norm_c = 0.0;
  float qv[kPer];  // after the loop: the query's entries of its last trip
  for (int64_t i0 = threadIdx.x; i0 < p.dim; i0 += kPer * kCheckThreads) {
    float cv[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = i0 + k * kCheckThreads;
      qv[k] = i < p.dim ? p.query[i] : 0.0f;
      cv[k] = i < p.dim ? p.cached_query[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const double q = qv[k], c = cv[k];
      dot += q * c;
      norm_q += q * q;
      norm_c += c * c;
    }
  }
  dot = WarpSum(dot);
  norm_q = WarpSum(norm_q);
  norm_c = WarpSum(norm_c);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm_red[0][warp] = dot;
    sm_red[1][warp] = norm_q;
    sm_red[2][warp] = norm_c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double d = 0.0, nq = 0.0, nc = 0.0;
    for (int w = 0; w < kCheckThreads / 32; ++w) {
      d += sm_red[0][w];
      nq += sm_red[1][w];
      nc += sm_red[2][w];
    }
    double cosine = 0.0;
    if (nq != 0.0 && nc != 0.0) {
      cosine = d / (sqrt(nq) * sqrt(nc));
      // std::clamp: NaN stays NaN (and then misses below).
      if (cosine < -1.0) cosine = -1.0;
      if (cosine > 1.0) cosine = 1.0;
    }
    const bool hit = valid != 0 && cosine >= static_cast<double>(p.theta);
    sm_hit = hit ? 1 : 0;
    *p.hit = hit ? 1 : 0;
  }
  __syncthreads();
  if (sm_hit != 0) return;
  if (p.dim <= kPer * kCheckThreads) {  // one trip: the query's entries are still in registers
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + k * kCheckThreads;
      if (i < p.dim) p.cached_query[i] = qv[k];
    }
  } else {
    for (int64_t i = threadIdx.x; i < p.dim; i += kCheckThreads) p.cached_query[i] = p.query[i];
  }
  if (threadIdx.x == 0) *p.cached_valid = 1;
}

__global__ void PlaceSliceKernel(float* __restrict__ dst, int64_t dim,
                                 const float* __restrict__ src, int64_t offset, int64_t len) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < dim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = i >= offset && i < offset + len ? src[i - offset] : 0.0f;
  }
}

}  // namespace

cudaError_t PlaceSlice(float* dst, int64_t dim, const float* src, int64_t offset, int64_t len,
                       cudaStream_t stream) {
  if (dst == nullptr || src == nullptr || dim < 0 || len < 0 || offset < 0 ||
      offset > dim - len) {
    return cudaErrorInvalidValue;
  }
  if (dim == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((dim + kPlaceThreads - 1) / kPlaceThreads, 1024);
  PlaceSliceKernel<<<static_cast<unsigned>(blocks), kPlaceThreads, 0, stream>>>(dst, dim, src,
                                                                              offset, len);
  return cudaGetLastError();
}

cudaError_t SelectionCacheCheck(const CacheCheckParams& p, cudaStream_t stream) {
  if (p.dim <= 0 || p.hit == nullptr || p.cached_query == nullptr ||
      p.cached_valid == nullptr || p.query == nullptr) {
    return cudaErrorInvalidValue;
  }
  SelectionCacheCheckKernel<<<1, kCheckThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
