// The GPU backend (backend.h): a model on one GPU, or sharded by heads over several
// (tensor parallelism, engine/parallel/tp_cuda_model.h), whose page pool holds every request's
// KV (a TpSequence per runner: one CudaSequence per rank), with token selection by
// CudaSelectionAttention (engine/selection/cuda_selection.h), one per request and rank (the
// ranks' providers all-reduce their votes, so every rank selects the same tokens). Prefill
// chunks are the selection's chunk_size, which must not exceed the model's max_chunk;
// DecodeBatch runs the model's DecodeBatch (the GEMMs once for all rows). A runner's KvStore
// copies through the host (CudaModel::ReadKv / WriteKv, every rank its KV heads of the whole
// model's rows: the host wire format does not depend on the tensor-parallel size, so K/V moves
// between workers of different sizes) and, on one GPU only, exposes its slots for device links
// (device_cache(); nullopt under tensor parallelism).
//
// Thread-safety: the model is not thread-safe, so every call into it (forward passes, K/V
// copies, sequence creation and release) holds the backend's mutex; one GPU runs on the calling
// thread with the model's GPU made current, several on the model's rank threads.
// Only in CUDA builds (library ts_engine_generation_cuda).
#ifndef TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_
#define TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "engine/generation/backend.h"
#include "engine/generation/model_loader.h"
#include "engine/model/cuda_model.h"
#include "engine/parallel/tp_cuda_model.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

class CudaRunner;  // cuda_backend.cc

class CudaBackend : public GenerationBackend {
 public:
  // One GPU: `model` (created on its device) must outlive the backend and its runners.
  explicit CudaBackend(CudaModel* model);
  // Tensor parallelism over the model's ranks (one rank: the same as above). `model` must
  // outlive the backend and its runners.
  explicit CudaBackend(TpCudaModel* model);
  const ModelConfig& config() const override { return model_->config(); }
  // Also ResourceExhausted when the pool has no room for max_tokens more tokens (the message
  // says how many pages are free); InvalidArgument when selection.chunk_size exceeds the
  // model's max_chunk.
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(int64_t max_tokens,
                                                        const SelectionOptions& selection) override;
  // The whole model's layout (every KV head), whatever the tensor-parallel size.
  KvLayout kv_layout() const override;
  KvCapacity kv_capacity() const override;
  int64_t max_chunk() const override { return shard_options().max_chunk; }
  // Batches of more than the model's max_batch rows run as several steps.
  absl::Status DecodeBatch(absl::Span<SequenceRunner* const> runners,
                           absl::Span<const int32_t> tokens, std::vector<float>* logits) override;
  // One GPU only (device links move one GPU's slots); nullopt under tensor parallelism.
  std::optional<DeviceKvCache> device_cache() const override;
  int device() const { return model_->device(0); }
  int tp_size() const { return model_->size(); }
  TpCudaModel* model() const { return model_; }

 private:
  friend class CudaRunner;
  const CudaModelOptions& shard_options() const { return model_->shard(0)->options(); }
  std::unique_ptr<TpCudaModel> adopted_;  // the one-rank view of CudaBackend(CudaModel*)
  TpCudaModel* model_;
  mutable absl::Mutex mu_;  // every call into model_
};

struct LoadedTpCudaModel {
  std::unique_ptr<TpCudaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

// LoadModelDirectory for the GPU: config.json and the tokenizer from `dir`, weights from its
// safetensors or (kDummy) LoadDummyWeights' values generated slab by slab, so that 8B-scale
// dummy models never hold their fp32 weights in host memory; sharded over options.tp_size GPUs
// (one: the plain model, TpCudaModel::shard(0)). Errors as LoadModelDirectory's and
// TpCudaModel::Create's (InvalidArgument naming the config.json field tp_size does not divide;
// FailedPrecondition for too few GPUs or lazy kernel loading).
absl::StatusOr<LoadedTpCudaModel> LoadTpCudaModelDirectory(const std::string& dir,
                                                           LoadFormat format, uint64_t dummy_seed,
                                                           const TpCudaModelOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_
