// What a request's generation runs on: the forward pass, its KV storage and its token selection,
// behind one seam so that Generator (generator.h) drives the CPU backend and the GPU backend
// (cuda_backend.h, CUDA builds only) the same way.
//
//   GenerationBackend::Start   reserves the request's KV for all its tokens up front and sets up
//                              its selection (validated); the returned runner owns both
//   SequenceRunner::Forward    appends tokens (a prefill chunk or a decode token), optionally
//                              returning the last token's logits
// The runner releases the request's KV when destroyed, on success and on every error.
#ifndef TOKENSELECT_ENGINE_GENERATION_BACKEND_H_
#define TOKENSELECT_ENGINE_GENERATION_BACKEND_H_

#include <cstdint>
#include <memory>
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

namespace tokenselect::engine {

class SequenceRunner {
 public:
  virtual ~SequenceRunner() = default;
  // Runs `tokens` (ids already checked against the vocabulary); writes the last token's logits
  // ([vocab]) when `logits` is not null.
  virtual absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) = 0;
  virtual SelectionStats selection_stats() const = 0;
  virtual absl::StatusOr<SelectionCacheCounters> cache_counters() const = 0;
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  virtual const ModelConfig& config() const = 0;
  // InvalidArgument / Unimplemented for selection options the backend refuses (the message
  // names the field); ResourceExhausted when the KV for max_tokens tokens cannot be reserved.
  virtual absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) = 0;
};

// The CPU backend: Model::Forward over a TokenTable of `pool`, selection by SelectionAttention.
// `model` and `pool` must outlive the backend and its runners; requests may run concurrently.
class CpuBackend : public GenerationBackend {
 public:
  CpuBackend(const Model* model, PagePool* pool) : model_(model), pool_(pool) {}
  const ModelConfig& config() const override { return model_->config(); }
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) override;

 private:
  const Model* model_;
  PagePool* pool_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_BACKEND_H_
