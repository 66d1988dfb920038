// Device allocations of one GPU selection object (cuda_selection.h, cuda_cascade.h), zeroed when
// made and freed together with the arena.
#ifndef TOKENSELECT_ENGINE_SELECTION_DEVICE_ARENA_H_
#define TOKENSELECT_ENGINE_SELECTION_DEVICE_ARENA_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() {
    for (void* p : blocks_) cudaFree(p);
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // max(count, 1) zeroed elements of T into *out. ResourceExhausted when device memory runs out.
  template <typename T>
  absl::Status Get(int64_t count, T** out) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("GPU selection: out of device memory allocating ", bytes, " bytes"));
    }
    RETURN_IF_ERROR(kernels::cuda::CudaStatus(err, "cudaMalloc"));
    blocks_.push_back(p);
    RETURN_IF_ERROR(kernels::cuda::CudaStatus(cudaMemset(p, 0, bytes), "cudaMemset"));
    *out = static_cast<T*>(p);
    return absl::OkStatus();
  }

 private:
  std::vector<void*> blocks_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_DEVICE_ARENA_H_
