#include "engine/generation/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/selection/cuda_selection.h"

namespace tokenselect::engine {

// One request: its sequence in the model's pool and its selection provider. Its KvStore copies
// through the host (the host transport) or hands out the slots (device links).
class CudaRunner final : public SequenceRunner, public KvStore {
 public:
  CudaRunner(CudaBackend* backend, std::unique_ptr<CudaSequence> seq,
             std::unique_ptr<CudaSelectionAttention> attention)
      : backend_(backend), seq_(std::move(seq)), attention_(std::move(attention)) {}
  ~CudaRunner() override {
    auto lock = backend_->Lock();
    seq_.reset();  // returns the pages (cudaFree waits for the device)
    attention_.reset();
  }

  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) override {
    auto lock = backend_->Lock();
    return backend_->model_->Forward(seq_.get(), tokens, attention_.get(), logits);
  }
  SelectionStats selection_stats() const override { return attention_->stats(); }
  absl::StatusOr<SelectionCacheCounters> cache_counters() const override {
    auto lock = backend_->Lock();
    return attention_->CacheCounters(backend_->model_->stream());
  }
  absl::StatusOr<std::vector<SelectionCacheCounters>> layer_cache_counters() const override {
    auto lock = backend_->Lock();
    return attention_->LayerCacheCounters(backend_->model_->stream());
  }
  int64_t length() const override { return seq_->length(); }
  KvStore* kv() override { return this; }
  // The GPU policies keep no state beyond the selection cache, which starts empty on the
  // decode worker as it does after a prefill in one process (the first decode step misses).
  std::vector<std::string> CollectSelectionStates() const override { return {}; }
  absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states) override {
    if (!states.empty()) {
      return absl::UnimplementedError(
          "final.selection_states: the GPU backend's policies take no prefill state");
    }
    return absl::OkStatus();
  }

  // KvStore.
  KvLayout layout() const override { return backend_->kv_layout(); }
  int64_t capacity() const override { return seq_->capacity(); }
  absl::StatusOr<KvBlock> Encode(const KvBlockRange& range, int64_t sequence,
                                 bool checksum) override {
    const KvLayout layout = backend_->kv_layout();
    KvBlock block;
    block.sequence = sequence;
    block.layer_begin = range.layer_begin;
    block.layer_end = range.layer_end;
    block.token_begin = range.token_begin;
    block.token_end = range.token_end;
    block.dtype = layout.dtype;
    block.shape = {range.layer_end - range.layer_begin, 2, range.token_end - range.token_begin,
                   layout.num_kv_heads, layout.head_dim};
    block.data.resize(static_cast<size_t>(KvBlockBytes(layout, range)));
    {
      auto lock = backend_->Lock();
      RETURN_IF_ERROR(backend_->model_->ReadKv(*seq_, range.layer_begin, range.layer_end,
                                               range.token_begin, range.token_end,
                                               block.data.data()));
    }
    if (checksum) block.checksum = KvChecksum(block.data);
    return block;
  }
  absl::Status Write(const KvBlock& block) override {
    auto lock = backend_->Lock();
    return backend_->model_->WriteKv(seq_.get(), block.layer_begin, block.layer_end,
                                     block.token_begin, block.token_end, block.data.data());
  }
  absl::Status Commit(int64_t tokens) override {
    auto lock = backend_->Lock();
    return backend_->model_->SetLength(seq_.get(), tokens);
  }
  std::optional<KvDeviceSlots> device_slots() const override {
    return KvDeviceSlots{backend_->device_, seq_->slots()};
  }
  absl::Status Synchronize() override {
    auto lock = backend_->Lock();
    return backend_->model_->Synchronize();
  }

 private:
  friend class CudaBackend;
  CudaBackend* backend_;
  std::unique_ptr<CudaSequence> seq_;
  std::unique_ptr<CudaSelectionAttention> attention_;
};

CudaBackend::CudaBackend(CudaModel* model) : model_(model) { cudaGetDevice(&device_); }

absl::StatusOr<std::unique_ptr<SequenceRunner>> CudaBackend::Start(
    int64_t max_tokens, const SelectionOptions& selection) {
  RETURN_IF_ERROR(ValidateSelectionOptions(selection));
  const CudaModelOptions& mo = model_->options();
  if (selection.chunk_size > mo.max_chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.chunk_size ", selection.chunk_size,
                     " exceeds the GPU model's largest step of ", mo.max_chunk, " tokens"));
  }
  if (max_tokens > num_slots_limit()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", max_tokens, " KV slots; the GPU model holds ", num_slots_limit()));
  }
  auto lock = Lock();
  ASSIGN_OR_RETURN(std::unique_ptr<CudaSequence> seq, model_->NewSequence(max_tokens));
  // The provider's scratch scales with the request, not with the pool.
  ASSIGN_OR_RETURN(std::unique_ptr<CudaSelectionAttention> attention,
                   CudaSelectionAttention::Create(selection, model_->config(), max_tokens,
                                                  mo.max_chunk));
  return std::unique_ptr<SequenceRunner>(
      std::make_unique<CudaRunner>(this, std::move(seq), std::move(attention)));
}

KvLayout CudaBackend::kv_layout() const {
  const ModelConfig& c = model_->config();
  KvLayout layout;
  layout.num_layers = static_cast<int32_t>(c.num_layers);
  layout.num_kv_heads = static_cast<int32_t>(c.num_kv_heads);
  layout.head_dim = static_cast<int32_t>(c.head_dim);
  layout.dtype = KvDType::kBF16;
  return layout;
}

KvCapacity CudaBackend::kv_capacity() const {
  auto lock = Lock();
  KvCapacity c;
  c.total_pages = model_->num_pages();
  c.free_pages = model_->free_pages();
  c.page_size = model_->options().page_size;
  return c;
}

absl::Status CudaBackend::DecodeBatch(absl::Span<SequenceRunner* const> runners,
                                      absl::Span<const int32_t> tokens,
                                      std::vector<float>* logits) {
  if (runners.size() != tokens.size() || runners.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeBatch: ", runners.size(),
                                                   " runners for ", tokens.size(), " tokens"));
  }
  std::vector<CudaSequence*> seqs;
  std::vector<CudaAttentionProvider*> providers;
  for (SequenceRunner* r : runners) {
    auto* runner = dynamic_cast<CudaRunner*>(r);
    if (runner == nullptr || runner->backend_ != this) {
      return absl::InvalidArgumentError("DecodeBatch: a runner of another backend");
    }
    seqs.push_back(runner->seq_.get());
    providers.push_back(runner->attention_.get());
  }
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, model_->options().max_batch));
  logits->resize(runners.size() * vocab);
  std::vector<float> part;
  auto lock = Lock();
  for (size_t b = 0; b < runners.size(); b += step) {
    const size_t n = std::min(step, runners.size() - b);
    RETURN_IF_ERROR(model_->DecodeBatch(absl::MakeConstSpan(seqs).subspan(b, n),
                                        tokens.subspan(b, n),
                                        absl::MakeConstSpan(providers).subspan(b, n), &part));
    std::copy(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(n * vocab),
              logits->begin() + static_cast<std::ptrdiff_t>(b * vocab));
  }
  return absl::OkStatus();
}

std::optional<DeviceKvCache> CudaBackend::device_cache() const {
  const ModelConfig& c = model_->config();
  DeviceKvCache cache;
  cache.device = device_;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    cache.k_layers.push_back(model_->k_cache(l));
    cache.v_layers.push_back(model_->v_cache(l));
  }
  cache.num_slots = model_->num_slots();
  cache.row = c.num_kv_heads * c.head_dim;
  return cache;
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
