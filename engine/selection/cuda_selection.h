// Token selection on the GPU: the CudaAttentionProvider (engine/model/cuda_attention.h) of the
// policies that have CUDA kernels, with the semantics of SelectionAttention (the CPU provider,
// selection_attention.h), which is its oracle:
//   dense, or a budget that covers the cache   full attention (the token slots in order)
//   streaming                                  sinks [0, n_init) + the last k + n_local tokens
//   tokenselect / topk                         selection query (the step's queries rotated at
//                                              n_local + i, averaged) -> paged key scores over
//                                              the candidates [n_init, N - n_local) -> soft vote
//                                              (tokenselect) or summed logits (topk) -> top-k
//   quest                                      selection query -> per-page channel min/max of
//                                              the keys (kept per layer; only pages not yet
//                                              complete are rebuilt) -> upper-bound page scores
//                                              -> pages best first into k tokens
//                                              (kernels/cuda/span_scoring.h)
//   infllm                                     every step: the new tokens' received attention
//                                              (ChunkReceivedAttention, kept per layer as the
//                                              CPU's SelectionLayerState::received); selection
//                                              query -> per block of the candidates its most
//                                              attended tokens -> block scores -> the top
//                                              k / block_size blocks (span_scoring.h)
// then sinks + picks + window + the new tokens at compact positions. On one GPU, TokenSelect
// lists of kBoundVoteMinCandidates (320K) candidates or more are scored, voted and ranked by the
// bound-vote selection instead (BoundVoteSelect, kernels/cuda/selection.h: no fp32 logits in
// memory, the same picks up to near-ties; head_dim 128, groups of 4). Decode steps go through
// the per-layer selection cache, kept on the device: the cosine check writes a hit flag that the
// scoring kernels read, so a hit skips the key scan and reuses the layer's stored picks without
// the host ever waiting (kernels/cuda/selection.h). Picks that fall into the moved window are
// dropped on the device (BuildSelectedList), as on the CPU.
//
// An FP8 KV cache (CudaAttentionQuery::kv_dtype) is read by the key scoring, Quest's page
// bounds, InfLLM's received attention and block scores and the span index's map and span
// scores, all dequantizing as they read
// (docs/fp8_kv.md).
//
//   tokenselect_span                           every step: the chunk's attention map and span
//                                              detection on the GPU into the layer's span index
//                                              (CudaSpanIndex, cuda_span_index.h); selection
//                                              query -> span scores over the index vectors ->
//                                              spans best first into the token budget -> the
//                                              exact soft vote over their tokens (SpanSelect);
//                                              decode through the selection cache (a hit
//                                              skips SpanSelect; ApplySelectionCache reuses
//                                              the picks); bf16 or FP8 keys; under tensor
//                                              parallelism
//                                              the map and the span scores and votes are
//                                              summed over the ranks (no TP-invariant mode)
//   cascade                                    every selecting step: the held tokens of the
//                                              layer's cascading cache and the tokens cached
//                                              since its last step, scored and soft-voted with
//                                              the selection query; their EMA scores updated,
//                                              the new tokens pushed (CudaCascade,
//                                              cuda_cascade.h); sinks + every held token
//   head_vote                                  as tokenselect up to the logits; then each
//                                              head's top k (HeadLogitColumn + TopK, a head at
//                                              a time) counted as votes, and the k candidates
//                                              with the most votes, ties by summed logits
//                                              (HeadVoteRankScores + TopK)
// The scoring kernels take head_dim 64/128 with query-head groups 1/2/4/8: Create returns
// Unimplemented naming the shape otherwise. Quest keeps its page bounds per layer:
// L x ceil(N / page_size) x 2 x kv_dim bf16, 1/8 of the K cache at pages of 16. InfLLM keeps L x
// max_tokens fp32 received attention (4 bytes per token and layer), cascade L x (k + n_local)
// (token, score) pairs; their states travel to a decode worker through ExportLayerStates /
// ImportLayerStates (layer_state.h).
//
// Tensor parallelism (docs/parallel.md): one provider per rank, created with the rank's shard
// config (CudaModel::ShardConfig) and the group size. Each rank scores with its own heads and
// keys; the head-summed quantities are all-reduced through query.tp before anything is chosen -
// the soft votes (or summed logits) before the top-k, Quest's page bounds before the page
// choice, and for the selection cache the ranks' selection queries are gathered (a zero-padded
// all-reduce) so that the cosine is taken over all heads - so every rank selects exactly the
// same tokens and takes the same cache decisions. InfLLM's received attention and block scores,
// and tokenselect_span's chunk map, span scores and kept-token votes, are summed over the ranks
// the same way (not in the fixed order of TP-invariant numerics: Create refuses infllm and
// tokenselect_span with invariant_shards > 0). With tp_size 1 no collective runs.
//
// One per request; not thread-safe. Every launch goes to the query's stream. Memory: besides the
// per-layer cache entries (L x (H*d floats + k ids)), each provider owns its scoring scratch
// (max_tokens x H fp32 logits, votes, top-k workspace: ~132 MB at 1M tokens and 32 heads; the
// bound-vote workspace adds 20 bytes per token from 320K), which providers that share a stream
// could share; that is left for the decode worker's GPU path.
#ifndef TOKENSELECT_ENGINE_SELECTION_CUDA_SELECTION_H_
#define TOKENSELECT_ENGINE_SELECTION_CUDA_SELECTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/model_config.h"
#include "engine/selection/cuda_cascade.h"
#include "engine/selection/cuda_span_index.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_attention.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::engine {

using kernels::cuda::kBoundVoteMinCandidates;

class CudaSelectionAttention : public CudaAttentionProvider {
 public:
  // For sequences of up to max_tokens tokens and steps of up to max_new tokens, on one rank of
  // a tp_size-way tensor-parallel group (config: the rank's shard). InvalidArgument for invalid
  // options (ValidateSelectionOptions) or tp_size < 1, Unimplemented for a policy without a GPU
  // provider, ResourceExhausted when device memory runs out. Select refuses (FailedPrecondition)
  // a query whose group size is not tp_size. invariant_shards (CudaModelOptions): 0, or S in
  // {1, 2, 4}, a multiple of tp_size: selections that do not depend on the tensor-parallel size
  // (softmax statistics in a fixed order, Quest's page scores summed over S head groups in a
  // fixed tree); the model's own invariant_shards.
  // bound_vote_min_candidates: on one GPU (tp_size 1, invariant_shards 0), TokenSelect steps
  // with at least this many candidates (the host bound) select by BoundVoteSelect
  // (kernels/cuda/selection.h: no fp32 logits in memory; the same picks up to near-ties) where
  // the shape allows it (head_dim 128, 4 query heads per kv head, 1/2/4/8 kv heads); the
  // default is where it was measured faster (kBoundVoteMinCandidates); tests lower it.
  static absl::StatusOr<std::unique_ptr<CudaSelectionAttention>> Create(
      const SelectionOptions& options, const ModelConfig& config, int64_t max_tokens,
      int64_t max_new, int tp_size = 1, int invariant_shards = 0,
      int64_t bound_vote_min_candidates = kBoundVoteMinCandidates);
  ~CudaSelectionAttention() override;
  CudaSelectionAttention(const CudaSelectionAttention&) = delete;
  CudaSelectionAttention& operator=(const CudaSelectionAttention&) = delete;

  absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) override;
  // Decode steps of dense, streaming, tokenselect and topk (not quest or infllm: they keep
  // per-layer host state), once the budget no longer covers the cache, up to the provider's
  // max_tokens.
  bool SupportsDeviceLength(const CudaAttentionQuery& query, int64_t bound) const override;
  void AccountReplay(const CudaAttentionQuery& query) override;

  const SelectionOptions& options() const { return options_; }
  // Host-side counts (layer steps, attended-token bounds, candidates scored; selection_seconds
  // stays 0: the work is asynchronous - time it with the GPU benchmarks).
  const SelectionStats& stats() const { return stats_; }
  // The selection cache's hits and misses over all layers (copies device counters: waits for
  // the stream).
  absl::StatusOr<SelectionCacheCounters> CacheCounters(cudaStream_t stream) const;
  // The same per layer ([num_layers]), for the decode worker's per-layer metrics.
  absl::StatusOr<std::vector<SelectionCacheCounters>> LayerCacheCounters(
      cudaStream_t stream) const;
  // The picks (candidate offsets from n_init, ascending) a layer's selection cache holds, for
  // tests (waits for the stream).
  absl::StatusOr<std::vector<int32_t>> LayerPicks(int64_t layer, cudaStream_t stream) const;

  // The per-layer state a disaggregated decode worker needs to continue where this provider
  // stopped (engine/transfer/selection_state.h): for infllm one SelectionLayerState per layer
  // holding the received attention of the tokens observed so far, for tokenselect_span that and
  // the span index, for cascade the cascading cache; empty for the other policies (they keep
  // nothing but the selection cache, which starts empty on a decode worker). Waits for the
  // stream.
  absl::StatusOr<std::vector<SelectionLayerState>> ExportLayerStates(cudaStream_t stream) const;
  // Restores such states before the first step: empty (nothing to do) or one per layer.
  // InvalidArgument for another count, more tokens than the provider holds or (cascade) a cache
  // no sequence of pushes could have built, Unimplemented for states given to a policy other
  // than infllm, tokenselect_span and cascade. infllm reads only the received attention,
  // cascade only the cascading cache. Waits for the stream.
  absl::Status ImportLayerStates(const std::vector<SelectionLayerState>& states,
                                 cudaStream_t stream);

 private:
  struct Device;
  CudaSelectionAttention(const SelectionOptions& options, const ModelConfig& config, int tp_size,
                         int invariant_shards);
  // Quest's selection into the provider's list buffers (indptr, indices, positions, q
  // positions, visibility).
  absl::Status SelectQuest(const CudaAttentionQuery& query);
  // InfLLM: the step's received attention into the layer state (every step), and the selection.
  absl::Status ObserveInfLlm(const CudaAttentionQuery& query);
  absl::Status SelectInfLlm(const CudaAttentionQuery& query);
  // tokenselect_span's selection over the layer's span index (spans_).
  absl::Status SelectSpan(const CudaAttentionQuery& query);
  // head_vote's picks (candidate offsets, ascending) of a step's candidates into `picks`.
  absl::Status HeadVotePicks(const CudaAttentionQuery& query, int64_t candidates,
                             kernels::cuda::DeviceLength device_candidates, const int32_t* skip,
                             int32_t* picks);
  // cascade's selection through the layer's cascading cache (cascade_).
  absl::Status SelectCascade(const CudaAttentionQuery& query);
  // ScoreKeys' parameters for the selection query (d.query) against the keys of `slots`.
  kernels::cuda::KeyScoreParams ScoreParams(const int32_t* slots, int64_t n,
                                            kernels::cuda::DeviceLength device_n,
                                            const int32_t* skip,
                                            const CudaAttentionQuery& query) const;
  // The selection query against n keys (a bound when device_n is set) -> the soft vote
  // (soft_vote) or the summed logits in d.vote, summed over the ranks' heads under tensor
  // parallelism; skip: optional hit flag. top_k_histogram: the vote builds the first histogram
  // of the TopK that ranks it next (one GPU only).
  absl::Status VoteKeys(const CudaAttentionQuery& query, const int32_t* slots, int64_t n,
                        kernels::cuda::DeviceLength device_n, const int32_t* skip, bool soft_vote,
                        bool top_k_histogram);
  // The step's selection query (d.query) against the layer's selection-cache entry: the hit
  // flag d.hit[layer] on the device (the entry is replaced on a miss). tp: the rank's group
  // under tensor parallelism, else nullptr.
  absl::Status CheckSelectionCache(const CudaAttentionQuery& query, CudaTensorParallel* tp);
  // The list from the selected set (Quest's, InfLLM's and the span index's selected /
  // num_selected buffers).
  absl::Status ListFromSelected(const CudaAttentionQuery& query);
  // The statistics of one layer step of m new tokens after n cached ones.
  void Account(int64_t layer, int64_t n, int64_t m);

  const SelectionOptions options_;
  const ModelConfig config_;
  const int tp_size_;
  const int invariant_shards_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<CudaSpanIndex> spans_;  // tokenselect_span only
  std::unique_ptr<CudaCascade> cascade_;  // cascade only
  SelectionStats stats_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CUDA_SELECTION_H_
