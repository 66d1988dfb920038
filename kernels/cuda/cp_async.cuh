// cp.async wrappers (sm_80+: global -> shared copies that bypass the registers), shared by the
// tensor-core kernels: decode attention (decode_attention_mma.cu), key scoring
// (key_scores_mma.cu) and prefill attention (prefill_attention_kernel.cuh). Each asm statement
// carries a "memory" clobber, so the compiler keeps shared-memory reads after the wait that
// guards them.
#ifndef TOKENSELECT_KERNELS_CUDA_CP_ASYNC_CUH_
#define TOKENSELECT_KERNELS_CUDA_CP_ASYNC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

// 16 bytes, cached in L2 only (.cg); smem_addr is a shared-space byte address.
__device__ __forceinline__ void CpAsyncCg16(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem)
               : "memory");
}

// 16 bytes, cached in L1 too (.ca).
__device__ __forceinline__ void CpAsyncCa16(void* smem, const void* gmem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(gmem) : "memory");
}

// 4 bytes, cached in L1 too (.ca).
__device__ __forceinline__ void CpAsyncCa4(void* smem, const void* gmem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(addr), "l"(gmem) : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_CP_ASYNC_CUH_
