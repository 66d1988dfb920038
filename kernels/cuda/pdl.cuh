// Programmatic dependent launch (PDL, sm_90+): hides the launch gap between two kernels of one
// stream. The dependent kernel is launched with LaunchPdl (the programmatic-serialization launch
// attribute); its blocks may then start before the kernel ahead of it has finished, and wait in
// PdlWait (before touching anything that kernel writes) until it has completed and its writes
// are visible. The kernel ahead may call PdlAllowDependents once every block is past most of its
// work: the dependent grid is launched as soon as every block of it has called it (or exited),
// so a dependent block never takes resources that a not-yet-started block of it needs.
// Without the attribute (or before sm_90) both calls do nothing and LaunchPdl is a plain
// launch; captured into a CUDA graph the attribute becomes a programmatic edge.
// Used for the selection chain ScoreKeys -> VoteFromLogits -> TopK (ScoreKeys itself a dependent
// of the kernel that writes its query or skip flag). Measured (H200, twelfth
// session, same binary with and without the attribute): selection 0.0486 / 0.1044 / 0.3259 /
// 0.6125 ms -> 0.0468 / 0.1023 / 0.3244 / 0.6115 at 32K / 128K / 512K / 1M; TP=2 FP8 decode at 1M
// 12.08 / 11.96 -> 12.05 / 11.80 ms per token (within the run-to-run spread).
#ifndef TOKENSELECT_KERNELS_CUDA_PDL_CUH_
#define TOKENSELECT_KERNELS_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/kernel_attributes.h"

namespace tokenselect::kernels::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlAllowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device use the attribute: compute capability 9.0 or later.
inline bool PdlSupported() { return DeviceIsSm90OrLater(); }

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute where supported, and
// cooperative when `cooperative` (every block resident; barriers across the grid).
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, bool cooperative, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  int count = 0;
  if (PdlSupported()) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cooperative) {
    attrs[count].id = cudaLaunchAttributeCooperative;
    attrs[count].val.cooperative = 1;
    ++count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_PDL_CUH_
