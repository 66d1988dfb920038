// The Llama-family forward pass (Llama, Qwen2, Mistral) on the CPU through kernels/ops.h.
//
// One Forward call runs a batch of new tokens of one request (a prefill chunk, or one decode
// token) against the request's KV cache:
//   x = embed(tokens)
//   per layer:  h = RmsNorm(x) ; q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv
//               write k (UN-rotated) and v into the new tokens' cache slots
//               list = provider.Select(...)            (which cached tokens to attend to)
//               a = GatherAttention(q over list)       (RoPE applied at gather time)
//               x += a Wo^T + bo
//               h = RmsNorm(x) ; x += (silu(h Wg^T) * (h Wu^T)) Wd^T
//   logits = RmsNorm(x) lm_head^T                      (last row, all rows, or none)
// Shapes: x, h [n, hidden]; q [n, num_heads, head_dim]; k, v [n, num_kv_heads, head_dim].
//
// Thread-safety: a Model is immutable after Create; Forward may run concurrently on different
// requests, each with its own workspace, token table and provider.
#ifndef TOKENSELECT_ENGINE_MODEL_MODEL_H_
#define TOKENSELECT_ENGINE_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/attention_list.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

// Which rows of logits a Forward call produces.
enum class LogitsRows {
  kLast,  // the last new token's: [1, vocab] (decode, end of prefill)
  kAll,   // every new token's: [num_tokens, vocab] (scoring, tests)
  kNone,  // none (prefill chunks before the last)
};

struct ForwardRequest {
  absl::Span<const int32_t> tokens;  // the new tokens, at positions table->length() + i
  TokenTable* table = nullptr;       // the request's KV pages; Forward appends the new tokens
  // Chooses the attended tokens per layer; nullptr means DenseAttentionList.
  AttentionListProvider* attention = nullptr;
  LogitsRows logits = LogitsRows::kLast;
};

// Scratch buffers of the forward pass, sized on first use for the largest batch seen and then
// reused: no allocation per layer, none per step once warm. One per thread of execution.
class ForwardWorkspace {
 public:
  ForwardWorkspace() = default;
  ForwardWorkspace(const ForwardWorkspace&) = delete;
  ForwardWorkspace& operator=(const ForwardWorkspace&) = delete;

  // The list the last layer of the last step attended to (for tests and debugging).
  const AttentionList& last_attention_list() const { return list_; }

 private:
  friend class Model;
  std::vector<float> x_, h_, q_, k_, v_, attn_, tmp_, gate_, up_;  // see model.h shapes
  std::vector<int32_t> positions_, slots_;
  AttentionList list_;
  DenseAttentionList dense_;
};

// Numerics of the CPU forward pass.
struct ModelOptions {
  // Round to bf16 exactly where the GPU backend (cuda_model.h) stores bf16: the weights (all but
  // the o_proj and down_proj biases, which the GPU keeps in fp32), the normed activations h, q/k/v
  // (hence the KV cache), the attention output, gate/up and the SwiGLU output. Everything else
  // (residual stream, accumulation, softmax) stays fp32. This makes the CPU the oracle of the
  // GPU's arithmetic (GPU tests); off, the CPU runs plain fp32 (the default, and the HF parity).
  bool emulate_bf16 = false;
  // kFP8E4M3 simulates the GPU's FP8 KV cache (docs/fp8_kv.md): every K and V value is stored
  // as float(e4m3(x / s)) * s with the per-(layer, KV head) scales of kv_scales.h, computed from
  // the bf16-rounded weights as the GPU computes them; the pool stays fp32 (no memory saving),
  // and the host KV wire format is unchanged. kBF16: values stored as computed.
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
};

class Model {
 public:
  // Takes ownership of `weights`, which must match `config` (InvalidArgument naming the tensor
  // otherwise, see CheckWeightShapes; with an FP8 KV cache also for non-finite k/v weights).
  static absl::StatusOr<std::unique_ptr<Model>> Create(ModelConfig config, ModelWeights weights,
                                                       const ModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [head_dim / 2]
  const ModelOptions& options() const { return options_; }
  // FP8 KV cache only: [num_layers, 2, num_kv_heads] (kv_scales.h); empty for kBF16.
  const std::vector<float>& kv_scales() const { return kv_scales_; }

  // Options for a PagePool that fits this model's KV cache.
  PagePoolOptions KvCacheOptions(int64_t num_pages, int64_t page_size) const;

  // Runs request.tokens through the model, appending them to request.table (their K/V are
  // written into its new slots), and writes the requested logits rows to `logits`
  // ([rows, vocab], resized; cleared for kNone). Errors leave the table's length as it was:
  //   InvalidArgument  no tokens, a token id outside the vocabulary, a null table, or a pool
  //                    whose geometry (layers, KV heads, head_dim) does not fit the model
  //   ResourceExhausted  the pool has no pages for the new tokens
  //   Internal         the provider returned a malformed list; or the provider's own error
  absl::Status Forward(const ForwardRequest& request, ForwardWorkspace* workspace,
                       std::vector<float>* logits) const;

 private:
  Model(ModelConfig config, ModelWeights weights, const ModelOptions& options,
        std::vector<float> kv_scales);
  absl::Status CheckRequest(const ForwardRequest& request) const;
  absl::Status CheckList(const AttentionList& list, int64_t num_new, int64_t num_slots) const;
  absl::Status RunLayers(const ForwardRequest& request, int64_t cache_length,
                         ForwardWorkspace* ws) const;

  const ModelConfig config_;
  const ModelOptions options_;
  const ModelWeights weights_;
  const std::vector<float> inv_freq_;
  const std::vector<float> kv_scales_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_MODEL_H_
