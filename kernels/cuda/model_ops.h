// The row-wise and elementwise ops of the forward pass on the GPU (the CUDA counterparts of
// cpu::Embedding, RmsNorm, SwiGlu, AddInPlace in kernels/ops.h), plus the KV append of the new
// tokens' un-rotated keys and values into paged cache slots.
//
// Precision: weights, GEMM inputs and the KV cache are bf16; the residual stream x is fp32, and
// all math is fp32 (one rounding to bf16 where an op writes bf16). The launchers take a
// cudaStream_t, never synchronise, and return the first CUDA error (cudaErrorInvalidValue for
// negative sizes or null pointers). Sizes of 0 launch nothing.
#ifndef TOKENSELECT_KERNELS_CUDA_MODEL_OPS_H_
#define TOKENSELECT_KERNELS_CUDA_MODEL_OPS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::kernels::cuda {

// out[i, :] = float(table[ids[i], :]). An id outside [0, vocab) gives a NaN row (callers check
// ids on the host first; the NaN makes a missed check visible).
struct EmbeddingParams {
  float* out = nullptr;                  // [num_tokens, dim] fp32 (the residual stream)
  const __nv_bfloat16* table = nullptr;  // [vocab, dim]
  const int32_t* ids = nullptr;          // [num_tokens], device memory
  int64_t num_tokens = 0;
  int64_t dim = 0;
  int64_t vocab = 0;
};
cudaError_t Embedding(const EmbeddingParams& params, cudaStream_t stream);

// Per row: if add != nullptr, x += add first (written back: the residual add fused with the next
// norm); then out = bf16(weight * (x * rsqrt(mean(x^2) + eps))), HF LlamaRMSNorm in fp32 with
// the CPU's operation order (kernels/cpu/elementwise.cc). One block per row.
struct RmsNormParams {
  __nv_bfloat16* out = nullptr;           // [rows, dim]
  float* x = nullptr;                     // [rows, dim] fp32; written only when add != nullptr
  const float* add = nullptr;             // [rows, dim] or nullptr
  const __nv_bfloat16* weight = nullptr;  // [dim]
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
};
cudaError_t RmsNorm(const RmsNormParams& params, cudaStream_t stream);

// x += y over n fp32 values.
cudaError_t AddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream);

// out[r, j] = bf16(silu(gate[r, j]) * up[r, j]), silu(g) = g / (1 + exp(-g)) in fp32. gate and up
// are rows of `in_stride` elements, so a fused gate|up GEMM output [rows, 2 * cols] is read in
// place (gate = in, up = in + cols, in_stride = 2 * cols).
struct SwiGluParams {
  __nv_bfloat16* out = nullptr;         // [rows, cols]
  const __nv_bfloat16* gate = nullptr;  // [rows, in_stride]
  const __nv_bfloat16* up = nullptr;    // [rows, in_stride]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t in_stride = 0;  // elements between rows of gate/up (>= cols)
};
cudaError_t SwiGlu(const SwiGluParams& params, cudaStream_t stream);

// k_cache[slots[i], :] = k[i, :] and v_cache[slots[i], :] = v[i, :] for the new tokens; keys stay
// un-rotated (RoPE is applied at gather time). Rows of k/v are `src_stride` elements apart, so the
// k and v parts of a fused qkv GEMM output are read in place. Slots outside [0, num_slots) are
// skipped (callers validate slots on the host). 16-byte copies when every row is 16-byte aligned.
// An FP8 cache (kv_cache_type.h) stores e4m3(x / scale[h]) for element x of KV head h (8 values
// per thread and 8-byte stores when rows allow, else one at a time).
struct KvAppendParams {
  void* k_cache = nullptr;  // [num_slots, row] of kv_type
  void* v_cache = nullptr;  // [num_slots, row] of kv_type
  const __nv_bfloat16* k = nullptr;  // [num_tokens, src_stride]
  const __nv_bfloat16* v = nullptr;  // [num_tokens, src_stride]
  const int32_t* slots = nullptr;    // [num_tokens], device memory
  int64_t num_tokens = 0;
  int64_t row = 0;         // num_kv_heads * head_dim
  int64_t src_stride = 0;  // >= row
  int64_t num_slots = 0;
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;  // FP8: [row / head_dim] fp32, device memory
  const float* v_scale = nullptr;
  int64_t head_dim = 0;            // FP8: elements per KV head (divides row)
};
cudaError_t KvAppend(const KvAppendParams& params, cudaStream_t stream);

// The FP8 KV scales' row bounds (engine/model/kv_scales.h) from device weights:
// out[r] = sqrt(hidden) * || w[r, :] (.) norm ||_2 + |bias[r]| in double, for the rows of a bf16
// [rows, hidden] projection (the k and v rows of the fused qkv weight). One block per row; the
// squares are summed in double in a fixed tree order (the CPU sums in sequence: the two can
// differ by ~1e-16 relative, which moves a power-of-two scale only when a bound sits that close
// to 448 times a power of two).
struct KvRowBoundsParams {
  double* out = nullptr;                  // [rows], device memory
  const __nv_bfloat16* w = nullptr;       // [rows, hidden]
  const __nv_bfloat16* norm = nullptr;    // [hidden]
  const __nv_bfloat16* bias = nullptr;    // [rows] or nullptr (no bias)
  int64_t rows = 0;
  int64_t hidden = 0;
};
cudaError_t KvRowBounds(const KvRowBoundsParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_MODEL_OPS_H_
