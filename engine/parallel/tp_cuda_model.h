// Tensor parallelism of the GPU model (docs/DESIGN.md section 6, docs/parallel.md): a
// Llama-family model sharded by heads over N GPUs of this process, N = 1, 2, 4, ... dividing the
// query heads, the KV heads and intermediate_size.
//
// One CudaModel per GPU (engine/model/cuda_model.h with CudaModelOptions::tp): rank r holds
// query heads [r H/N, (r+1) H/N), KV heads [r H_kv/N, (r+1) H_kv/N) (its rows of the fused qkv
// weight and bias), gate/up rows [r I/N, (r+1) I/N), and the matching input columns of o_proj
// and down_proj; embeddings, norms and lm_head are whole on every rank. After o_proj and after
// down_proj the ranks' partial products are all-reduced (fp32, NCCL) into the residual stream,
// so every rank keeps the same residual stream and computes the same logits. The KV cache is
// sharded by KV head: every rank has the same page pool and, for a TpSequence, the same slot
// map, and stores its KV heads only. Attention providers are per rank (one per rank and
// request), created with the rank's shard config; the GPU selection provider all-reduces its
// head sums so that all ranks select the same tokens (engine/selection/cuda_selection.h).
//
// One driver thread per rank (rank_threads.h) runs every operation on all ranks at once; the
// public methods are called from one thread at a time. With N = 1 there is no communicator and
// no thread: the single CudaModel runs exactly the one-GPU code path on the caller's thread.
//
// Environment: with more than one rank the process must run with CUDA_MODULE_LOADING=EAGER
// (Create refuses lazy kernel loading: docs/parallel.md, "Hangs").
//
// Failure: checks that depend only on the arguments run identically on every rank before any
// GPU work, so they fail everywhere alike and the model stays usable. A failure on one rank in
// the middle of a step leaves the others waiting in a collective: after
// TpCudaModelOptions::abort_grace_ms the communicators are aborted, the call returns the failed
// rank's error, and the model refuses every later call (FailedPrecondition).
#ifndef TOKENSELECT_ENGINE_PARALLEL_TP_CUDA_MODEL_H_
#define TOKENSELECT_ENGINE_PARALLEL_TP_CUDA_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/parallel/nccl_tensor_parallel.h"
#include "engine/parallel/rank_threads.h"

namespace tokenselect::engine {

struct TpCudaModelOptions {
  int tp_size = 1;
  std::vector<int> devices;  // CUDA device of each rank; empty: 0, 1, ..., tp_size - 1
  CudaModelOptions model;    // every shard's (device and tp are set per rank)
  // When one rank fails in the middle of a call while others have not finished after this
  // long, the communicators are aborted (the others are waiting for the failed rank in a
  // collective) and the model refuses every later call (FailedPrecondition).
  int64_t abort_grace_ms = 10000;
};

class TpCudaModel;

// One request's KV on every rank: a CudaSequence per shard, all with the same slot map.
// Returns the pages when destroyed (on the ranks' threads); must not outlive its model.
class TpSequence {
 public:
  ~TpSequence();
  TpSequence(const TpSequence&) = delete;
  TpSequence& operator=(const TpSequence&) = delete;
  int64_t length() const { return shards_[0]->length(); }
  int64_t capacity() const { return shards_[0]->capacity(); }
  CudaSequence* shard(int rank) const { return shards_[rank].get(); }

 private:
  friend class TpCudaModel;
  TpSequence() = default;
  TpCudaModel* model_ = nullptr;
  std::vector<std::unique_ptr<CudaSequence>> shards_;
};

class TpCudaModel {
 public:
  // Checks the shapes first (InvalidArgument naming the config field tp_size does not divide, or
  // for a device list of the wrong length), then the GPUs (FailedPrecondition when fewer than
  // needed are present, or, for tp_size > 1, when CUDA loads kernels lazily), then creates the
  // communicators, uploads every rank's shard in parallel and warms the communicators up (so that
  // no connection is set up inside a graph capture). Otherwise CudaModel::Create's errors, prefixed
  // with the rank.
  static absl::StatusOr<std::unique_ptr<TpCudaModel>> Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const TpCudaModelOptions& options);
  // The same with LoadDummyWeights' values (CudaModel::CreateDummy), each rank generating only
  // its slices.
  static absl::StatusOr<std::unique_ptr<TpCudaModel>> CreateDummy(
      const ModelConfig& config, const DummyWeightOptions& dummy,
      const TpCudaModelOptions& options);
  ~TpCudaModel();
  TpCudaModel(const TpCudaModel&) = delete;
  TpCudaModel& operator=(const TpCudaModel&) = delete;

  // For a process about to shard a model over tp_size > 1 GPUs: asks for eager kernel loading,
  // which Create requires, unless the environment already says how to load. Effective only
  // before the process's first CUDA call (docs/parallel.md).
  static void RequestEagerLoading(int tp_size);

  // A one-rank view of a CudaModel the caller owns (it must outlive the view): the one-GPU
  // path, for code written against TpCudaModel (CudaBackend). Runs on the calling thread.
  static std::unique_ptr<TpCudaModel> Adopt(CudaModel* model);

  int size() const { return static_cast<int>(ranks_.size()); }
  const ModelConfig& config() const { return config_; }                    // the whole model's
  const ModelConfig& shard_config() const { return ranks_[0]->config(); }  // one rank's
  CudaModel* shard(int rank) const { return ranks_[rank]; }
  int device(int rank) const { return devices_[rank]; }

  // Runs fn(rank, shard) on every rank's thread at once (with the rank's device current) and
  // returns the first rank's error to fail (see "Failure" above: a rank failing alone aborts
  // the group). For what must happen on a rank's device: creating
  // and destroying its attention providers, reading their state.
  absl::Status RunOnRanks(const std::function<absl::Status(int rank, CudaModel* shard)>& fn);

  // CudaModel::NewSequence on every rank. Its errors; Internal if the ranks' pools disagree.
  absl::StatusOr<std::unique_ptr<TpSequence>> NewSequence(int64_t max_tokens);

  // CudaModel::Forward on every rank. `attention` holds one provider per rank (attention[r] for
  // rank r; all null or an empty span: dense). `logits` gets rank 0's (every rank computes the
  // same; rank_logits has the others').
  absl::Status Forward(TpSequence* seq, absl::Span<const int32_t> tokens,
                       absl::Span<CudaAttentionProvider* const> attention,
                       std::vector<float>* logits);

  // CudaModel::ForwardGreedy on every rank; rank 0's pick (each rank picks from its own logits,
  // which are the same). Only ids cross to the host: rank_logits is not updated.
  absl::StatusOr<int32_t> ForwardGreedy(TpSequence* seq, absl::Span<const int32_t> tokens,
                                        absl::Span<CudaAttentionProvider* const> attention);
  // Rank 0's CudaModel::CopyLastLogits.
  absl::Status CopyLastLogits(std::vector<float>* logits);

  // CudaModel::DecodeBatch on every rank: attention[r][b] is rank r's provider of row b (an
  // empty vector: dense for every row).
  absl::Status DecodeBatch(absl::Span<TpSequence* const> seqs, absl::Span<const int32_t> tokens,
                           const std::vector<std::vector<CudaAttentionProvider*>>& attention,
                           std::vector<float>* logits);

  // Rank 0's greedy tokens of the last step (CudaModel::GreedyTokens).
  absl::StatusOr<int32_t> GreedyToken();
  absl::StatusOr<std::vector<int32_t>> GreedyTokens();

  // For rank >= 1: the logits it computed in the last step that asked for logits (rank 0's went
  // to the caller). Tests compare them with rank 0's: they must agree bit for bit.
  const std::vector<float>& rank_logits(int rank) const { return logits_[rank]; }

  // Device memory over all ranks.
  int64_t weight_bytes() const;
  int64_t kv_bytes() const;

 private:
  friend class TpSequence;
  using Builder =
      std::function<absl::StatusOr<std::unique_ptr<CudaModel>>(const CudaModelOptions& options)>;
  explicit TpCudaModel(const ModelConfig& config) : config_(config) {}
  static absl::StatusOr<std::unique_ptr<TpCudaModel>> Build(const ModelConfig& config,
                                                            const TpCudaModelOptions& options,
                                                            const Builder& build);
  absl::Status WarmUp();
  // RunOnRanks without the failure handling: on the calling thread for one rank.
  absl::Status RunOnRanksUnchecked(
      const std::function<absl::Status(int rank, CudaModel* shard)>& fn);
  std::vector<float>* RankLogits(int rank, std::vector<float>* caller);
  // Forward's and ForwardGreedy's argument checks (errors name `caller`).
  absl::Status CheckForward(const char* caller, const TpSequence* seq,
                            absl::Span<CudaAttentionProvider* const> attention) const;

  const ModelConfig config_;
  int64_t abort_grace_ms_ = 10000;
  absl::Mutex abort_mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(abort_mu_);  // why the group was aborted
  // Declared first so that it is destroyed last: the members below are released on its threads
  // (none with one rank: it runs on the caller's thread).
  std::unique_ptr<RankThreads> threads_;
  std::vector<int> devices_;
  std::vector<std::unique_ptr<NcclTensorParallel>> groups_;  // empty when size() == 1
  std::vector<std::unique_ptr<CudaModel>> shards_;           // owned; empty when adopted
  std::vector<CudaModel*> ranks_;                            // every rank's shard
  std::vector<std::vector<float>> logits_;                   // [rank]: ranks >= 1's logits
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_TP_CUDA_MODEL_H_
