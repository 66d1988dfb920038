// The GPU backend (backend.h): one CudaModel (engine/model/cuda_model.h) whose page pool holds
// every request's KV (a CudaSequence per runner), with token selection by CudaSelectionAttention
// (engine/selection/cuda_selection.h), one per request. Prefill chunks are the selection's
// chunk_size, which must not exceed the model's max_chunk; DecodeBatch runs CudaModel::DecodeBatch
// (the GEMMs once for all rows). A runner's KvStore copies through the host (CudaModel::ReadKv /
// WriteKv) and exposes its slots for device links (device_cache()).
//
// Thread-safety: CudaModel is not thread-safe, so every call into it (forward passes, K/V copies,
// sequence creation and release) holds the backend's mutex, and first makes the backend's GPU
// (the current device when the backend was constructed) the calling thread's current device.
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
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

class CudaRunner;  // cuda_backend.cc

class CudaBackend : public GenerationBackend {
 public:
  // `model` (created on the current device) must outlive the backend and its runners.
  explicit CudaBackend(CudaModel* model);
  const ModelConfig& config() const override { return model_->config(); }
  // Also ResourceExhausted when the pool has no room for max_tokens more tokens (the message
  // says how many pages are free); InvalidArgument when selection.chunk_size exceeds the
  // model's max_chunk.
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) override;
  KvLayout kv_layout() const override;
  KvCapacity kv_capacity() const override;
  int64_t max_chunk() const override { return model_->options().max_chunk; }
  // Batches of more than the model's max_batch rows run as several steps.
  absl::Status DecodeBatch(absl::Span<SequenceRunner* const> runners,
                           absl::Span<const int32_t> tokens, std::vector<float>* logits) override;
  std::optional<DeviceKvCache> device_cache() const override;
  int device() const { return device_; }

 private:
  friend class CudaRunner;
  // The mutex, held with the backend's GPU current on the calling thread.
  class [[nodiscard]] Locked {
   public:
    Locked(absl::Mutex* mu, int device) : lock_(mu) { cudaSetDevice(device); }

   private:
    absl::MutexLock lock_;
  };
  Locked Lock() const { return Locked(&mu_, device_); }
  int64_t num_slots_limit() const { return model_->options().max_tokens; }
  CudaModel* model_;
  int device_ = 0;
  mutable absl::Mutex mu_;  // every call into model_
};

struct LoadedCudaModel {
  std::unique_ptr<CudaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

// LoadModelDirectory for the GPU: config.json and the tokenizer from `dir`, weights from its
// safetensors or (kDummy) LoadDummyWeights' values generated slab by slab, so that 8B-scale
// dummy models never hold their fp32 weights in host memory. Errors as LoadModelDirectory's and
// CudaModel::Create's.
absl::StatusOr<LoadedCudaModel> LoadCudaModelDirectory(const std::string& dir, LoadFormat format,
                                                       uint64_t dummy_seed,
                                                       const CudaModelOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_
