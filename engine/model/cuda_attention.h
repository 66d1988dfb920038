// The GPU counterpart of attention_list.h: the hook through which a selection policy chooses, per
// layer, the tokens the new tokens attend to, with everything in device memory so that a step
// never waits for the host. CudaModel (cuda_model.h) writes the new tokens' K/V, asks the
// request's CudaAttentionProvider for the list, and runs the CSR attention kernels over it
// (kernels/cuda/decode_attention.h for one new token, prefill_attention.h for a chunk).
//
// The list is the kernels' index form for one request:
//   kv_indptr      device [2]: 0 and the list length (may be decided on the device)
//   kv_indices     cache slot of each entry; kv_positions: its RoPE position
//   q_positions    RoPE position of new token i; visible: new token i attends entries
//                  [0, visible[i]) (causal masks are prefixes)
//   max_kv_len     a host-side bound on the length, for the launch plan
// CudaDenseAttention is full attention; engine/selection/cuda_selection.h implements the
// selection policies.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace tokenselect::engine {

// What a provider sees for one layer of one forward step. All pointers are device memory.
struct CudaAttentionQuery {
  int64_t layer = 0;
  int64_t cache_length = 0;  // tokens cached before this step
  int64_t num_new = 0;       // their K/V are already written
  const __nv_bfloat16* q = nullptr;  // row i at q + i * q_row_stride: [num_heads, head_dim]
  int64_t q_row_stride = 0;
  const __nv_bfloat16* k_cache = nullptr;  // this layer's [num_slots, num_kv_heads, head_dim]
  const __nv_bfloat16* v_cache = nullptr;
  const int32_t* token_slots = nullptr;    // [cache_length + num_new]: slot of every token
  const int32_t* iota = nullptr;           // [>= cache_length + num_new + 1]: iota[i] = i
  const float* inv_freq = nullptr;         // [head_dim / 2]
  const ModelConfig* config = nullptr;
  cudaStream_t stream = nullptr;
};

struct CudaAttentionList {
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_positions = nullptr;
  const int32_t* q_positions = nullptr;
  const int32_t* visible = nullptr;
  int64_t max_kv_len = 0;
};

// One per request; called for layers 0, 1, ... in order on each step, from one thread. Work is
// enqueued on query.stream; the list's buffers must stay valid (and unchanged) until the step's
// attention for that layer has run, i.e. until the next Select call on the same stream.
class CudaAttentionProvider {
 public:
  virtual ~CudaAttentionProvider() = default;
  virtual absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) = 0;
};

// Full causal attention: every cached token at its true position, then the new tokens. The
// entries are the token slots themselves (kv_positions = iota), so only indptr, q_positions and
// visible are written (into the provider's own small device buffers).
class CudaDenseAttention : public CudaAttentionProvider {
 public:
  // ResourceExhausted/Internal when the device buffers cannot be allocated.
  static absl::Status Create(int64_t max_new, CudaDenseAttention* out);
  CudaDenseAttention() = default;
  ~CudaDenseAttention() override;
  CudaDenseAttention(const CudaDenseAttention&) = delete;
  CudaDenseAttention& operator=(const CudaDenseAttention&) = delete;

  absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) override;

 private:
  int32_t* buffer_ = nullptr;  // indptr [2] | q_positions [max_new] | visible [max_new]
  int64_t max_new_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_
