#include "engine/generation/cuda_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/selection/cuda_selection.h"

namespace tokenselect::engine {
namespace {

class CudaRunner : public SequenceRunner {
 public:
  CudaRunner(CudaModel* model, std::unique_ptr<CudaSelectionAttention> attention,
             std::atomic<bool>* busy)
      : model_(model), attention_(std::move(attention)), busy_(busy) {
    model_->Reset();
  }
  ~CudaRunner() override {
    model_->Reset();
    busy_->store(false);
  }

  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) override {
    return model_->Forward(tokens, attention_.get(), logits);
  }
  SelectionStats selection_stats() const override { return attention_->stats(); }
  absl::StatusOr<SelectionCacheCounters> cache_counters() const override {
    return attention_->CacheCounters(model_->stream());
  }

 private:
  CudaModel* model_;
  std::unique_ptr<CudaSelectionAttention> attention_;
  std::atomic<bool>* busy_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceRunner>> CudaBackend::Start(
    int64_t max_tokens, const SelectionOptions& selection) {
  RETURN_IF_ERROR(ValidateSelectionOptions(selection));
  const CudaModelOptions& mo = model_->options();
  if (selection.chunk_size > mo.max_chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.chunk_size ", selection.chunk_size,
                     " exceeds the GPU model's largest step of ", mo.max_chunk, " tokens"));
  }
  if (max_tokens > mo.max_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request needs ", max_tokens, " KV slots; the GPU model holds ",
                     mo.max_tokens));
  }
  bool expected = false;
  if (!busy_.compare_exchange_strong(expected, true)) {
    return absl::ResourceExhaustedError("the GPU backend is running another request");
  }
  auto attention = CudaSelectionAttention::Create(selection, model_->config(), mo.max_tokens,
                                                  mo.max_chunk);
  if (!attention.ok()) {
    busy_.store(false);
    return attention.status();
  }
  return std::unique_ptr<SequenceRunner>(
      std::make_unique<CudaRunner>(model_, *std::move(attention), &busy_));
}

absl::StatusOr<LoadedCudaModel> LoadCudaModelDirectory(const std::string& dir, LoadFormat format,
                                                       uint64_t dummy_seed,
                                                       const CudaModelOptions& options) {
  RETURN_IF_ERROR(CudaModel::CheckDevice());  // before reading gigabytes of weights
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::LoadFromDirectory(dir));
  if (tok->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the tokenizer has ", tok->vocab_size(), " tokens but config.json vocab_size is ",
        config.vocab_size));
  }
  LoadedCudaModel loaded;
  loaded.tokenizer = std::move(tok);
  if (format == LoadFormat::kDummy) {
    DummyWeightOptions dummy;
    dummy.seed = dummy_seed;
    ASSIGN_OR_RETURN(loaded.model, CudaModel::CreateDummy(config, dummy, options));
  } else {
    WeightLoadStats stats;
    ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(config, dir, &stats));
    ASSIGN_OR_RETURN(loaded.model, CudaModel::Create(config, weights, options));
  }
  return loaded;
}

}  // namespace tokenselect::engine
