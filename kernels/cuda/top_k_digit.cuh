// The top-k's order-preserving key and its first radix digit (top_k.cu), shared with
// VoteFromLogits (key_scores.cu), which can build that digit's histogram of its votes for the
// TopK call after it (VoteParams::top_k_workspace, TopKParams::histogram_ready).
#ifndef TOKENSELECT_KERNELS_CUDA_TOP_K_DIGIT_CUH_
#define TOKENSELECT_KERNELS_CUDA_TOP_K_DIGIT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenselect::kernels::cuda::top_k_digit {

constexpr int kTopBits = 12;  // the first digit; then two of 10 bits
constexpr int kTopBins = 1 << kTopBits;
// The first digit's histogram: words [kHist0, kHist0 + kTopBins) of the TopK workspace.
constexpr int kHist0 = 0;

// Scores map to an order-preserving 32-bit key: NaN -> 0, the lowest; -0 -> +0, so that the two
// zeros tie as they do on the CPU.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;  // NaN ranks lowest
  uint32_t u = __float_as_uint(f);
  if (f == 0.0f) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t TopDigit(uint32_t key) { return key >> (32 - kTopBits); }

}  // namespace tokenselect::kernels::cuda::top_k_digit

#endif  // TOKENSELECT_KERNELS_CUDA_TOP_K_DIGIT_CUH_
