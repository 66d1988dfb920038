// What the engine needs to know about the GPUs of this host: count, names, memory, SM count, L2,
// compute capability. Used for planning (KV capacity, grid sizes) and printed by benchmarks.
#ifndef TOKENSELECT_KERNELS_CUDA_DEVICE_INFO_H_
#define TOKENSELECT_KERNELS_CUDA_DEVICE_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tokenselect::kernels::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;
  int64_t l2_cache_bytes = 0;
  int64_t max_shared_memory_per_block_optin = 0;
};

// Describes every visible GPU. NotFound when no GPU (or no driver) is present; Internal on any
// other CUDA error.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// One line per device, for logs and benchmark headers.
std::string FormatDeviceInfo(const DeviceInfo& info);

// Fills `n` floats at `device_out` with `value` and copies them back to `host_out`: a smoke test
// that a kernel built into this binary runs on the device. Returns the launch's first error.
absl::Status FillAndReadBack(float value, int64_t n, float* host_out);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_DEVICE_INFO_H_
