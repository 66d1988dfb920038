// Paged K/V <-> one contiguous staging buffer, for moving a token range of a layer range between
// processes (engine/transfer/nccl_kv_link.h, docs/kv_transfer.md "NCCL transport").
//
//   KvGather   staging <- caches: the sender packs what it will ncclSend.
//   KvScatter  caches <- staging: the receiver unpacks into its own slots (which differ from the
//              sender's: each side maps prompt positions to slots through its own token table).
//
// Staging layout: [num_layers, 2, num_tokens, row] elements of the cache's type (bf16, or 1-byte
// e4m3 for an FP8 cache: elem_bytes = 1, moved as raw bytes, so an FP8 cache travels as FP8;
// kv_cache_type.h), row = num_kv_heads * head_dim: for each
// layer all K rows (index 0) then all V rows (index 1), one row per token in position order. This
// is the payload order of the host KvChunk (proto/tokenselect/v1/worker.proto), so both transports
// carry the same bytes.
//
// Caches: per layer one K and one V array [num_slots, row] (engine/model/cuda_model.cc), passed as
// device arrays of num_layers pointers (the first pointer is the range's first layer). Token t
// lives in row slots[t] of every layer. The launchers take a cudaStream_t, never synchronise, and
// return the first CUDA error (cudaErrorInvalidValue for negative sizes or null pointers; sizes of
// 0 launch nothing). Slots outside [0, num_slots) are not read or written: KvGather writes a zero
// row for them and KvScatter skips them (callers validate slots on the host; the zero row keeps a
// missed check from leaking another request's K/V).
#ifndef TOKENSELECT_KERNELS_CUDA_KV_PACK_H_
#define TOKENSELECT_KERNELS_CUDA_KV_PACK_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

struct KvGatherParams {
  __nv_bfloat16* staging = nullptr;                // [num_layers, 2, num_tokens, row]
  const __nv_bfloat16* const* k_layers = nullptr;  // device array [num_layers] of [num_slots, row]
  const __nv_bfloat16* const* v_layers = nullptr;  // device array [num_layers] of [num_slots, row]
  const int32_t* slots = nullptr;                  // [num_tokens], device memory
  int64_t num_layers = 0;
  int64_t num_tokens = 0;
  int64_t row = 0;  // num_kv_heads * head_dim
  int64_t num_slots = 0;
  int elem_bytes = 2;  // 2 (bf16) or 1 (FP8): the pointers' element type is then nominal
  // 0: one warp per row, as many blocks as rows (fastest alone). > 0: at most this many blocks,
  // each warp striding over rows, so that the copy leaves the other SMs to a concurrent NCCL
  // kernel (nccl_kv_link.cc; bench/nccl_kv_bench.cc measures the trade).
  int max_blocks = 0;
};
cudaError_t KvGather(const KvGatherParams& params, cudaStream_t stream);

struct KvScatterParams {
  __nv_bfloat16* const* k_layers = nullptr;  // device array [num_layers] of [num_slots, row]
  __nv_bfloat16* const* v_layers = nullptr;  // device array [num_layers] of [num_slots, row]
  const __nv_bfloat16* staging = nullptr;    // [num_layers, 2, num_tokens, row]
  const int32_t* slots = nullptr;            // [num_tokens], device memory
  int64_t num_layers = 0;
  int64_t num_tokens = 0;
  int64_t row = 0;
  int64_t num_slots = 0;
  int elem_bytes = 2;  // 2 (bf16) or 1 (FP8): the pointers' element type is then nominal
  // 0: one warp per row, as many blocks as rows (fastest alone). > 0: at most this many blocks,
  // each warp striding over rows, so that the copy leaves the other SMs to a concurrent NCCL
  // kernel (nccl_kv_link.cc; bench/nccl_kv_bench.cc measures the trade).
  int max_blocks = 0;
};
cudaError_t KvScatter(const KvScatterParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_KV_PACK_H_
