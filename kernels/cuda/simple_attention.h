// Decode attention for any head dimension and group size: a plain one-block-per-(head, request)
// kernel for shapes the tuned kernels of decode_attention.h do not instantiate (head_dim other
// than 64/128, e.g. the head_dim-32 test presets of engine/model/model_presets.h). Same contract
// and params as DecodeAttention (token-index lists as CSR, RoPE at gather time, bf16 storage,
// fp32 math, zeros for an empty list); workspace, num_splits and use_tensor_cores are ignored.
// Slow by design (no split-KV, one token per thread per tile): for tests and small models.
#ifndef TOKENSELECT_KERNELS_CUDA_SIMPLE_ATTENTION_H_
#define TOKENSELECT_KERNELS_CUDA_SIMPLE_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/decode_attention.h"

namespace tokenselect::kernels::cuda {

// cudaErrorInvalidValue for head_dim odd, <= 0 or > 256, or num_heads not a multiple of
// num_kv_heads.
cudaError_t SimpleDecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SIMPLE_ATTENTION_H_
