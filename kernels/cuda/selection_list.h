// The small glue kernels between token selection and attention on the GPU (docs/DESIGN.md
// section 4), so that a decode step never waits for the host (the selection query itself is
// BuildSelectionQuery in prefill_attention.h):
//
//   BuildSelectedList    the attention list of one request from the selection's picks: the
//                        sinks [0, n_init), the picked candidates, the window
//                        [num_cached - n_local, num_cached), then the new tokens, at compact
//                        positions (entry j gets RoPE position j), with indptr, the queries'
//                        positions and causal visibility - engine/selection/attention_list.h's
//                        BuildAttentionList. Picks that fall into the window or past the cache
//                        (a selection-cache hit after the window moved) are dropped, so the list
//                        length is decided on the device.
//   FillDenseList        indptr, q positions and visibility of full attention (the entries are
//                        the token slots themselves at their true positions).
//   ListFromTokens       the same list from an already assembled selected set (ascending token
//                        indices whose count is on the device, as the span_scoring.h launchers
//                        write them), then the new tokens, at compact positions.
//
// All launchers take a cudaStream_t, never synchronise, and return the first CUDA error.
#ifndef TOKENSELECT_KERNELS_CUDA_SELECTION_LIST_H_
#define TOKENSELECT_KERNELS_CUDA_SELECTION_LIST_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_length.h"

namespace tokenselect::kernels::cuda {

struct SelectedListParams {
  int32_t* kv_indptr = nullptr;        // [2]: 0 and the list length
  int32_t* kv_indices = nullptr;       // [n_init + num_picks + n_local + num_new] (capacity)
  int32_t* kv_positions = nullptr;     // same capacity
  int32_t* q_positions = nullptr;      // [num_new]
  int32_t* visible = nullptr;          // [num_new]
  const int32_t* token_slots = nullptr;  // [num_cached + num_new]: cache slot of every token
  const int32_t* picks = nullptr;      // [num_picks] ascending offsets from n_init, or nullptr
  int64_t num_picks = 0;
  int64_t num_cached = 0;              // a bound when device_num_cached is set
  DeviceLength device_num_cached;      // optional: the current num_cached on the device
  int64_t num_new = 0;
  int64_t n_init = 0;                  // n_init + n_local <= num_cached
  int64_t n_local = 0;
  // Optional selection-cache accounting: counters[0] += *hit, counters[1] += 1 - *hit.
  const int32_t* hit = nullptr;
  int64_t* counters = nullptr;
};
// A block per 1024 entries of the longest list. cudaErrorInvalidValue for null outputs or
// inconsistent sizes.
cudaError_t BuildSelectedList(const SelectedListParams& params, cudaStream_t stream);

struct DenseListParams {
  int32_t* kv_indptr = nullptr;    // [2]: 0, num_cached + num_new
  int32_t* q_positions = nullptr;  // [num_new]: num_cached + i
  int32_t* visible = nullptr;      // [num_new]: num_cached + i + 1
  int64_t num_cached = 0;          // a bound when device_num_cached is set
  DeviceLength device_num_cached;  // optional: the current num_cached on the device
  int64_t num_new = 0;
};
cudaError_t FillDenseList(const DenseListParams& params, cudaStream_t stream);

struct TokensListParams {
  int32_t* kv_indptr = nullptr;        // [2]: 0, count + num_new
  int32_t* kv_indices = nullptr;       // [capacity + num_new]
  int32_t* kv_positions = nullptr;     // [capacity + num_new]
  int32_t* q_positions = nullptr;      // [num_new]
  int32_t* visible = nullptr;          // [num_new]
  const int32_t* token_slots = nullptr;  // [num_cached + num_new]
  const int32_t* tokens = nullptr;     // [*count] ascending indices in [0, num_cached)
  const int32_t* count = nullptr;      // [1], device; at most capacity
  int64_t capacity = 0;
  int64_t num_cached = 0;
  int64_t num_new = 0;
};
// One block. cudaErrorInvalidValue for null pointers or negative sizes.
cudaError_t ListFromTokens(const TokensListParams& params, cudaStream_t stream);

// out[i] = i for i in [0, n): the identity positions of dense lists.
cudaError_t FillIota(int32_t* out, int64_t n, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SELECTION_LIST_H_
