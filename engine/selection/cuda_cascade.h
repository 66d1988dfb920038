// The cascade policy's per-request state on the GPU backend (the Cascading KV cache baseline,
// docs/DESIGN.md section 4), used by CudaSelectionAttention (cuda_selection.h): the GPU twin of
// CascadePolicy (cascade_policy.h), whose selections it reproduces. Each layer keeps a
// CascadeCache's sub-caches in device memory (kernels/cuda/cascade.h) and, on the host, the
// next token to push (-1 while the layer never selected: the CPU's unconfigured cache).
//
// A selecting step of a layer (the budget no longer covers the N cached tokens):
//   Begin   restarts the layer's cache after a rollback (N below what was pushed), as the CPU
//           does, and gathers the step's token list: the held tokens, then [next, N);
//   the caller scores the list with the step's selection query and soft-votes it (summed over
//           the ranks' heads under tensor parallelism, so every rank keeps the same cache);
//   Finish  the held tokens' EMA update, the pushes, and the selected set: the sinks and every
//           held token, ascending, with its count on the device.
// Nothing waits for the host but Export and Import, which carry the layers' caches to and from a
// disaggregated decode worker as the CPU's SelectionLayerState::cascade.
#ifndef TOKENSELECT_ENGINE_SELECTION_CUDA_CASCADE_H_
#define TOKENSELECT_ENGINE_SELECTION_CUDA_CASCADE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/selection/device_arena.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_options.h"
#include "kernels/cuda/cascade.h"

namespace tokenselect::engine {

class CudaCascade {
 public:
  // For sequences of up to max_tokens tokens. ResourceExhausted when device memory runs out.
  static absl::StatusOr<std::unique_ptr<CudaCascade>> Create(const SelectionOptions& options,
                                                             int64_t num_layers,
                                                             int64_t max_tokens);

  // The step's token list, on the device: slots [bound] of which the first *length are valid.
  struct List {
    const int32_t* slots = nullptr;
    const int32_t* length = nullptr;
    int64_t bound = 0;  // >= 1
  };
  // num_tokens: the layer's cached tokens, above the budget n_init + k + n_local.
  absl::StatusOr<List> Begin(int64_t layer, int64_t num_tokens, const int32_t* token_slots,
                             cudaStream_t stream);
  // vote: [bound] the list's soft vote (the first *length entries are read). Writes the selected
  // set (at most n_init + k + n_local tokens) and its count.
  absl::Status Finish(int64_t layer, int64_t num_tokens, const float* vote, int32_t* selected,
                      int32_t* num_selected, cudaStream_t stream);
  // The length bound Begin would give (statistics; no state changes).
  int64_t ListBound(int64_t layer, int64_t num_tokens) const;

  // One state per layer with only `cascade` set (waits for the stream).
  absl::StatusOr<std::vector<SelectionLayerState>> Export(cudaStream_t stream) const;
  // Restores one state per layer (the caller checked the count). A cache whose capacities are
  // not this policy's is dropped (the CPU would restart it); InvalidArgument for a sub-cache over
  // its capacity or a next token beyond max_tokens. Waits for the stream.
  absl::Status Import(const std::vector<SelectionLayerState>& states, cudaStream_t stream);

 private:
  CudaCascade(const SelectionOptions& options, int64_t num_layers, int64_t max_tokens);
  kernels::cuda::CascadeLayer Layer(int64_t layer) const;
  // Whether a selection of `layer` at num_tokens restarts its cache (never selected, or a
  // rollback), and the first token it pushes (the cache's next token, at least n_init).
  bool Restarts(int64_t layer, int64_t num_tokens) const;
  int64_t FirstNew(int64_t layer, int64_t num_tokens) const;

  const SelectionOptions options_;
  const int64_t num_layers_;
  const int64_t max_tokens_;
  std::vector<int64_t> capacities_;  // CascadeCache::EqualCapacities(k + n_local, N)
  int64_t total_ = 0;                // their sum
  std::vector<int64_t> next_;        // [L]: -1 = not configured
  DeviceArena arena_;
  int32_t* tokens_ = nullptr;       // [L, total]
  float* ema_ = nullptr;            // [L, total]
  int64_t* meta_ = nullptr;         // [L, N, 3]
  int32_t* list_slots_ = nullptr;   // [max_tokens - n_init]
  int32_t* list_length_ = nullptr;  // [1]
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CUDA_CASCADE_H_
