#include "engine/generation/backend.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "engine/kvcache/token_table.h"
#include "engine/transfer/selection_state.h"

namespace tokenselect::engine {
namespace {

class CpuRunner : public SequenceRunner {
 public:
  CpuRunner(const Model* model, PagePool* pool, std::unique_ptr<SelectionAttention> attention)
      : model_(model),
        table_(pool, common::NewId("gen")),
        store_(&table_),
        attention_(std::move(attention)) {}

  absl::Status Reserve(int64_t max_tokens) { return table_.Reserve(max_tokens); }

  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) override {
    ForwardRequest request;
    request.tokens = tokens;
    request.table = &table_;
    request.attention = attention_.get();
    request.logits = logits != nullptr ? LogitsRows::kLast : LogitsRows::kNone;
    return model_->Forward(request, &workspace_, logits != nullptr ? logits : &scratch_);
  }
  SelectionStats selection_stats() const override { return attention_->stats(); }
  absl::StatusOr<SelectionCacheCounters> cache_counters() const override {
    return attention_->cache().total_counters();
  }
  absl::StatusOr<std::vector<SelectionCacheCounters>> layer_cache_counters() const override {
    const SelectionCache& cache = attention_->cache();
    std::vector<SelectionCacheCounters> layers(static_cast<size_t>(cache.num_layers()));
    for (int64_t l = 0; l < cache.num_layers(); ++l) {
      layers[static_cast<size_t>(l)] = cache.layer_counters(l);
    }
    return layers;
  }
  int64_t length() const override { return table_.length(); }
  KvStore* kv() override { return &store_; }
  std::vector<std::string> CollectSelectionStates() const override {
    return engine::CollectSelectionStates(*attention_, model_->config().num_layers);
  }
  absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states) override {
    return engine::RestoreSelectionStates(std::move(states), model_->config().num_layers,
                                          attention_.get());
  }

 private:
  const Model* model_;
  TokenTable table_;  // returns its pages when the runner is destroyed
  TableKvStore store_;
  std::unique_ptr<SelectionAttention> attention_;
  ForwardWorkspace workspace_;
  std::vector<float> scratch_;
};

}  // namespace

absl::Status GenerationBackend::DecodeBatch(absl::Span<SequenceRunner* const> runners,
                                            absl::Span<const int32_t> tokens,
                                            std::vector<float>* logits) {
  if (runners.size() != tokens.size() || runners.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeBatch: ", runners.size(),
                                                   " runners for ", tokens.size(), " tokens"));
  }
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  logits->resize(runners.size() * vocab);
  std::vector<float> row;
  for (size_t b = 0; b < runners.size(); ++b) {
    RETURN_IF_ERROR(runners[b]->Forward(tokens.subspan(b, 1), &row));
    std::copy(row.begin(), row.end(), logits->begin() + static_cast<std::ptrdiff_t>(b * vocab));
  }
  return absl::OkStatus();
}

KvCapacity CpuBackend::kv_capacity() const {
  KvCapacity c;
  c.total_pages = pool_->num_pages();
  c.free_pages = pool_->num_free_pages();
  c.page_size = pool_->page_size();
  return c;
}

int64_t CpuBackend::max_chunk() const { return std::numeric_limits<int64_t>::max(); }

absl::StatusOr<std::unique_ptr<SequenceRunner>> CpuBackend::Start(
    int64_t max_tokens, const SelectionOptions& selection) {
  ASSIGN_OR_RETURN(std::unique_ptr<SelectionAttention> attention,
                   SelectionAttention::Create(selection, model_->config().num_layers));
  auto runner = std::make_unique<CpuRunner>(model_, pool_, std::move(attention));
  // The whole request's KV up front: a request that starts never runs out mid-way.
  RETURN_IF_ERROR(runner->Reserve(max_tokens));
  return std::unique_ptr<SequenceRunner>(std::move(runner));
}

}  // namespace tokenselect::engine
