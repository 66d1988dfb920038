// Chunked-prefill attention over token-index lists (many queries per request), bf16 storage,
// fp32 softmax and accumulation, tensor cores: the GPU counterpart of cpu::GatherAttention
// (kernels/ops.h) for a prefill chunk, batched across requests as CSR.
//
// Request b has queries [q_indptr[b], q_indptr[b + 1]) and attends list entries
// [kv_indptr[b], kv_indptr[b + 1]): cache slots kv_indices[], RoPE positions kv_positions[].
// Query i (a global row) attends the first visible[i] entries of its request's list: causal
// masks are prefixes (the selected tokens first, then the chunk itself, so the chunk's token t
// has visible = num_selected + t + 1). RoPE (HF rotate_half, inv_freq from
// kernels::RopeInverseFrequencies) is applied to keys as they are gathered (cache keys are
// un-rotated) and to query i at q_positions[i]. A query with visible == 0 gets zeros.
//
// The same kernel serves dense prefill (the list is every cached token at its true position plus
// the chunk) and sparse prefill (TokenSelect: the selected set at compact positions plus the
// chunk). Long lists are split over the KV axis (split-KV with a log-sum-exp merge) so that a
// chunk against a 1M-token list fills the device.
//
// FP8 cache (kv_type = kFp8E4M3, kv_cache_type.h): K and V tiles are dequantized as they land;
// the result is bit for bit the bf16 result over the dequantized cache.
//
// Short lists (PrefillGathersList: at most kPrefillGatherMaxEntries entries in all, more than one
// query tile per KV head; a TokenSelect chunk's list) are gathered first: one pass writes every
// entry's rotated key and its value as bf16 into the workspace, and the attention kernel reads
// them contiguously instead of dequantizing and rotating every key once per query tile. The
// gathered keys are the same bf16 values the tiles would hold, so the output is bit for bit the
// same either way.
#ifndef TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_H_
#define TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::kernels::cuda {

enum class PrefillGather { kAuto, kOff, kOn };

struct PrefillAttentionParams {
  __nv_bfloat16* out = nullptr;            // [total_q, num_heads, head_dim] (packed rows)
  const __nv_bfloat16* q = nullptr;        // row i at q + i * q_row_stride: [num_heads, head_dim]
  int64_t q_row_stride = 0;                // elements between query rows (>= num_heads * head_dim;
                                           // the fused qkv GEMM output has q_dim + 2 kv_dim)
  const int32_t* q_positions = nullptr;    // [total_q]
  const int32_t* q_indptr = nullptr;       // [batch + 1]
  const int32_t* visible = nullptr;        // [total_q]: prefix of the request's list attended
  const void* k_cache = nullptr;  // [num_slots, num_kv_heads, head_dim] of kv_type, un-rotated
  const void* v_cache = nullptr;  // [num_slots, num_kv_heads, head_dim] of kv_type
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;  // FP8 only: [num_kv_heads] fp32, device memory
  const float* v_scale = nullptr;
  const int32_t* kv_indptr = nullptr;      // [batch + 1]
  const int32_t* kv_indices = nullptr;     // [kv_indptr[batch]]: cache slot of each entry
  const int32_t* kv_positions = nullptr;   // [kv_indptr[batch]]: RoPE position of each entry
  const float* inv_freq = nullptr;         // [head_dim / 2], device memory
  void* workspace = nullptr;               // PrefillAttentionWorkspaceBytes() bytes
  int64_t batch = 0;
  int64_t total_q = 0;                     // q_indptr[batch]
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;                // query head h uses kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;                    // 64 or 128
  int64_t max_q_len = 0;                   // host-side bounds for the launch plan: every
  int64_t max_kv_len = 0;                  // request's query count and list length
  int num_splits = 1;                      // from PlanPrefillSplits
  float scale = 0.0f;                      // softmax scale, usually 1 / sqrt(head_dim)
  // Gather the lists first (kAuto: when PrefillGathersList says so; kOn / kOff force it, for
  // tests and benchmarks). The tuned kernel only; the output does not depend on it.
  PrefillGather gather = PrefillGather::kAuto;
};

// Host-side plan: KV-axis splits so that (query tiles x kv heads x requests x splits) fills
// num_sms multiprocessors without ranges shorter than a few key tiles.
int PlanPrefillSplits(int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t max_q_len,
                      int64_t max_kv_len, int num_sms);

// Gathering pays when a list is short (its bf16 copy is small; 8192 entries x 8 KV heads x
// head_dim 128 x K and V = 32 MiB) and read by several query tiles of a KV head (each would
// rotate every key again).
constexpr int64_t kPrefillGatherMaxEntries = 8192;
bool PrefillGathersList(int64_t batch, int64_t num_heads, int64_t num_kv_heads,
                        int64_t max_q_len, int64_t max_kv_len);

// Workspace of a PrefillAttention launch with p's shapes (batch, total_q, num_heads,
// num_kv_heads, head_dim, max_q_len, max_kv_len, num_splits, gather; no pointer is read): the
// gathered lists, if any, and the split partials if num_splits > 1.
size_t PrefillAttentionWorkspaceBytes(const PrefillAttentionParams& p);

// cudaErrorInvalidValue for unsupported shapes (head_dim other than 64/128, group size other
// than 1, 2, 4, 8) or null pointers; never synchronises.
cudaError_t PrefillAttention(const PrefillAttentionParams& params, cudaStream_t stream);

// Generic fallback with the same params and semantics for any even head_dim <= 256 and any group
// size (plain CUDA cores, one block per (query row, head), no split; workspace and num_splits are
// ignored): for the tiny head_dim-32 test models and shapes the tuned kernel does not instantiate.
// cudaErrorInvalidValue for other shapes or null pointers; never synchronises.
cudaError_t SimplePrefillAttention(const PrefillAttentionParams& params, cudaStream_t stream);

// The selection query of a prefill chunk (engine/selection/selection_query.h on the GPU):
// out[h, :] = mean over i < num_q of RoPE(q row i, head h; position n_local + i), fp32
// [num_heads, head_dim]; q row i at q + i * q_row_stride (bf16, un-rotated), inv_freq
// [head_dim / 2] in device memory. The mean is accumulated in fp32 (the CPU uses double).
// cudaErrorInvalidValue for null pointers, num_q or num_heads < 1, head_dim odd or outside
// [2, 512], q_row_stride < num_heads * head_dim, n_local < 0 or n_local + num_q - 1 beyond int32.
cudaError_t BuildSelectionQuery(float* out, const __nv_bfloat16* q, int64_t q_row_stride,
                                int64_t num_q, int64_t num_heads, int64_t head_dim,
                                int64_t n_local, const float* inv_freq, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_H_
