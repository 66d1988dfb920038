// A length whose value lives on the device, for work captured once in a CUDA graph and replayed
// while a sequence grows: the host passes an upper bound (grids are sized for it) and the kernels
// read the current value. Used by the decode step's selection kernels (selection.h,
// selection_list.h) when CudaModel replays a whole decode step as one graph. Also the skip flag
// that those kernels take (a selection-cache hit, decided on the device: selection.h).
#ifndef TOKENSELECT_KERNELS_CUDA_DEVICE_LENGTH_H_
#define TOKENSELECT_KERNELS_CUDA_DEVICE_LENGTH_H_

#include <cstdint>

namespace tokenselect::kernels::cuda {

// The length is *count - minus, clamped to [0, the host's length] (which is then a bound).
// count == nullptr: the host's length is exact.
struct DeviceLength {
  const int32_t* count = nullptr;
  int32_t minus = 0;
};

#ifdef __CUDACC__
__device__ __forceinline__ int64_t ResolveLength(const DeviceLength& d, int64_t host) {
  if (d.count == nullptr) return host;
  const int64_t v = static_cast<int64_t>(*d.count) - d.minus;
  return v < 0 ? 0 : (v > host ? host : v);
}

// The skip flag: optional (nullptr never skips); a kernel given one returns at once, writing
// nothing, when it is set.
__device__ __forceinline__ bool Skipped(const int32_t* skip) {
  return skip != nullptr && *skip != 0;
}
#endif

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_DEVICE_LENGTH_H_
