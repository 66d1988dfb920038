// Decode attention over token-index lists (one query per request), bf16 storage, fp32 math: the
// GPU counterpart of cpu::GatherAttention (kernels/ops.h) with num_queries = 1 per request.
//
// Requests are batched as CSR: request b attends list entries [indptr[b], indptr[b + 1]) whose
// cache slots are indices[] and whose RoPE positions are kv_positions[] (compact positions for a
// selected set; true positions for dense attention). RoPE (HF rotate_half, inv_freq from
// kernels::RopeInverseFrequencies) is applied to keys as they are gathered and to the query at
// q_positions[b]. Long lists are split into num_splits ranges (split-KV, one block per (range, kv
// head, request)), each writing a normalised partial output and its log-sum-exp; a merge kernel
// combines them. A request with an empty list gets zeros (as on the CPU).
//
// FP8 cache (kv_type = kFp8E4M3, kv_cache_type.h): K and V are dequantized as they are gathered
// (half the bytes read); the result is bit for bit the bf16 result over the dequantized cache.
#ifndef TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_H_
#define TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::kernels::cuda {

struct DecodeAttentionParams {
  __nv_bfloat16* out = nullptr;             // [batch, num_heads, head_dim]
  const __nv_bfloat16* q = nullptr;         // [batch, num_heads, head_dim], un-rotated
  const int32_t* q_positions = nullptr;     // [batch]
  const void* k_cache = nullptr;   // [num_slots, num_kv_heads, head_dim] of kv_type, un-rotated
  const void* v_cache = nullptr;   // [num_slots, num_kv_heads, head_dim] of kv_type
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;  // FP8 only: [num_kv_heads] fp32, device memory
  const float* v_scale = nullptr;
  const int32_t* indptr = nullptr;          // [batch + 1]
  const int32_t* indices = nullptr;         // [indptr[batch]]: cache slot of each entry
  const int32_t* kv_positions = nullptr;    // [indptr[batch]]: RoPE position of each entry
  const float* inv_freq = nullptr;          // [head_dim / 2], device memory
  void* workspace = nullptr;                // DecodeAttentionWorkspaceBytes() bytes
  int64_t batch = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;                 // query head h uses kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;                     // 64 or 128
  int num_splits = 1;                       // from PlanDecodeSplits; 1 to 4096
  float scale = 0.0f;                       // softmax scale, usually 1 / sqrt(head_dim)
  // Tensor-core split kernel (mma.sync, sm_80+; q.k at ~fp32 accuracy through bf16 hi/lo
  // splitting, p in bf16) or the CUDA-core one (all fp32 arithmetic).
  bool use_tensor_cores = true;
};

// Host-side plan: how many ranges to cut each request's list into so that the grid fills the
// device (num_sms multiprocessors) without ranges shorter than a few dozen tokens.
int PlanDecodeSplits(int64_t batch, int64_t num_kv_heads, int64_t max_kv_len, int num_sms);

size_t DecodeAttentionWorkspaceBytes(int64_t batch, int64_t num_heads, int64_t head_dim,
                                     int num_splits);

// Two launches (split kernel, merge kernel). cudaErrorInvalidValue for unsupported shapes
// (head_dim other than 64/128, group size other than 1, 2, 4, 8).
cudaError_t DecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_H_
