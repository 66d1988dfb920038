// The Llama-family forward pass on one GPU, for one request: the CUDA counterpart of Model
// (model.h), step for step, with bf16 weights and KV cache, an fp32 residual stream and fp32
// accumulation everywhere:
//   x = embed(token)                                           (fp32)
//   per layer:  h = RmsNorm(x)                                  (bf16)
//               qkv = h [Wq; Wk; Wv]^T + [bq; bk; bv]           (one fused GEMM, bf16)
//               write k, v (UN-rotated) into the token's slot   (KvAppend, paged)
//               a = attention(q over the dense list, RoPE at gather time)
//               x += a Wo^T + bo                                (GEMM epilogue, fp32)
//               h = RmsNorm(x) ; gu = h [Wg; Wu]^T + [bg; bu]   (one fused GEMM)
//               x += (silu(g) * u) Wd^T + bd                    (GEMM epilogue, fp32)
//   logits = RmsNorm(x) lm_head^T                               (fp32)
// Attention goes through kernels/cuda/decode_attention.h (head_dim 64/128, group 1/2/4/8) and
// otherwise through SimpleDecodeAttention. The KV cache is a GPU page pool (pages of page_size
// slots, handed out in a scrambled order so that slots are not positions). Prompts run token by
// token (decode steps); a chunked prefill is future work.
//
// Not thread-safe: one CudaModel per request stream. Needs a CUDA device; everything runs on one
// stream owned by the model.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

struct CudaModelOptions {
  int64_t max_tokens = 4096;  // KV capacity of the one sequence
  int64_t page_size = 16;
};

class CudaModel {
 public:
  // Uploads `weights` (rounded to bf16; fused q|k|v and gate|up) and allocates the KV pool.
  // InvalidArgument for a config/weights mismatch or bad options; ResourceExhausted when device
  // memory runs out; Internal for other CUDA or cuBLASLt errors.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Appends `tokens` to the sequence, one decode step each, and writes the logits of the last
  // one to `logits` ([vocab], fp32). InvalidArgument for no tokens or an id outside the vocab;
  // ResourceExhausted when the sequence would pass max_tokens (nothing is appended then).
  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits);

  // The greedy token of the last Forward's logits, chosen on the GPU (lowest id on ties).
  absl::StatusOr<int32_t> GreedyToken();

  // Forgets the sequence (the KV pool is reused).
  void Reset() { length_ = 0; }
  int64_t length() const { return length_; }
  const ModelConfig& config() const { return config_; }

 private:
  struct Device;
  CudaModel(const ModelConfig& config, const CudaModelOptions& options);
  absl::Status Step(int32_t token);

  const ModelConfig config_;
  const CudaModelOptions options_;
  std::unique_ptr<Device> dev_;
  std::vector<int32_t> page_order_;  // sequence page i -> pool page
  int64_t length_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
