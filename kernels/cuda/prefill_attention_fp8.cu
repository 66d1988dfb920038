// The FP8-cache instantiations of the tensor-core prefill kernel (prefill_attention_kernel.cuh).
// Compiled without the spill guard (kernels/CMakeLists.txt): at d = 128 they spill 8 bytes
// (ptxas -v: 8 bytes of spill stores and loads) at the 255-register limit that the bf16 kernel
// fills exactly. The variants tried to avoid it (32-entry key tiles, the scales folded into Q
// and O, other copy mappings, the scale read at other places) all spilled as much or more.
// Short lists do not take it (prefill_attention.h: they are gathered first); bench_prefill_cuda
// times it on a TokenSelect list of one TP=2 rank (16 / 4 heads): 83 us against 60 us gathered.
#include "kernels/cuda/prefill_attention_kernel.cuh"

namespace tokenselect::kernels::cuda::prefill_internal {

cudaError_t PrefillAttentionFp8(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                                int64_t group, cudaStream_t stream) {
  return DispatchPrefillDim<KvSource::kFp8Cache>(p, ws, group, stream);
}

cudaError_t ConfigurePrefillKernelsFp8() {
  return ConfigurePrefillKernels<KvSource::kFp8Cache>();
}

}  // namespace tokenselect::kernels::cuda::prefill_internal
