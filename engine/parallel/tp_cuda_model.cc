#include "engine/parallel/tp_cuda_model.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {
namespace {

using kernels::cuda::CudaStatus;

// Lazy kernel loading (the default since CUDA 12.2) loads a kernel at its first launch, holding
// the device's context lock until the GPU's queue drains. Inside a tensor-parallel step that
// queue holds an NCCL kernel waiting for the other ranks, whose threads can be blocked behind
// that lock: a deadlock (seen as a hang on the first TP device runs of head_dim-64/128 models;
// the cause is inferred, see docs/parallel.md). Eager loading loads every kernel when the
// context is made.
absl::Status CheckEagerLoading() {
  using GetLoadingMode = CUresult (*)(CUmoduleLoadingMode*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    return absl::OkStatus();  // a driver without lazy loading
  }
  CUmoduleLoadingMode mode = CU_MODULE_EAGER_LOADING;
  if (reinterpret_cast<GetLoadingMode>(fn)(&mode) != CUDA_SUCCESS ||
      mode == CU_MODULE_EAGER_LOADING) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "TpCudaModel: tensor parallelism in one process needs eager kernel loading: set "
      "CUDA_MODULE_LOADING=EAGER in the environment before the process's first CUDA call "
      "(lazy loading can deadlock with the NCCL kernels of the other ranks)");
}

}  // namespace

TpSequence::~TpSequence() {
  if (model_ == nullptr) return;
  // Each shard frees its slot map on its own device.
  model_
      ->RunOnRanksUnchecked([this](int rank, CudaModel*) {
        shards_[rank].reset();
        return absl::OkStatus();
      })
      .IgnoreError();
}

absl::StatusOr<std::unique_ptr<TpCudaModel>> TpCudaModel::Create(
    const ModelConfig& config, const ModelWeights& weights, const TpCudaModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  return Build(config, options,
               [&](const CudaModelOptions& o) { return CudaModel::Create(config, weights, o); });
}

absl::StatusOr<std::unique_ptr<TpCudaModel>> TpCudaModel::CreateDummy(
    const ModelConfig& config, const DummyWeightOptions& dummy, const TpCudaModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  return Build(config, options,
               [&](const CudaModelOptions& o) { return CudaModel::CreateDummy(config, dummy, o); });
}

absl::StatusOr<std::unique_ptr<TpCudaModel>> TpCudaModel::Build(const ModelConfig& config,
                                                                const TpCudaModelOptions& options,
                                                                const Builder& build) {
  // Shapes first: a size that does not divide the heads is refused without touching a GPU.
  RETURN_IF_ERROR(CudaModel::ShardConfig(config, options.tp_size).status());
  const int n = options.tp_size;
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int r = 0; r < n; ++r) devices.push_back(r);
  }
  if (static_cast<int>(devices.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("TpCudaModel: ", devices.size(),
                                                   " devices for a tensor-parallel size of ", n));
  }
  RETURN_IF_ERROR(CudaModel::CheckDevice());
  if (n > 1) RETURN_IF_ERROR(CheckEagerLoading());
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  for (int device : devices) {
    if (device < 0 || device >= count) {
      return absl::FailedPreconditionError(absl::StrCat("TpCudaModel: tensor-parallel size ", n,
                                                        " needs device ", device, "; ", count,
                                                        " CUDA device(s) present"));
    }
  }
  std::unique_ptr<TpCudaModel> model(new TpCudaModel(config));
  model->abort_grace_ms_ = options.abort_grace_ms;
  // One rank runs on the calling thread; more get a driver thread each.
  if (n > 1) {
    model->threads_ = std::make_unique<RankThreads>(devices);
    ASSIGN_OR_RETURN(model->groups_,
                     NcclTensorParallel::CreateGroup(devices, options.model.invariant_shards > 0));
  }
  model->devices_ = devices;
  model->shards_.resize(static_cast<size_t>(n));
  model->ranks_.assign(static_cast<size_t>(n), nullptr);
  model->logits_.resize(static_cast<size_t>(n));
  TpCudaModel* m = model.get();
  RETURN_IF_ERROR(m->RunOnRanksUnchecked([&](int rank, CudaModel*) -> absl::Status {
    CudaModelOptions o = options.model;
    o.device = devices[rank];
    o.tp = n > 1 ? m->groups_[rank].get() : nullptr;
    ASSIGN_OR_RETURN(m->shards_[rank], build(o));
    m->ranks_[rank] = m->shards_[rank].get();
    return absl::OkStatus();
  }));
  if (n > 1) RETURN_IF_ERROR(m->WarmUp());
  return model;
}

void TpCudaModel::RequestEagerLoading(int tp_size) {
  if (tp_size > 1) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
}

std::unique_ptr<TpCudaModel> TpCudaModel::Adopt(CudaModel* model) {
  std::unique_ptr<TpCudaModel> tp(new TpCudaModel(model->config()));
  int device = model->options().device;
  if (device < 0) cudaGetDevice(&device);
  tp->devices_ = {device};
  tp->ranks_ = {model};
  tp->logits_.resize(1);
  return tp;
}

absl::Status TpCudaModel::RunOnRanksUnchecked(
    const std::function<absl::Status(int rank, CudaModel* shard)>& fn) {
  if (threads_ == nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(devices_[0]), "cudaSetDevice"));
    return fn(0, ranks_[0]);
  }
  return threads_->Run([&](int rank) { return fn(rank, ranks_[rank]); });
}

// One all-reduce of each power-of-4 size from 1 KiB to 64 MiB on every rank, outside any graph
// capture: NCCL sets up its connections lazily, per algorithm and protocol, on first use, and
// that setup should not happen inside a captured decode segment.
absl::Status TpCudaModel::WarmUp() {
  return RunOnRanks([this](int rank, CudaModel* shard) -> absl::Status {
    constexpr int64_t kMaxFloats = int64_t{16} << 20;  // 64 MiB
    void* buffer = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&buffer, kMaxFloats * 4), "cudaMalloc"));
    absl::Status status =
        CudaStatus(cudaMemsetAsync(buffer, 0, kMaxFloats * 4, shard->stream()), "memset");
    // A fixed-tree group of more than 2 ranks takes messages up to its peer group's size only.
    const NcclTensorParallel& group = *groups_[rank];
    const int64_t max_floats = group.size() > 2 && group.SumsInFixedTree()
                                   ? NcclTensorParallel::kFixedTreeMaxBytes / 4
                                   : kMaxFloats;
    for (int64_t count = 256; count <= max_floats && status.ok(); count *= 4) {
      status = groups_[rank]->AllReduceSum(static_cast<float*>(buffer), count, shard->stream());
    }
    if (status.ok()) {
      status = groups_[rank]->AllReduceSum(static_cast<double*>(buffer), 3, shard->stream());
    }
    const absl::Status synced =
        CudaStatus(cudaStreamSynchronize(shard->stream()), "warm-up all-reduce");
    cudaFree(buffer);
    RETURN_IF_ERROR(status);
    return synced;
  });
}

TpCudaModel::~TpCudaModel() {
  if (shards_.empty() && groups_.empty()) return;  // adopted, or nothing was made
  // Shards and communicators are released on their ranks' devices.
  RunOnRanksUnchecked([this](int rank, CudaModel*) {
    if (rank < static_cast<int>(shards_.size())) shards_[rank].reset();
    if (rank < static_cast<int>(groups_.size())) groups_[rank].reset();
    return absl::OkStatus();
  }).IgnoreError();
}

absl::Status TpCudaModel::RunOnRanks(
    const std::function<absl::Status(int rank, CudaModel* shard)>& fn) {
  if (groups_.empty()) return RunOnRanksUnchecked(fn);
  {
    absl::MutexLock lock(&abort_mu_);
    if (!aborted_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TpCudaModel: the tensor-parallel group was aborted after an error and is not usable "
          "(recreate the model): ",
          aborted_.message()));
    }
  }
  // A rank that fails in the middle of a step leaves the others waiting in their next
  // collective for it. Its thread then waits up to abort_grace_ for the others to finish (they
  // do when the failure was the same on every rank, e.g. bad arguments), and otherwise aborts
  // every communicator so that their waits end; the group is then unusable.
  struct Outcome {
    absl::Mutex mu;
    int n_ranks = 0;
    int finished ABSL_GUARDED_BY(mu) = 0;
    int first_failed ABSL_GUARDED_BY(mu) = -1;
    absl::Status first ABSL_GUARDED_BY(mu);
  } outcome;
  outcome.n_ranks = size();
  const absl::Status ran = threads_->Run([&](int rank) {
    absl::Status status = fn(rank, ranks_[rank]);
    bool watch = false;
    {
      absl::MutexLock lock(&outcome.mu);
      ++outcome.finished;
      if (!status.ok()) {
        // Said at once: if the others are left waiting for this rank, this line is the cause.
        std::fprintf(stderr, "[tp] rank %d failed: %s\n", rank, status.ToString().c_str());
      }
      if (!status.ok() && outcome.first_failed < 0) {
        outcome.first_failed = rank;
        outcome.first = status;
        watch = true;
      }
    }
    if (!watch) return status;
    absl::MutexLock lock(&outcome.mu);
    const bool all = outcome.mu.AwaitWithTimeout(
        absl::Condition(
            +[](Outcome* o) ABSL_NO_THREAD_SAFETY_ANALYSIS { return o->finished == o->n_ranks; },
            &outcome),
        absl::Milliseconds(abort_grace_ms_));
    if (!all) {
      std::fprintf(stderr, "[tp] the other ranks still wait after %lld ms: aborting the group\n",
                   static_cast<long long>(abort_grace_ms_));
      {
        absl::MutexLock abort_lock(&abort_mu_);
        aborted_ = common::Annotate(status, absl::StrCat("rank ", rank, ": "));
      }
      // One thread per communicator: NCCL reclaims the communicators of one ncclCommInitAll
      // together, so one rank's abort may wait for the others' (aborting them one after
      // another from this thread could wait forever on the first).
      std::vector<std::thread> aborts;
      for (auto& group : groups_) {
        aborts.emplace_back([g = group.get()] { g->Abort(); });
      }
      for (std::thread& t : aborts) t.join();
      std::fprintf(stderr, "[tp] group aborted\n");
    }
    return status;
  });
  absl::MutexLock lock(&outcome.mu);
  if (outcome.first_failed >= 0) {
    return common::Annotate(outcome.first, absl::StrCat("rank ", outcome.first_failed, ": "));
  }
  return ran;
}

absl::StatusOr<std::unique_ptr<TpSequence>> TpCudaModel::NewSequence(int64_t max_tokens) {
  std::unique_ptr<TpSequence> seq(new TpSequence());
  seq->shards_.resize(static_cast<size_t>(size()));
  seq->model_ = this;  // from here on the destructor returns whatever pages were taken
  RETURN_IF_ERROR(RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
    ASSIGN_OR_RETURN(seq->shards_[rank], shard->NewSequence(max_tokens));
    return absl::OkStatus();
  }));
  // Every rank's pool went through the same allocations, so the slot maps agree; a pool that
  // does not would put the ranks' KV heads of one token in different slots.
  for (int r = 1; r < size(); ++r) {
    if (ranks_[r]->free_pages() != ranks_[0]->free_pages()) {
      return absl::InternalError(absl::StrCat("TpCudaModel: rank ", r, " has ",
                                              ranks_[r]->free_pages(), " free pages, rank 0 ",
                                              ranks_[0]->free_pages()));
    }
  }
  return seq;
}

std::vector<float>* TpCudaModel::RankLogits(int rank, std::vector<float>* caller) {
  if (caller == nullptr) return nullptr;
  return rank == 0 ? caller : &logits_[rank];
}

absl::Status TpCudaModel::CheckForward(const char* caller, const TpSequence* seq,
                                       absl::Span<CudaAttentionProvider* const> attention) const {
  if (seq == nullptr || seq->model_ != this) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TpCudaModel::", caller, ": the sequence belongs to no or another model"));
  }
  if (!attention.empty() && static_cast<int>(attention.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat("TpCudaModel::", caller, ": ",
                                                   attention.size(), " providers for ", size(),
                                                   " ranks"));
  }
  return absl::OkStatus();
}

absl::Status TpCudaModel::Forward(TpSequence* seq, absl::Span<const int32_t> tokens,
                                  absl::Span<CudaAttentionProvider* const> attention,
                                  std::vector<float>* logits) {
  RETURN_IF_ERROR(CheckForward("Forward", seq, attention));
  return RunOnRanks([&](int rank, CudaModel* shard) {
    return shard->Forward(seq->shards_[rank].get(), tokens,
                          attention.empty() ? nullptr : attention[rank], RankLogits(rank, logits));
  });
}

absl::StatusOr<int32_t> TpCudaModel::ForwardGreedy(
    TpSequence* seq, absl::Span<const int32_t> tokens,
    absl::Span<CudaAttentionProvider* const> attention) {
  RETURN_IF_ERROR(CheckForward("ForwardGreedy", seq, attention));
  int32_t picked = -1;
  RETURN_IF_ERROR(RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
    ASSIGN_OR_RETURN(const int32_t id,
                     shard->ForwardGreedy(seq->shards_[rank].get(), tokens,
                                          attention.empty() ? nullptr : attention[rank]));
    if (rank == 0) picked = id;
    return absl::OkStatus();
  }));
  return picked;
}

absl::Status TpCudaModel::CopyLastLogits(std::vector<float>* logits) {
  return RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
    return rank == 0 ? shard->CopyLastLogits(logits) : absl::OkStatus();
  });
}

absl::Status TpCudaModel::DecodeBatch(
    absl::Span<TpSequence* const> seqs, absl::Span<const int32_t> tokens,
    const std::vector<std::vector<CudaAttentionProvider*>>& attention, std::vector<float>* logits) {
  if (!attention.empty() && static_cast<int>(attention.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat("TpCudaModel::DecodeBatch: providers for ",
                                                   attention.size(), " ranks, not ", size()));
  }
  for (const TpSequence* seq : seqs) {
    if (seq == nullptr || seq->model_ != this) {
      return absl::InvalidArgumentError(
          "TpCudaModel::DecodeBatch: a sequence belongs to no or another model");
    }
  }
  return RunOnRanks([&](int rank, CudaModel* shard) {
    std::vector<CudaSequence*> rank_seqs;
    for (const TpSequence* seq : seqs) rank_seqs.push_back(seq->shards_[rank].get());
    const std::vector<CudaAttentionProvider*> dense(seqs.size(), nullptr);
    return shard->DecodeBatch(rank_seqs, tokens, attention.empty() ? dense : attention[rank],
                              RankLogits(rank, logits));
  });
}

absl::StatusOr<std::vector<int32_t>> TpCudaModel::GreedyTokens() {
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
    if (rank != 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(ids, shard->GreedyTokens());
    return absl::OkStatus();
  }));
  return ids;
}

absl::StatusOr<int32_t> TpCudaModel::GreedyToken() {
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, GreedyTokens());
  return ids[0];
}

int64_t TpCudaModel::weight_bytes() const {
  int64_t total = 0;
  for (const CudaModel* s : ranks_) total += s->weight_bytes();
  return total;
}

int64_t TpCudaModel::kv_bytes() const {
  int64_t total = 0;
  for (const CudaModel* s : ranks_) total += s->kv_bytes();
  return total;
}

}  // namespace tokenselect::engine
