// What a request's generation runs on: the forward pass, its KV storage and its token selection,
// behind one seam so that Generator (generator.h) and the prefill and decode workers drive the
// CPU backend and the GPU backend (cuda_backend.h, CUDA builds only) the same way.
//
//   GenerationBackend::Start   reserves the request's KV for all its tokens up front and sets up
//                              its selection (validated); the returned runner owns both
//   SequenceRunner::Forward    appends tokens (a prefill chunk or a decode token), optionally
//                              returning the last token's logits
//   SequenceRunner::kv         the request's K/V for the transfer between workers (a KvStore):
//                              the prefill worker sends out of it, the decode worker receives
//                              into it and then decodes on
//   GenerationBackend::DecodeBatch  one decode token for several runners in one step
// The runner releases the request's KV when destroyed, on success and on every error.
// Backends are thread-safe: runners of one backend may be used from different threads (each
// runner from one thread at a time).
#ifndef TOKENSELECT_ENGINE_GENERATION_BACKEND_H_
#define TOKENSELECT_ENGINE_GENERATION_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kvcache/page_pool.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/selection/selection_attention.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_store.h"

namespace tokenselect::engine {

class SequenceRunner {
 public:
  virtual ~SequenceRunner() = default;
  // Runs `tokens` (ids already checked against the vocabulary); writes the last token's logits
  // ([vocab]) when `logits` is not null.
  virtual absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) = 0;
  // Runs `tokens` for a greedy pick (temperature 0, no penalties, no logprobs): *token = the
  // lowest id holding the largest logit of the last token, where a backend can pick without
  // the logits crossing to the host (the GPU's); else *token = -1 and *logits = the logits, for
  // the caller's sampler (which also reports NaN or infinite logits). Errors as Forward's.
  virtual absl::Status ForwardGreedy(absl::Span<const int32_t> tokens, int32_t* token,
                                     std::vector<float>* logits) {
    *token = -1;
    return Forward(tokens, logits);
  }
  virtual SelectionStats selection_stats() const = 0;
  virtual absl::StatusOr<SelectionCacheCounters> cache_counters() const = 0;
  // The same per layer ([num_layers]).
  virtual absl::StatusOr<std::vector<SelectionCacheCounters>> layer_cache_counters() const = 0;
  // Tokens run (or received) so far.
  virtual int64_t length() const = 0;
  // The request's K/V (owned by the runner, valid while it lives).
  virtual KvStore* kv() = 0;
  // The selection policy's per-layer state for the KV stream's final record
  // (engine/transfer/selection_state.h); empty for stateless policies.
  virtual std::vector<std::string> CollectSelectionStates() const = 0;
  // Restores the states a prefill worker sent (0 or num_layers of them) before the first decode
  // step. InvalidArgument for another count.
  virtual absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states) = 0;
};

// A backend's KV capacity (pages of page_size token slots).
struct KvCapacity {
  int64_t total_pages = 0;
  int64_t free_pages = 0;
  int64_t page_size = 0;
  int64_t num_slots() const { return total_pages * page_size; }
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  virtual const ModelConfig& config() const = 0;
  // InvalidArgument / Unimplemented for selection options the backend refuses (the message
  // names the field); ResourceExhausted when the KV for max_tokens tokens cannot be reserved.
  virtual absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) = 0;
  // The geometry and element type of the backend's K/V (what a transfer must match).
  virtual KvLayout kv_layout() const = 0;
  virtual KvCapacity kv_capacity() const = 0;
  // Largest prefill chunk (selection.chunk_size) the backend runs in one step.
  virtual int64_t max_chunk() const = 0;
  // One decode step: runners[b] appends tokens[b]; `logits` gets [batch, vocab] (row b for
  // runners[b]). The runners must be this backend's, each at most once. The default runs them
  // one by one.
  virtual absl::Status DecodeBatch(absl::Span<SequenceRunner* const> runners,
                                   absl::Span<const int32_t> tokens, std::vector<float>* logits);
  // GPU backends: the whole K/V cache; nullopt for host backends.
  virtual std::optional<DeviceKvCache> device_cache() const { return std::nullopt; }
};

// The CPU backend: Model::Forward over a TokenTable of `pool`, selection by SelectionAttention.
// `model` and `pool` must outlive the backend and its runners; requests may run concurrently
// (the pool is thread-safe, each runner has its own workspace).
class CpuBackend : public GenerationBackend {
 public:
  CpuBackend(const Model* model, PagePool* pool) : model_(model), pool_(pool) {}
  const ModelConfig& config() const override { return model_->config(); }
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) override;
  KvLayout kv_layout() const override { return LayoutOf(*pool_); }
  KvCapacity kv_capacity() const override;
  int64_t max_chunk() const override;

 private:
  const Model* model_;
  PagePool* pool_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_BACKEND_H_
