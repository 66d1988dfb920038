// Device queries and a fill kernel used as a launch smoke test.
// fill_kernel: writes `value` to out[0, n); a grid-stride loop, one float per thread per step.
#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::kernels::cuda {
namespace {

__global__ void fill_kernel(float* __restrict__ out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

}  // namespace

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || count == 0) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return absl::NotFoundError("no CUDA device is visible");
  }
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceCount");
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      return CudaStatus(e, "cudaGetDeviceProperties");
    }
    DeviceInfo info;
    info.ordinal = i;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.l2_cache_bytes = prop.l2CacheSize;
    info.max_shared_memory_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaError_t e = cudaSetDevice(i); e != cudaSuccess) return CudaStatus(e, "cudaSetDevice");
    if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
      return CudaStatus(e, "cudaMemGetInfo");
    }
    info.free_memory_bytes = static_cast<int64_t>(free_bytes);
    devices.push_back(info);
  }
  return devices;
}

std::string FormatDeviceInfo(const DeviceInfo& info) {
  return absl::StrFormat("GPU %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), L2 %.0f MiB",
                         info.ordinal, info.name, info.compute_major, info.compute_minor,
                         info.multiprocessors, info.total_memory_bytes / double(1 << 30),
                         info.free_memory_bytes / double(1 << 30),
                         info.l2_cache_bytes / double(1 << 20));
}

absl::Status FillAndReadBack(float value, int64_t n, float* host_out) {
  if (n <= 0) return absl::InvalidArgumentError("n must be positive");
  float* device = nullptr;
  if (cudaError_t e = cudaMalloc(&device, n * sizeof(float)); e != cudaSuccess) {
    return CudaStatus(e, "cudaMalloc");
  }
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
  fill_kernel<<<blocks, threads>>>(device, value, n);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(host_out, device, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(device);
  return CudaStatus(e, "fill_kernel");
}

}  // namespace tokenselect::kernels::cuda
