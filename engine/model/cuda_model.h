// The Llama-family forward pass on one GPU: the CUDA counterpart of Model (model.h), step for
// step, with bf16 weights and KV cache, an fp32 residual stream and fp32 accumulation:
//   x = embed(tokens)                                          (fp32, [m, hidden])
//   per layer:  h = RmsNorm(x)                                 (bf16)
//               qkv = h [Wq; Wk; Wv]^T + [bq; bk; bv]          (one fused GEMM, bf16)
//               write k, v (UN-rotated) into the tokens' slots (KvAppend, paged)
//               list = provider.Select(...)                    (cuda_attention.h, on the device)
//               a = attention(q over the list, RoPE at gather)  (decode kernel for m = 1,
//                                                                chunked-prefill kernel otherwise)
//               x += a Wo^T + bo                               (GEMM epilogue, fp32)
//               h = RmsNorm(x) ; gu = h [Wg; Wu]^T + [bg; bu]  (one fused GEMM)
//               x += (silu(g) * u) Wd^T + bd                   (GEMM epilogue, fp32)
//   logits = RmsNorm(x[last]) lm_head^T                        (fp32)
// A Forward call of m tokens runs them as one step (a prefill chunk: m rows per GEMM) when m <=
// max_chunk, and as consecutive steps of max_chunk otherwise. Decode steps (m = 1) replay CUDA
// graphs of the shape-static parts (everything between one layer's attention and the next's:
// o_proj, MLP, norms, qkv GEMM, KV append), so only selection and attention are launched one by
// one. Attention goes through the tuned kernels for head_dim 64/128 and group 1/2/4/8, and
// through the simple kernels otherwise (the tiny test presets).
//
// The KV cache holds one sequence of up to max_tokens tokens in pages of page_size slots,
// handed out in a scrambled order (slots are not positions, as in a pool shared by requests).
// Not thread-safe: one sequence at a time; everything runs on one stream owned by the model.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

struct CudaModelOptions {
  int64_t max_tokens = 4096;  // KV capacity of the one sequence
  int64_t page_size = 16;
  int64_t max_chunk = 512;    // most tokens per step (prefill chunk)
  bool use_graphs = true;     // CUDA graphs for decode steps
};

class CudaModel {
 public:
  // Uploads `weights` (rounded to bf16; fused q|k|v and gate|up) and allocates the KV cache.
  // InvalidArgument for a config/weights mismatch or bad options; ResourceExhausted when device
  // memory runs out; Internal for other CUDA or cuBLASLt errors.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const CudaModelOptions& options = {});
  // The same with LoadDummyWeights' values (rounded to bf16), generated slab by slab on the host
  // so that 8B-scale shapes never need their fp32 weights in host memory.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateDummy(
      const ModelConfig& config, const DummyWeightOptions& dummy,
      const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Appends `tokens` to the sequence, attending through `attention` (nullptr: dense), and, when
  // `logits` is not null, writes the last token's logits ([vocab], fp32; waits for the GPU).
  // InvalidArgument for no tokens or an id outside the vocabulary; ResourceExhausted when the
  // sequence would pass max_tokens (nothing is appended then); the provider's errors as they are.
  absl::Status Forward(absl::Span<const int32_t> tokens, CudaAttentionProvider* attention,
                       std::vector<float>* logits);
  // Dense attention, logits of the last token.
  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) {
    return Forward(tokens, nullptr, logits);
  }

  // The greedy token of the last logits, chosen on the GPU (lowest id on ties).
  absl::StatusOr<int32_t> GreedyToken();

  // Forgets the sequence (the KV cache is reused).
  void Reset() { length_ = 0; }
  int64_t length() const { return length_; }
  const ModelConfig& config() const { return config_; }
  const CudaModelOptions& options() const { return options_; }
  cudaStream_t stream() const;
  // Bytes of device memory held for weights and for the KV cache.
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_bytes() const { return kv_bytes_; }

 private:
  struct Device;
  class TensorSource;
  CudaModel(const ModelConfig& config, const CudaModelOptions& options);
  static absl::StatusOr<std::unique_ptr<CudaModel>> Build(const ModelConfig& config,
                                                          const TensorSource& source,
                                                          const CudaModelOptions& options);
  absl::Status Step(absl::Span<const int32_t> tokens, CudaAttentionProvider* attention,
                    bool logits);
  absl::Status EnqueueSegment(int64_t segment, int64_t m, bool logits);
  absl::Status RunSegment(int64_t segment, int64_t m, bool logits);
  absl::Status Attention(int64_t layer, int64_t m, CudaAttentionProvider* attention);

  const ModelConfig config_;
  const CudaModelOptions options_;
  std::unique_ptr<Device> dev_;
  int64_t length_ = 0;
  int64_t weight_bytes_ = 0;
  int64_t kv_bytes_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
