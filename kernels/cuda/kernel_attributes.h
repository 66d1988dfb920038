// One-time per-device kernel attributes (docs/parallel.md, "Per-device state in kernels"), and
// the one device property launches branch on (DeviceIsSm90OrLater).
//
// A kernel that needs more than 48 KiB of dynamic shared memory must opt in per device
// (cudaFuncSetAttribute), and setting the attribute can wait for the device's queue to drain.
// Inside a tensor-parallel step that queue may hold an NCCL kernel waiting for another rank's
// thread, which itself may be waiting to set the same attribute: a deadlock. So the opt-in is
// made once per (kernel, device), at model construction (PrepareAttentionKernels, before any
// collective can be in flight), and a launch only checks a bit.
#ifndef TOKENSELECT_KERNELS_CUDA_KERNEL_ATTRIBUTES_H_
#define TOKENSELECT_KERNELS_CUDA_KERNEL_ATTRIBUTES_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tokenselect::kernels::cuda {

// Sets `kernel`'s dynamic shared memory limit to `bytes` on the current device unless `done`
// (one per kernel instantiation) already has the device's bit.
template <typename Kernel>
cudaError_t OptInSharedMemoryOnce(Kernel kernel, size_t bytes, std::atomic<uint64_t>* done) {
  int device = 0;
  const cudaError_t got = cudaGetDevice(&device);
  if (got != cudaSuccess) return got;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((done->load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t set =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (set == cudaSuccess) done->fetch_or(bit, std::memory_order_release);
  return set;
}

// Whether the current device has compute capability 9.0 or later (programmatic dependent
// launch, thread-block clusters), asked once per device: launches check a bit, not the driver.
inline bool DeviceIsSm90OrLater() {
  static std::atomic<uint64_t> known{0}, sm90{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((known.load(std::memory_order_acquire) & bit) != 0) {
    return (sm90.load(std::memory_order_acquire) & bit) != 0;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  if (major >= 9) sm90.fetch_or(bit, std::memory_order_release);
  known.fetch_or(bit, std::memory_order_release);
  return major >= 9;
}

// Every tuned attention kernel's opt-in (prefill and decode, bf16 and FP8 caches), and the
// tensor-core key scoring's (key_scores_mma.cu), on the current device. CudaModel calls it at
// construction; launches then never set attributes.
cudaError_t PrepareAttentionKernels();

namespace score_internal {
cudaError_t ConfigureScoreKeysMmaKernels();  // key_scores_mma.cu
}  // namespace score_internal

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_KERNEL_ATTRIBUTES_H_
