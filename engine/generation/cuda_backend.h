// The GPU backend of Generator (backend.h): one CudaModel (engine/model/cuda_model.h) running
// one request at a time, with token selection by CudaSelectionAttention
// (engine/selection/cuda_selection.h). Prefill chunks are the selection's chunk_size, which must
// not exceed the model's max_chunk. Only in CUDA builds (library ts_engine_generation_cuda).
#ifndef TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_
#define TOKENSELECT_ENGINE_GENERATION_CUDA_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <string>

#include "engine/generation/backend.h"
#include "engine/generation/model_loader.h"
#include "engine/model/cuda_model.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

class CudaBackend : public GenerationBackend {
 public:
  // `model` must outlive the backend and its runners.
  explicit CudaBackend(CudaModel* model) : model_(model) {}
  const ModelConfig& config() const override { return model_->config(); }
  // Also ResourceExhausted while another request runs (the model holds one sequence), and when
  // max_tokens exceeds the model's max_tokens; InvalidArgument when selection.chunk_size exceeds
  // the model's max_chunk.
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) override;

 private:
  CudaModel* model_;
  std::atomic<bool> busy_{false};
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
