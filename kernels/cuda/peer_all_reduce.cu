// Peer-memory all-reduce (peer_all_reduce.h has the protocol and why it needs no closing
// barrier). Block b owns the same slice of `data` on every rank: 16-byte vectors when `data` is
// 16-byte aligned (the tail after the last whole vector goes to the last block), else single
// elements. Memory ordering: each thread's remote stores, then its fence.acq_rel.sys, then the
// block barrier, then thread 0's st.release.sys of the flag in each peer; the waiting side's
// thread 0 reads its flags with ld.acquire.sys, then the block barrier, then every thread loads
// the received slices with ld.global.cg (not through L1, which could hold lines from an
// earlier call of the same parity).
#include "kernels/cuda/peer_all_reduce.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_status.h"

namespace tokenselect::kernels::cuda {
namespace {

__device__ __forceinline__ void StoreRelease(uint32_t* address, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void FenceSystem() {
  asm volatile("fence.acq_rel.sys;\n" ::: "memory");
}

// 16 bytes of T.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  using Type = float4;
};
template <>
struct Vec<double> {
  using Type = double2;
};

__device__ __forceinline__ float Add(float a, float b) { return a + b; }
__device__ __forceinline__ double Add(double a, double b) { return a + b; }
__device__ __forceinline__ float4 Add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ double2 Add(double2 a, double2 b) {
  return make_double2(a.x + b.x, a.y + b.y);
}

// Element range [begin, end) of this block in units of U (U = T's vector or T).
__device__ __forceinline__ void BlockRange(int64_t units, int64_t* begin, int64_t* end) {
  const int64_t per = (units + kPeerBlocks - 1) / kPeerBlocks;
  *begin = min(units, static_cast<int64_t>(blockIdx.x) * per);
  *end = min(units, *begin + per);
}

// Pushes [begin, end) of `src` (units of U) into every peer's slot for this rank.
template <typename U>
__device__ __forceinline__ void Push(const U* src, int64_t begin, int64_t end,
                                     const PeerAllReduceView& v, int parity) {
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const U x = src[i];
    for (int p = 0; p < v.size; ++p) {
      if (p == v.rank) continue;
      U* slot = reinterpret_cast<U*>(
          v.recv[p] + (static_cast<int64_t>(parity) * v.size + v.rank) * v.slot_bytes);
      slot[i] = x;
    }
  }
}

// data[i] = sum over ranks, in rank order, for i in [begin, end) (units of U).
template <typename U>
__device__ __forceinline__ void SumInto(U* data, int64_t begin, int64_t end,
                                        const PeerAllReduceView& v, int parity) {
  const unsigned char* mine = v.recv[v.rank] +
                              static_cast<int64_t>(parity) * v.size * v.slot_bytes;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const U own = data[i];
    U acc = v.rank == 0 ? own : __ldcg(reinterpret_cast<const U*>(mine) + i);
    for (int p = 1; p < v.size; ++p) {
      const U x =
          p == v.rank ? own : __ldcg(reinterpret_cast<const U*>(mine + p * v.slot_bytes) + i);
      acc = Add(acc, x);
    }
    data[i] = acc;
  }
}

template <typename T>
__global__ void __launch_bounds__(kPeerThreads)
    PeerAllReduceKernel(T* data, int64_t count, PeerAllReduceView v, const int32_t* skip) {
  if (skip != nullptr && *skip != 0) return;  // on every rank alike: epochs stay in step
  using V = typename Vec<T>::Type;
  constexpr int kPerVec = sizeof(V) / sizeof(T);
  __shared__ uint32_t s_epoch;
  __shared__ int s_aborted;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    s_epoch = v.epochs[b] + 1;
    s_aborted = 0;
  }
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const int parity = static_cast<int>(epoch & 1u);

  const bool vectors = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const int64_t units = vectors ? count / kPerVec : count;
  int64_t begin, end;
  BlockRange(units, &begin, &end);
  // Vectors: the last block also takes the tail of fewer than kPerVec elements.
  const int64_t tail_begin = vectors && b == kPeerBlocks - 1 ? units * kPerVec : count;

  if (vectors) {
    Push(reinterpret_cast<const V*>(data), begin, end, v, parity);
  } else {
    Push(data, begin, end, v, parity);
  }
  Push(data, tail_begin, count, v, parity);
  FenceSystem();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int p = 0; p < v.size; ++p) {
      if (p != v.rank) StoreRelease(v.flags[p] + b * kPeerMaxRanks + v.rank, epoch);
    }
    const uint32_t* mine = v.flags[v.rank] + b * kPeerMaxRanks;
    for (int p = 0; p < v.size && !s_aborted; ++p) {
      if (p == v.rank) continue;
      uint32_t spins = 0;
      while (static_cast<int32_t>(LoadAcquire(mine + p) - epoch) < 0) {
        if (v.abort != nullptr && (++spins & 1023u) == 0 && *v.abort != 0) {
          s_aborted = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (s_aborted) return;
  if (vectors) {
    SumInto(reinterpret_cast<V*>(data), begin, end, v, parity);
  } else {
    SumInto(data, begin, end, v, parity);
  }
  SumInto(data, tail_begin, count, v, parity);
  if (threadIdx.x == 0) v.epochs[b] = epoch;
}

template <typename T>
cudaError_t Launch(T* data, int64_t count, const PeerAllReduceView& view, cudaStream_t stream,
                   const int32_t* skip) {
  if (count < 0 || view.size < 1 || view.size > kPeerMaxRanks || view.rank < 0 ||
      view.rank >= view.size || view.slot_bytes % 16 != 0 ||
      count > view.slot_bytes / static_cast<int64_t>(sizeof(T))) {
    return cudaErrorInvalidValue;
  }
  PeerAllReduceKernel<T><<<kPeerBlocks, kPeerThreads, 0, stream>>>(data, count, view, skip);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PeerAllReducePrepare() {
  cudaFuncAttributes attributes;
  TS_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, PeerAllReduceKernel<float>));
  return cudaFuncGetAttributes(&attributes, PeerAllReduceKernel<double>);
}

cudaError_t PeerAllReduceSum(float* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip) {
  return Launch(data, count, view, stream, skip);
}

cudaError_t PeerAllReduceSum(double* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip) {
  return Launch(data, count, view, stream, skip);
}

}  // namespace tokenselect::kernels::cuda
