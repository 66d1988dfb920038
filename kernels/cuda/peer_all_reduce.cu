// Peer-memory all-reduce (peer_all_reduce.h has the protocol and why it needs no closing
// barrier). Block b of a grid owns the same range of `data` on every rank: 16-byte vectors when
// `data` is 16-byte aligned (the tail after the last whole vector goes to the last block), else
// single elements; thread t of the block takes every blockDim-th unit of the range, one per
// step. Pushes are volatile stores into the peers' memory, polls volatile loads of this rank's
// receive slots (never through L1, which could hold lines of an earlier call).
#include "kernels/cuda/peer_all_reduce.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_status.h"

namespace tokenselect::kernels::cuda {
namespace {

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
  const int64_t per = (units + gridDim.x - 1) / gridDim.x;
  *begin = min(units, static_cast<int64_t>(blockIdx.x) * per);
  *end = min(units, *begin + per);
}

// The ranks' values in the summation order every rank uses: rank order, except that 4 ranks add
// in pairs, (r0 + r1) + (r2 + r3), the binary tree of TP-invariant numerics (docs/parallel.md);
// 2 ranks: r0 + r1 either way. `pending` holds r2 until r3 arrives.
template <typename U>
__device__ __forceinline__ void Accumulate(U* acc, U* pending, int p, int size, U x) {
  if (p == 0) {
    *acc = x;
  } else if (size == 4 && p == 2) {
    *pending = x;
  } else if (size == 4 && p == 3) {
    *acc = Add(*acc, Add(*pending, x));
  } else {
    *acc = Add(*acc, x);
  }
}

// The marker and canonical NaN bits of T.
template <typename T>
struct Bits;
template <>
struct Bits<float> {
  static constexpr uint32_t kMarker = 0xffffffffu;
  static constexpr uint32_t kCanonicalNan = 0x7fffffffu;
};
template <>
struct Bits<double> {
  static constexpr unsigned long long kMarker = ~0ull;
  static constexpr unsigned long long kCanonicalNan = 0x7fffffffffffffffull;
};

__device__ __forceinline__ float Sanitize(float x) {
  return __float_as_uint(x) == Bits<float>::kMarker ? __uint_as_float(Bits<float>::kCanonicalNan)
                                                    : x;
}
__device__ __forceinline__ double Sanitize(double x) {
  return static_cast<unsigned long long>(__double_as_longlong(x)) == Bits<double>::kMarker
             ? __longlong_as_double(static_cast<long long>(Bits<double>::kCanonicalNan))
             : x;
}
__device__ __forceinline__ float4 Sanitize(float4 v) {
  return make_float4(Sanitize(v.x), Sanitize(v.y), Sanitize(v.z), Sanitize(v.w));
}
__device__ __forceinline__ double2 Sanitize(double2 v) {
  return make_double2(Sanitize(v.x), Sanitize(v.y));
}

__device__ __forceinline__ bool Arrived(float x) {
  return __float_as_uint(x) != Bits<float>::kMarker;
}
__device__ __forceinline__ bool Arrived(double x) {
  return static_cast<unsigned long long>(__double_as_longlong(x)) != Bits<double>::kMarker;
}
__device__ __forceinline__ bool Arrived(float4 v) {
  return Arrived(v.x) && Arrived(v.y) && Arrived(v.z) && Arrived(v.w);
}
__device__ __forceinline__ bool Arrived(double2 v) { return Arrived(v.x) && Arrived(v.y); }

__device__ __forceinline__ void SetMarker(float* p) { *p = __uint_as_float(Bits<float>::kMarker); }
__device__ __forceinline__ void SetMarker(double* p) {
  *p = __longlong_as_double(static_cast<long long>(Bits<double>::kMarker));
}
__device__ __forceinline__ void SetMarker(float4* p) {
  const float m = __uint_as_float(Bits<float>::kMarker);
  *p = make_float4(m, m, m, m);
}
__device__ __forceinline__ void SetMarker(double2* p) {
  const double m = __longlong_as_double(static_cast<long long>(Bits<double>::kMarker));
  *p = make_double2(m, m);
}

// Volatile (relaxed, system scope) accesses: a peer's stores become visible to the polling
// loads without fences.
template <typename U>
__device__ __forceinline__ void StoreVolatile(U* ptr, const U& x) {
  *const_cast<volatile U*>(ptr) = x;
}
__device__ __forceinline__ void StoreVolatile(float4* ptr, const float4& x) {
  asm volatile("st.volatile.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "f"(x.x),
               "f"(x.y), "f"(x.z), "f"(x.w)
               : "memory");
}
__device__ __forceinline__ void StoreVolatile(double2* ptr, const double2& x) {
  asm volatile("st.volatile.global.v2.f64 [%0], {%1, %2};\n" ::"l"(ptr), "d"(x.x), "d"(x.y)
               : "memory");
}
template <typename U>
__device__ __forceinline__ U LoadVolatile(const U* ptr) {
  return *const_cast<const volatile U*>(ptr);
}
__device__ __forceinline__ float4 LoadVolatile(const float4* ptr) {
  float4 v;
  asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(ptr)
               : "memory");
  return v;
}
__device__ __forceinline__ double2 LoadVolatile(const double2* ptr) {
  double2 v;
  asm volatile("ld.volatile.global.v2.f64 {%0, %1}, [%2];\n"
               : "=d"(v.x), "=d"(v.y)
               : "l"(ptr)
               : "memory");
  return v;
}

// One area of a view: where this call's values go and come from.
struct Area {
  unsigned char* const* slots;  // [rank]: the rank's receive area
  uint32_t* counters;           // this rank's per-block call counts
  int64_t slot_bytes;
};

// The protocol's steps for units [begin, end) of U: thread t pushes unit begin + t + s * blockDim
// at step s, then sums the unit it pushed at step s - 1. Returns false when `abort` ended a wait.
template <typename U>
__device__ __forceinline__ bool Exchange(U* data, int64_t begin, int64_t end,
                                         const PeerAllReduceView& v, const Area& area,
                                         int parity) {
  const int64_t slot = area.slot_bytes;
  unsigned char* mine = area.slots[v.rank] + static_cast<int64_t>(parity) * v.size * slot;
  const int64_t step = blockDim.x;
  for (int64_t i = begin + threadIdx.x;; i += step) {
    if (i < end) {
      const U x = Sanitize(data[i]);
      for (int p = 0; p < v.size; ++p) {
        if (p == v.rank) continue;
        U* dst = reinterpret_cast<U*>(area.slots[p] + (parity * v.size + v.rank) * slot);
        StoreVolatile(dst + i, x);
      }
    }
    const int64_t j = i - step;  // pushed at the previous step
    if (j >= end) break;
    if (j < begin) continue;
    const U own = Sanitize(data[j]);
    U acc = own, pending = own;
    for (int p = 0; p < v.size; ++p) {
      U x = own;
      if (p != v.rank) {
        U* src = reinterpret_cast<U*>(mine + p * slot) + j;
        uint32_t spins = 0;
        for (x = LoadVolatile(src); !Arrived(x); x = LoadVolatile(src)) {
          if (v.abort != nullptr && (++spins & 1023u) == 0 && *v.abort != 0) return false;
        }
        SetMarker(src);
      }
      Accumulate(&acc, &pending, p, v.size, x);
    }
    data[j] = acc;
  }
  return true;
}

// kSmall: the small area and grid, else the large ones. The large kernel's bound keeps it at
// most 64 registers for its 1024 threads; the small one has none (with __launch_bounds__(128)
// ptxas once capped an earlier version at 32 registers and spilled on sm_80).
template <typename T, bool kSmall>
__device__ __forceinline__ void AllReduce(T* data, int64_t count, const PeerAllReduceView& v,
                                          const int32_t* skip) {
  if (skip != nullptr && *skip != 0) return;  // on every rank alike: counts stay in step
  const Area area = kSmall ? Area{v.small, v.small_epochs, v.small_slot_bytes}
                           : Area{v.recv, v.epochs, v.slot_bytes};
  using V = typename Vec<T>::Type;
  constexpr int kPerVec = sizeof(V) / sizeof(T);
  const int b = blockIdx.x;
  const uint32_t epoch = area.counters[b] + 1;
  const int parity = static_cast<int>(epoch & 1u);
  const bool vectors = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const int64_t units = vectors ? count / kPerVec : count;
  int64_t begin, end;
  BlockRange(units, &begin, &end);
  const int64_t tail_begin = vectors && b == static_cast<int>(gridDim.x) - 1 ? units * kPerVec
                                                                             : count;
  bool done = vectors ? Exchange(reinterpret_cast<V*>(data), begin, end, v, area, parity)
                      : Exchange(data, begin, end, v, area, parity);
  if (done) done = Exchange(data, tail_begin, count, v, area, parity);
  __syncthreads();  // every thread has read the counter before it moves on
  if (threadIdx.x == 0) area.counters[b] = epoch;
}

template <typename T>
__global__ void PeerAllReduceSmallKernel(T* data, int64_t count, PeerAllReduceView v,
                                         const int32_t* skip) {
  AllReduce<T, true>(data, count, v, skip);
}

template <typename T>
__global__ void __launch_bounds__(kPeerThreads)
    PeerAllReduceKernel(T* data, int64_t count, PeerAllReduceView v, const int32_t* skip) {
  AllReduce<T, false>(data, count, v, skip);
}

template <typename T>
cudaError_t Launch(T* data, int64_t count, const PeerAllReduceView& view, cudaStream_t stream,
                   const int32_t* skip) {
  if (count < 0 || view.size < 1 || view.size > kPeerMaxRanks || view.rank < 0 ||
      view.rank >= view.size || view.slot_bytes % 16 != 0 ||
      count > view.slot_bytes / static_cast<int64_t>(sizeof(T))) {
    return cudaErrorInvalidValue;
  }
  if (view.small[view.rank] != nullptr && view.small_epochs != nullptr &&
      count <= view.small_slot_bytes / static_cast<int64_t>(sizeof(T))) {
    PeerAllReduceSmallKernel<T>
        <<<kPeerSmallBlocks, kPeerSmallThreads, 0, stream>>>(data, count, view, skip);
  } else {
    PeerAllReduceKernel<T><<<kPeerBlocks, kPeerThreads, 0, stream>>>(data, count, view, skip);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t PeerAllReducePrepare() {
  cudaFuncAttributes attributes;
  TS_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, PeerAllReduceKernel<float>));
  TS_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, PeerAllReduceKernel<double>));
  TS_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, PeerAllReduceSmallKernel<float>));
  return cudaFuncGetAttributes(&attributes, PeerAllReduceSmallKernel<double>);
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
