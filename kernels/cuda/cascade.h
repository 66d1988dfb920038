// The Cascading KV cache baseline's eviction structure on the GPU (docs/DESIGN.md section 4,
// docs/selection.md). engine/selection/cascade_cache.h is the CPU's, and the oracle: the same
// sub-caches, the same accept/compare alternation and the same EMA arithmetic (rounded as the
// CPU rounds it, no fused multiply-add), so for equal votes the two hold bitwise the same
// tokens and scores.
//
// A layer's state lives in device memory: sub-cache i is a ring of capacity[i] (token, ema)
// entries at offset capacity[0] + ... + capacity[i - 1], with its head (ring index of the
// oldest entry), size and offer counter. One policy step (engine/selection/cuda_cascade.h):
//   CascadeGather   the step's token list - the held tokens (sub-cache 0 first, each oldest
//                   first: the CPU's order) then the new tokens [next_token, num_tokens) - as
//                   cache slots, and its length, on the device;
//   (the caller scores the list and soft-votes: ScoreKeys + VoteFromLogits, selection.h)
//   CascadeUpdate   one block: the held entries' EMA update from their votes, then the new
//                   tokens pushed (a sub-cache at a time over pieces of the new tokens, which
//                   gives what pushing them one by one gives; the state staged in shared memory
//                   when it fits), then the selected set: the sinks [0, min(n_init, N)) and
//                   every held token, ascending (the last sub-cache holds the oldest tokens, and
//                   each sub-cache is ascending oldest first).
// Launchers take a cudaStream_t, never synchronise and return the first CUDA error.
#ifndef TOKENSELECT_KERNELS_CUDA_CASCADE_H_
#define TOKENSELECT_KERNELS_CUDA_CASCADE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

// baselines.cascade_sub_caches is at most 30 (params/selection_options.cc).
inline constexpr int kMaxCascadeSubCaches = 30;

struct CascadeLayer {
  int32_t* tokens = nullptr;  // [total capacity]
  float* ema = nullptr;       // [total capacity]
  int64_t* meta = nullptr;    // [num_sub_caches, 3]: head, size, offers (received while full)
  int num_sub_caches = 0;
  int32_t capacity[kMaxCascadeSubCaches] = {};
};

// Total slots of a layer's state.
int64_t CascadeTotalCapacity(const CascadeLayer& layer);

struct CascadeGatherParams {
  CascadeLayer layer;
  int32_t* list_slots = nullptr;         // [total capacity + num_tokens - next_token]
  int32_t* list_length = nullptr;        // [1]: held + num_tokens - next_token
  const int32_t* token_slots = nullptr;  // [num_tokens]: cache slot of every token
  int64_t next_token = 0;                // tokens [next_token, num_tokens) are new
  int64_t num_tokens = 0;
};
cudaError_t CascadeGather(const CascadeGatherParams& params, cudaStream_t stream);

struct CascadeUpdateParams {
  CascadeLayer layer;
  int32_t* selected = nullptr;      // [min(n_init, num_tokens) + total capacity], ascending
  int32_t* num_selected = nullptr;  // [1]
  const float* vote = nullptr;      // [list length]: CascadeGather's list order
  float decay = 0.9f;               // ema = decay * ema + (1 - decay) * vote
  int64_t next_token = 0;
  int64_t num_tokens = 0;
  int64_t n_init = 0;
};
cudaError_t CascadeUpdate(const CascadeUpdateParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_CASCADE_H_
