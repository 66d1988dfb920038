#include "engine/generation/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/selection/cuda_selection.h"
#include "engine/transfer/selection_state.h"

namespace tokenselect::engine {

namespace {

// Frees every rank's selection provider on that rank's device.
void ReleaseOnRanks(TpCudaModel* model,
                    std::vector<std::unique_ptr<CudaSelectionAttention>>* attention) {
  model
      ->RunOnRanks([attention](int rank, CudaModel*) {
        (*attention)[rank].reset();
        return absl::OkStatus();
      })
      .IgnoreError();
}

}  // namespace

// One request: its sequence in the model's pool and its selection provider on every rank. Its
// KvStore copies through the host (the host transport; every rank its KV heads) or, on one GPU,
// hands out the slots (device links).
class CudaRunner final : public SequenceRunner, public KvStore {
 public:
  CudaRunner(CudaBackend* backend, std::unique_ptr<TpSequence> seq,
             std::vector<std::unique_ptr<CudaSelectionAttention>> attention)
      : backend_(backend), seq_(std::move(seq)), attention_(std::move(attention)) {
    for (const auto& a : attention_) providers_.push_back(a.get());
  }
  ~CudaRunner() override {
    absl::MutexLock lock(&backend_->mu_);
    seq_.reset();  // returns the pages, on every rank (cudaFree waits for the device)
    ReleaseOnRanks(backend_->model_, &attention_);
  }

  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) override {
    absl::MutexLock lock(&backend_->mu_);
    return backend_->model_->Forward(seq_.get(), tokens, providers_, logits);
  }
  // The pick on the GPU (TpCudaModel::ForwardGreedy); the logits cross to the host only when
  // the CPU sampler has to see them (a NaN or an infinity).
  absl::Status ForwardGreedy(absl::Span<const int32_t> tokens, int32_t* token,
                             std::vector<float>* logits) override {
    absl::MutexLock lock(&backend_->mu_);
    ASSIGN_OR_RETURN(*token, backend_->model_->ForwardGreedy(seq_.get(), tokens, providers_));
    if (*token >= 0) return absl::OkStatus();
    return backend_->model_->CopyLastLogits(logits);
  }
  // Rank 0's: every rank selects the same tokens.
  SelectionStats selection_stats() const override { return attention_[0]->stats(); }
  absl::StatusOr<SelectionCacheCounters> cache_counters() const override {
    SelectionCacheCounters counters;
    absl::MutexLock lock(&backend_->mu_);
    RETURN_IF_ERROR(OnRankZero([&](CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(counters, attention_[0]->CacheCounters(shard->stream()));
      return absl::OkStatus();
    }));
    return counters;
  }
  absl::StatusOr<std::vector<SelectionCacheCounters>> layer_cache_counters() const override {
    std::vector<SelectionCacheCounters> counters;
    absl::MutexLock lock(&backend_->mu_);
    RETURN_IF_ERROR(OnRankZero([&](CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(counters, attention_[0]->LayerCacheCounters(shard->stream()));
      return absl::OkStatus();
    }));
    return counters;
  }
  int64_t length() const override { return seq_->length(); }
  KvStore* kv() override { return this; }
  // InfLLM's received attention (every rank holds the same sums: rank 0's); the other GPU
  // policies keep no state beyond the selection cache, which starts empty on the decode worker
  // as it does after a prefill in one process (the first decode step misses).
  std::vector<std::string> CollectSelectionStates() const override {
    std::vector<SelectionLayerState> states;
    absl::MutexLock lock(&backend_->mu_);
    const absl::Status copied = OnRankZero([&](CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(states, attention_[0]->ExportLayerStates(shard->stream()));
      return absl::OkStatus();
    });
    // The interface has no error path here: a failed copy (the device is gone) sends no state,
    // and the decode worker's steps then fail on the same device error.
    if (!copied.ok()) return {};
    return SerializeSelectionStates(states);
  }
  absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states) override {
    absl::MutexLock lock(&backend_->mu_);
    return backend_->model_->RunOnRanks([&](int rank, CudaModel* shard) {
      return attention_[rank]->ImportLayerStates(states, shard->stream());
    });
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
      absl::MutexLock lock(&backend_->mu_);
      RETURN_IF_ERROR(backend_->model_->RunOnRanks([&](int rank, CudaModel* shard) {
        return shard->ReadKv(*seq_->shard(rank), range.layer_begin, range.layer_end,
                             range.token_begin, range.token_end, block.data.data(),
                             Slice(rank, layout));
      }));
    }
    if (checksum) block.checksum = KvChecksum(block.data);
    return block;
  }
  absl::Status Write(const KvBlock& block) override {
    const KvLayout layout = backend_->kv_layout();
    absl::MutexLock lock(&backend_->mu_);
    return backend_->model_->RunOnRanks([&](int rank, CudaModel* shard) {
      return shard->WriteKv(seq_->shard(rank), block.layer_begin, block.layer_end,
                            block.token_begin, block.token_end, block.data.data(),
                            Slice(rank, layout));
    });
  }
  absl::Status Commit(int64_t tokens) override {
    absl::MutexLock lock(&backend_->mu_);
    return backend_->model_->RunOnRanks(
        [&](int rank, CudaModel* shard) { return shard->SetLength(seq_->shard(rank), tokens); });
  }
  std::optional<KvDeviceSlots> device_slots() const override {
    if (backend_->tp_size() != 1) return std::nullopt;
    return KvDeviceSlots{backend_->device(), seq_->shard(0)->slots()};
  }
  absl::Status Synchronize() override {
    absl::MutexLock lock(&backend_->mu_);
    return backend_->model_->RunOnRanks([](int, CudaModel* shard) { return shard->Synchronize(); });
  }

 private:
  friend class CudaBackend;
  // Rank r's KV heads within the whole model's host rows.
  KvHostSlice Slice(int rank, const KvLayout& layout) const {
    const int64_t local = backend_->model_->shard_config().num_kv_heads;
    return KvHostSlice{rank * local, layout.num_kv_heads};
  }
  // fn on rank 0's thread and device (the others do nothing).
  absl::Status OnRankZero(const std::function<absl::Status(CudaModel*)>& fn) const {
    return backend_->model_->RunOnRanks(
        [&](int rank, CudaModel* shard) { return rank == 0 ? fn(shard) : absl::OkStatus(); });
  }

  CudaBackend* backend_;
  std::unique_ptr<TpSequence> seq_;
  std::vector<std::unique_ptr<CudaSelectionAttention>> attention_;  // [rank]
  std::vector<CudaAttentionProvider*> providers_;                   // [rank]
};

CudaBackend::CudaBackend(CudaModel* model)
    : adopted_(TpCudaModel::Adopt(model)), model_(adopted_.get()) {}

CudaBackend::CudaBackend(TpCudaModel* model) : model_(model) {}

absl::StatusOr<std::unique_ptr<SequenceRunner>> CudaBackend::Start(
    int64_t max_tokens, const SelectionOptions& selection) {
  RETURN_IF_ERROR(ValidateSelectionOptions(selection));
  const CudaModelOptions& mo = shard_options();
  if (selection.chunk_size > mo.max_chunk) {
    return absl::InvalidArgumentError(absl::StrCat("selection.chunk_size ", selection.chunk_size,
                                                   " exceeds the GPU model's largest step of ",
                                                   mo.max_chunk, " tokens"));
  }
  if (max_tokens > mo.max_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request needs ", max_tokens, " KV slots; the GPU model holds ", mo.max_tokens));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::unique_ptr<TpSequence> seq, model_->NewSequence(max_tokens));
  // The provider's scratch scales with the request, not with the pool; each rank's is made on
  // its device, for its heads.
  std::vector<std::unique_ptr<CudaSelectionAttention>> attention(
      static_cast<size_t>(model_->size()));
  const absl::Status made = model_->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
    ASSIGN_OR_RETURN(attention[rank], CudaSelectionAttention::Create(
                                          selection, shard->config(), max_tokens, mo.max_chunk,
                                          model_->size(), mo.invariant_shards));
    return absl::OkStatus();
  });
  if (!made.ok()) {
    ReleaseOnRanks(model_, &attention);
    return made;
  }
  return std::unique_ptr<SequenceRunner>(
      std::make_unique<CudaRunner>(this, std::move(seq), std::move(attention)));
}

KvLayout CudaBackend::kv_layout() const {
  const ModelConfig& c = model_->config();
  KvLayout layout;
  layout.num_layers = static_cast<int32_t>(c.num_layers);
  layout.num_kv_heads = static_cast<int32_t>(c.num_kv_heads);
  layout.head_dim = static_cast<int32_t>(c.head_dim);
  layout.dtype =
      model_->shard(0)->kv_dtype() == KvCacheDType::kFP8E4M3 ? KvDType::kFp8E4M3 : KvDType::kBF16;
  return layout;
}

KvCapacity CudaBackend::kv_capacity() const {
  absl::MutexLock lock(&mu_);
  const CudaModel& shard = *model_->shard(0);  // every rank's pool makes the same allocations
  KvCapacity c;
  c.total_pages = shard.num_pages();
  c.free_pages = shard.free_pages();
  c.page_size = shard.options().page_size;
  return c;
}

absl::Status CudaBackend::DecodeBatch(absl::Span<SequenceRunner* const> runners,
                                      absl::Span<const int32_t> tokens,
                                      std::vector<float>* logits) {
  if (runners.size() != tokens.size() || runners.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeBatch: ", runners.size(), " runners for ", tokens.size(), " tokens"));
  }
  std::vector<TpSequence*> seqs;
  std::vector<CudaRunner*> rows;
  for (SequenceRunner* r : runners) {
    auto* runner = dynamic_cast<CudaRunner*>(r);
    if (runner == nullptr || runner->backend_ != this) {
      return absl::InvalidArgumentError("DecodeBatch: a runner of another backend");
    }
    seqs.push_back(runner->seq_.get());
    rows.push_back(runner);
  }
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, shard_options().max_batch));
  logits->resize(runners.size() * vocab);
  std::vector<float> part;
  absl::MutexLock lock(&mu_);
  for (size_t b = 0; b < runners.size(); b += step) {
    const size_t n = std::min(step, runners.size() - b);
    std::vector<std::vector<CudaAttentionProvider*>> providers(static_cast<size_t>(model_->size()));
    for (int r = 0; r < model_->size(); ++r) {
      for (size_t i = b; i < b + n; ++i) providers[r].push_back(rows[i]->providers_[r]);
    }
    RETURN_IF_ERROR(model_->DecodeBatch(absl::MakeConstSpan(seqs).subspan(b, n),
                                        tokens.subspan(b, n), providers, &part));
    std::copy(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(n * vocab),
              logits->begin() + static_cast<std::ptrdiff_t>(b * vocab));
  }
  return absl::OkStatus();
}

std::optional<DeviceKvCache> CudaBackend::device_cache() const {
  if (tp_size() != 1) return std::nullopt;
  const CudaModel& model = *model_->shard(0);
  const ModelConfig& c = model.config();
  DeviceKvCache cache;
  cache.device = device();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    cache.k_layers.push_back(model.k_cache(l));
    cache.v_layers.push_back(model.v_cache(l));
  }
  cache.num_slots = model.num_slots();
  // The links move rows in 2-byte units: an FP8 row of num_kv_heads * head_dim bytes is half
  // as many units (head_dim is even), copied byte for byte.
  cache.row = c.num_kv_heads * c.head_dim * model.kv_element_bytes() / 2;
  return cache;
}

namespace {

// What both loaders check and read before the weights.
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadGpuTokenizer(const std::string& dir,
                                                                       const ModelConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::LoadFromDirectory(dir));
  if (tok->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the tokenizer has ", tok->vocab_size(),
                                                   " tokens but config.json vocab_size is ",
                                                   config.vocab_size));
  }
  return tok;
}

}  // namespace

absl::StatusOr<LoadedTpCudaModel> LoadTpCudaModelDirectory(const std::string& dir,
                                                           LoadFormat format, uint64_t dummy_seed,
                                                           const TpCudaModelOptions& options) {
  RETURN_IF_ERROR(CudaModel::CheckDevice());  // before reading gigabytes of weights
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  RETURN_IF_ERROR(CudaModel::ShardConfig(config, options.tp_size).status());
  LoadedTpCudaModel loaded;
  ASSIGN_OR_RETURN(loaded.tokenizer, LoadGpuTokenizer(dir, config));
  if (format == LoadFormat::kDummy) {
    DummyWeightOptions dummy;
    dummy.seed = dummy_seed;
    ASSIGN_OR_RETURN(loaded.model, TpCudaModel::CreateDummy(config, dummy, options));
  } else {
    WeightLoadStats stats;
    ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(config, dir, &stats));
    ASSIGN_OR_RETURN(loaded.model, TpCudaModel::Create(config, weights, options));
  }
  return loaded;
}

}  // namespace tokenselect::engine
