#include "engine/generation/backend.h"

#include <utility>

#include "common/ids.h"
#include "common/status.h"
#include "engine/kvcache/token_table.h"

namespace tokenselect::engine {
namespace {

class CpuRunner : public SequenceRunner {
 public:
  CpuRunner(const Model* model, PagePool* pool, std::unique_ptr<SelectionAttention> attention)
      : model_(model), table_(pool, common::NewId("gen")), attention_(std::move(attention)) {}

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

 private:
  const Model* model_;
  TokenTable table_;  // returns its pages when the runner is destroyed
  std::unique_ptr<SelectionAttention> attention_;
  ForwardWorkspace workspace_;
  std::vector<float> scratch_;
};

}  // namespace

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
