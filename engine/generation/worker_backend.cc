#include "engine/generation/worker_backend.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/model/tp_invariance.h"

#ifdef TS_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>

#include "engine/generation/cuda_backend.h"
#include "engine/model/cuda_model.h"
#endif

namespace tokenselect::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class CpuWorker : public WorkerBackend {
 public:
  CpuWorker(LoadedModel owned, const Model* model, const tokenizer::Tokenizer* tok,
            std::unique_ptr<PagePool> pool)
      : owned_(std::move(owned)),
        tokenizer_(tok),
        pool_(std::move(pool)),
        backend_(model, pool_.get()) {}
  GenerationBackend* backend() override { return &backend_; }
  const tokenizer::Tokenizer* tokenizer() const override { return tokenizer_; }
  const PagePool* cpu_pool() const override { return pool_.get(); }
  std::string Describe() const override {
    return absl::StrCat("cpu, ", pool_->num_pages(), " KV pages of ", pool_->page_size(),
                        " tokens");
  }

 private:
  LoadedModel owned_;  // empty when the model is borrowed
  const tokenizer::Tokenizer* tokenizer_;
  std::unique_ptr<PagePool> pool_;
  CpuBackend backend_;
};

#ifdef TS_HAVE_CUDA_BACKEND
class CudaWorker : public WorkerBackend {
 public:
  explicit CudaWorker(LoadedTpCudaModel loaded)
      : loaded_(std::move(loaded)), backend_(loaded_.model.get()) {}
  GenerationBackend* backend() override { return &backend_; }
  const tokenizer::Tokenizer* tokenizer() const override { return loaded_.tokenizer.get(); }
  std::string Describe() const override {
    const TpCudaModel& tp = *loaded_.model;
    const CudaModel& m = *tp.shard(0);
    std::string gpus = absl::StrCat("cuda:", tp.device(0));
    if (tp.size() > 1) {
      absl::StrAppend(&gpus, "-", tp.device(tp.size() - 1), " (tensor parallel, ", tp.size(),
                      " ranks)");
    }
    std::string line = absl::StrFormat(
        "%s, %d KV token slots (%d pages of %d; %s, %.2f GiB per GPU), weights %.2f GiB per "
        "GPU, steps of up to %d tokens, decode batches of up to %d",
        gpus, m.num_slots(), m.num_pages(), m.options().page_size, KvCacheDTypeName(m.kv_dtype()),
        static_cast<double>(m.kv_bytes()) / kGiB, static_cast<double>(m.weight_bytes()) / kGiB,
        m.options().max_chunk, m.options().max_batch);
    if (m.options().invariant_shards > 0) {
      absl::StrAppend(&line, ", TP-invariant numerics for --tp dividing ",
                      m.options().invariant_shards);
    }
    return line;
  }

 private:
  LoadedTpCudaModel loaded_;  // frees its shards on their devices
  CudaBackend backend_;
};

// The bytes of GPU `gpu` this process may use in all: its share of the whole GPU, less what
// others already hold.
absl::StatusOr<int64_t> GpuBudget(int gpu, double fraction) {
  if (cudaSetDevice(gpu) != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("cuda:", gpu, ": cannot use the device"));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", gpu, ": cannot read the GPU's free memory"));
  }
  const int64_t used_by_others = static_cast<int64_t>(total_bytes - free_bytes);
  return std::min<int64_t>(
      static_cast<int64_t>(free_bytes),
      static_cast<int64_t>(fraction * static_cast<double>(total_bytes)) - used_by_others);
}

absl::StatusOr<std::unique_ptr<WorkerBackend>> LoadCudaWorker(const std::string& dir,
                                                              LoadFormat format,
                                                              const WorkerBackendOptions& o) {
  TpCudaModel::RequestEagerLoading(o.tp);  // before the first CUDA call, the next line
  RETURN_IF_ERROR(CudaModel::CheckDevice());
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || o.gpu + o.tp > count) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("--gpu ", o.gpu, " --tp ", o.tp,
                                                   " needs CUDA devices ", o.gpu, "..",
                                                   o.gpu + o.tp - 1, "; this machine has ", count));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(const ModelConfig shard, CudaModel::ShardConfig(config, o.tp));
  TpCudaModelOptions tp;
  tp.tp_size = o.tp;
  for (int r = 0; r < o.tp; ++r) tp.devices.push_back(o.gpu + r);
  CudaModelOptions& cuda = tp.model;
  cuda.page_size = o.page_size;
  cuda.max_chunk = o.max_chunk;
  cuda.max_batch = o.max_batch;
  cuda.kv_dtype = o.kv_dtype;
  cuda.invariant_shards = o.tp_invariant;
  if (o.kv_pages > 0) {
    cuda.max_tokens = o.kv_pages * o.page_size;
  } else {
    // Every rank holds the same number of slots (of its KV heads): plan for the GPU with the
    // least room.
    int64_t budget = std::numeric_limits<int64_t>::max();
    for (int device : tp.devices) {
      ASSIGN_OR_RETURN(const int64_t b, GpuBudget(device, o.gpu_memory_fraction));
      budget = std::min(budget, b);
    }
    ASSIGN_OR_RETURN(cuda.max_tokens, PlanKvTokens(shard, budget, o.page_size, o.max_chunk,
                                                   o.max_batch, KvCacheElementBytes(o.kv_dtype)));
  }
  ASSIGN_OR_RETURN(LoadedTpCudaModel loaded,
                   LoadTpCudaModelDirectory(dir, format, o.dummy_seed, tp));
  return std::unique_ptr<WorkerBackend>(std::make_unique<CudaWorker>(std::move(loaded)));
}
#endif

}  // namespace

absl::Status ValidateWorkerBackendOptions(const WorkerBackendOptions& o) {
  if (o.device != "cpu" && o.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", o.device, "'"));
  }
  if (o.gpu < 0) return absl::InvalidArgumentError(absl::StrCat("--gpu must be >= 0"));
  if (o.tp < 1) return absl::InvalidArgumentError("--tp must be >= 1");
  if (o.tp > 1 && o.device != "cuda") {
    return absl::InvalidArgumentError("--tp > 1 needs --device cuda");
  }
  if (o.tp_invariant != 0) {
    if (o.device != "cuda") return absl::InvalidArgumentError("--tp_invariant needs --device cuda");
    if (!ValidInvariantShards(o.tp_invariant, o.tp)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tp_invariant must be 0, 1, 2 or 4 and a multiple of --tp ", o.tp,
                       ", got ", o.tp_invariant));
    }
  }
  if (o.kv_dtype != KvCacheDType::kBF16 && o.device != "cuda") {
    return absl::InvalidArgumentError(
        "--kv_dtype fp8 needs --device cuda (the CPU backend keeps its KV in fp32)");
  }
  if (o.page_size < 1) return absl::InvalidArgumentError("--page_size must be >= 1");
  if (o.kv_pages < 0 || (o.kv_pages == 0 && o.device == "cpu")) {
    return absl::InvalidArgumentError(
        "--kv_pages must be >= 1 (or 0 with --device cuda: planned from free memory)");
  }
  if (o.max_chunk < 1) return absl::InvalidArgumentError("--max_chunk must be >= 1");
  if (o.max_batch < 1) return absl::InvalidArgumentError("--max_batch must be >= 1");
  if (!(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError("--gpu_memory_fraction must be in (0, 1]");
  }
  return absl::OkStatus();
}

int64_t GpuWeightBytes(const ModelConfig& c) {
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t kv = c.num_kv_heads * c.head_dim;
  const int64_t per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size +
                            3 * c.intermediate_size * c.hidden_size + 2 * c.hidden_size;
  // Embedding and lm_head (held separately even when tied) plus the final norm.
  return 2 * (c.num_layers * per_layer + 2 * c.vocab_size * c.hidden_size + c.hidden_size);
}

absl::StatusOr<int64_t> PlanKvTokens(const ModelConfig& c, int64_t budget_bytes, int64_t page_size,
                                     int64_t max_chunk, int64_t max_batch,
                                     int64_t kv_element_bytes) {
  const int64_t weights = GpuWeightBytes(c);
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t kv = c.num_kv_heads * c.head_dim;
  // One step's activations (fp32 residual and bf16 buffers of every projection, generously),
  // the logits rows, and a fixed margin for cuBLASLt, CUDA graphs, the collectives' buffers
  // (NCCL's; 32 MiB per GPU for the peer all-reduce at TP=2), the attention workspace (a
  // gathered prefill list: up to 32 MiB) and the context's own use.
  const int64_t activations =
      max_chunk * (8 * c.hidden_size + 4 * (q + 2 * kv) + 6 * c.intermediate_size) +
      max_batch * c.vocab_size * 4 + 2 * kGiB;
  // Per KV slot: K and V of every layer (bf16 or FP8), plus the selection scratch a request holds
  // per token it may attend (fp32 scores per query head and the vote; from 320K candidates also
  // the bound-vote selection's five words: kernels/cuda/selection.h, BoundVoteWorkspaceBytes),
  // and a quarter page-table margin for Quest's page bounds.
  const int64_t per_token =
      c.num_layers * 2 * kv * kv_element_bytes + 4 * (c.num_heads + 2) + 4 * 5 + kv / 2;
  const int64_t left = budget_bytes - weights - activations;
  const int64_t tokens = left > 0 ? (left / per_token) / page_size * page_size : 0;
  if (tokens < page_size) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the GPU memory budget of %.2f GiB holds no KV: weights %.2f GiB + activations %.2f GiB "
        "leave %.2f GiB for %d bytes per token",
        static_cast<double>(budget_bytes) / kGiB, static_cast<double>(weights) / kGiB,
        static_cast<double>(activations) / kGiB,
        static_cast<double>(std::max<int64_t>(0, left)) / kGiB, per_token));
  }
  return tokens;
}

namespace {

// A CPU worker over `model` (owned by `owned` when loaded here) with its own pool.
absl::StatusOr<std::unique_ptr<WorkerBackend>> MakeCpuWorker(LoadedModel owned, const Model* model,
                                                             const tokenizer::Tokenizer* tokenizer,
                                                             const WorkerBackendOptions& o) {
  ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool,
                   PagePool::Create(model->KvCacheOptions(o.kv_pages, o.page_size)));
  return std::unique_ptr<WorkerBackend>(
      std::make_unique<CpuWorker>(std::move(owned), model, tokenizer, std::move(pool)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerBackend>> CpuWorkerBackend(
    const Model* model, const tokenizer::Tokenizer* tokenizer, const WorkerBackendOptions& o) {
  RETURN_IF_ERROR(ValidateWorkerBackendOptions(o));
  if (o.device != "cpu") {
    return absl::InvalidArgumentError("a borrowed model runs on --device cpu only");
  }
  return MakeCpuWorker(LoadedModel{}, model, tokenizer, o);
}

absl::StatusOr<std::unique_ptr<WorkerBackend>> LoadWorkerBackend(const std::string& dir,
                                                                 LoadFormat format,
                                                                 const WorkerBackendOptions& o) {
  RETURN_IF_ERROR(ValidateWorkerBackendOptions(o));
  if (o.device == "cuda") {
#ifdef TS_HAVE_CUDA_BACKEND
    return LoadCudaWorker(dir, format, o);
#else
    return absl::UnimplementedError("--device cuda: this build has no CUDA backend");
#endif
  }
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelDirectory(dir, format, o.dummy_seed));
  const Model* model = loaded.model.get();
  const tokenizer::Tokenizer* tok = loaded.tokenizer.get();
  return MakeCpuWorker(std::move(loaded), model, tok, o);
}

}  // namespace tokenselect::engine
