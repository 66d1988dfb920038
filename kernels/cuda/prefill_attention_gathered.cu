// The gathered-list instantiations of the tensor-core prefill kernel
// (prefill_attention_kernel.cuh, KvSource::kGathered). Compiled without the spill guard
// (kernels/CMakeLists.txt), like prefill_attention_fp8.cu: at d = 128 ptxas spills 72 bytes
// for sm_90 (none for sm_80) at the 255-register limit, whatever the copy's addressing (clamped
// rows, one base pointer, the base row from shared memory, the copy loop rolled: 60-76 bytes
// each). Measured anyway faster than reading the cache (prefill_attention.cu's header).
#include "kernels/cuda/prefill_attention_kernel.cuh"

namespace tokenselect::kernels::cuda::prefill_internal {

cudaError_t PrefillAttentionGathered(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                                     int64_t group, cudaStream_t stream) {
  return DispatchPrefillDim<KvSource::kGathered>(p, ws, group, stream);
}

cudaError_t ConfigurePrefillKernelsGathered() {
  return ConfigurePrefillKernels<KvSource::kGathered>();
}

}  // namespace tokenselect::kernels::cuda::prefill_internal
