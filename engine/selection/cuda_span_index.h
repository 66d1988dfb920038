// tokenselect_span's per-request state on the GPU backend (the span index of docs/DESIGN.md
// section 4, Ltri-LLM), used by CudaSelectionAttention (cuda_selection.h): the GPU twin of
// SpanPolicy::ObserveChunk and Select (span_policy.h), whose results it reproduces.
//
// Observe, every forward step and layer (before the step's selection):
//   - a step of several tokens: the chunk's causal attention map A and its received attention on
//     the GPU (ChunkAttentionMap), then the span detection on the GPU (DetectChunkSpans: the
//     same spans, scores and index tokens as the CPU's DetectSpans given A), then the host waits
//     for the chunk's spans (a few KB), appends them to the layer's SpanIndex, and a kernel
//     appends them to the layer's device copy;
//   - a one-token step (decode): DetectSpans of the 1 x 1 map [num_heads] on the host (a span of
//     the token itself, its key the index vector), no GPU work but the device append.
// As on the CPU, a step that starts before the index's end rolls the index back first, and tokens
// the index never observed become one span without index vectors.
//
// The host keeps each layer's SelectionLayerState (received attention and span index, the
// CPU's types), which Export / Import carry to and from a disaggregated decode worker in the
// CPU's format; the device keeps the index as CSR (SpanIndexView) for SpanSelect
// (kernels/cuda/span_scoring.h): span scores over the index vectors, spans best first into the
// token budget, the exact soft vote over their tokens.
//
// Under tensor parallelism each rank computes its heads' share of the chunk map and received
// attention and the ranks sum them (an all-reduce of c^2 + c floats per layer of a multi-token
// step), so that every rank detects the same spans and keeps the same index; SpanSelect runs in
// its three parts with the span scores and the kept tokens' votes summed between them. Not with
// TP-invariant numerics (CudaSelectionAttention::Create refuses them). bf16 or FP8 KV caches
// (the map and SpanSelect dequantize FP8 keys as they read), steps of up to kMaxSpanChunk tokens
// (the map's and the detection's workspaces are O(c^2): ~116 bytes per map entry, 30 MB at
// 512). The host waits once per layer of a multi-token step.
#ifndef TOKENSELECT_ENGINE_SELECTION_CUDA_SPAN_INDEX_H_
#define TOKENSELECT_ENGINE_SELECTION_CUDA_SPAN_INDEX_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/model_config.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_options.h"
#include "kernels/cuda/span_scoring.h"

namespace tokenselect::engine {

inline constexpr int64_t kMaxSpanChunk = 4096;

// The step's new tokens as ChunkReceivedAttention / ChunkAttentionMap see them (InfLLM's
// received attention, the span index's map): queries and keys of tokens [n, n + m) of the
// query, at the model's attention scale (what the CPU's SelectionAttention gives its policy);
// received and workspace are the caller's.
kernels::cuda::ReceivedAttentionParams StepChunkParams(const CudaAttentionQuery& query,
                                                       const ModelConfig& config, float* received,
                                                       void* workspace);

class CudaSpanIndex {
 public:
  // For sequences of up to max_tokens tokens and steps of up to max_new (<= kMaxSpanChunk)
  // tokens. InvalidArgument for other sizes, ResourceExhausted when device memory runs out.
  static absl::StatusOr<std::unique_ptr<CudaSpanIndex>> Create(const SelectionOptions& options,
                                                               const ModelConfig& config,
                                                               int64_t max_tokens, int64_t max_new);
  ~CudaSpanIndex();
  CudaSpanIndex(const CudaSpanIndex&) = delete;
  CudaSpanIndex& operator=(const CudaSpanIndex&) = delete;

  // The step's new tokens into the layer's index (see above). Waits for the stream when the
  // step has more than one token.
  absl::Status Observe(const CudaAttentionQuery& query);

  // SpanSelect over the layer's index into `out` (problem: the step's, from StepProblem, with
  // this rank's heads); skip: SpanSelectParams::skip (a selection-cache hit flag on the device)
  // or nullptr; tp: the rank's group (its span scores and votes are summed over the ranks), or
  // nullptr on one GPU.
  absl::Status Select(int64_t layer, const kernels::cuda::SelectionProblem& problem,
                      const kernels::cuda::SelectionOutput& out, const int32_t* skip,
                      CudaTensorParallel* tp, cudaStream_t stream);

  // The index vectors of the layer's spans (what Select scores besides the kept tokens).
  int64_t NumIndexTokens(int64_t layer) const;

  // The per-layer states (received attention and span index), current after each Observe.
  const std::vector<SelectionLayerState>& states() const { return states_; }
  // Replaces them (one per layer) and uploads the indexes; InvalidArgument when a state holds
  // more tokens than the provider. Waits for the stream.
  absl::Status Import(const std::vector<SelectionLayerState>& states, cudaStream_t stream);

 private:
  struct Device;
  CudaSpanIndex(const SelectionOptions& options, const ModelConfig& config);
  // Makes the layer's device index equal the host's (uploads what changed since the device was
  // last in step with it).
  absl::Status Upload(int64_t layer, cudaStream_t stream);
  // Room for the layer's device index to hold `spans` spans and `tokens` index tokens.
  absl::Status Reserve(int64_t layer, int64_t spans, int64_t tokens, cudaStream_t stream);

  SelectionOptions options_;
  ModelConfig config_;
  std::vector<SelectionLayerState> states_;  // [L]
  std::unique_ptr<Device> dev_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CUDA_SPAN_INDEX_H_
