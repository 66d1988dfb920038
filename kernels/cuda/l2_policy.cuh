// L2 eviction priorities for the bound-vote chain (bound_vote.cu), sm_80+: the bound scoring
// (key_scores_mma.cu) streams every key once with an evict_first policy and stores each token's
// 8 bytes of vote bounds with an evict_last one, so that the bounds (8 MiB at 1M tokens) stay in
// L2 while 2 GiB of keys pass; the screen then reads them from L2 and discards each line when it
// is done with it (no write-back to DRAM, ever). Measured in docs/kernel_tuning_log.md
// (thirty-second session).
#ifndef TOKENSELECT_KERNELS_CUDA_L2_POLICY_CUH_
#define TOKENSELECT_KERNELS_CUDA_L2_POLICY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

// A cache policy for every access that carries it: evicted before normal lines.
__device__ __forceinline__ uint64_t L2EvictFirst() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// A cache policy for every access that carries it: evicted after normal lines.
__device__ __forceinline__ uint64_t L2EvictLast() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// cp_async.cuh's CpAsyncCa16 under an L2 policy.
__device__ __forceinline__ void CpAsyncCa16Policy(void* smem, const void* gmem,
                                                  uint64_t policy) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(addr),
               "l"(gmem), "l"(policy)
               : "memory");
}

// __ldg of 16 bytes under an L2 policy.
__device__ __forceinline__ uint4 LdgPolicy(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// A 4-byte store under an L2 policy.
__device__ __forceinline__ void StorePolicy(uint32_t* p, uint32_t value, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" ::"l"(p), "r"(value), "l"(policy)
               : "memory");
}

// The 128-byte line at `line` (128-byte aligned) dropped from L2 without write-back: its
// contents become undefined (PTX: a weak write of an indeterminate value, ordered as writes
// are).
__device__ __forceinline__ void DiscardL2Line(const void* line) {
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(line) : "memory");
}

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_L2_POLICY_CUH_
