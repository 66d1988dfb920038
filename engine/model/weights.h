// The weights of a Llama-family model in fp32, owned, in Hugging Face layout:
//   linear weights [out_features, in_features] (y = x W^T + b), embeddings [vocab, hidden].
// Each tensor binds to its Hugging Face checkpoint name:
//   model.embed_tokens.weight                          [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight            [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   [q_dim|kv_dim|kv_dim, hidden], o: [hidden,
//   q_dim] model.layers.{i}.self_attn.{q,k,v,o}_proj.bias     when the config has them
//   model.layers.{i}.post_attention_layernorm.weight   [hidden]
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight    [inter, hidden], down: [hidden, inter]
//   model.layers.{i}.mlp.{gate,up,down}_proj.bias      Llama with mlp_bias
//   model.norm.weight                                  [hidden]
//   lm_head.weight                                     [vocab, hidden]; absent when tied
// ListWeights() is the one place that spells this out; loading, dummy generation and checkpoint
// writing all go through it.
#ifndef TOKENSELECT_ENGINE_MODEL_WEIGHTS_H_
#define TOKENSELECT_ENGINE_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace tokenselect::engine {

struct LayerWeights {
  std::vector<float> input_layernorm;           // [hidden]
  std::vector<float> q_proj, q_bias;            // [q_dim, hidden], [q_dim]
  std::vector<float> k_proj, k_bias;            // [kv_dim, hidden], [kv_dim]
  std::vector<float> v_proj, v_bias;            // [kv_dim, hidden], [kv_dim]
  std::vector<float> o_proj, o_bias;            // [hidden, q_dim], [hidden]
  std::vector<float> post_attention_layernorm;  // [hidden]
  std::vector<float> gate_proj, gate_bias;      // [inter, hidden], [inter]
  std::vector<float> up_proj, up_bias;          // [inter, hidden], [inter]
  std::vector<float> down_proj, down_bias;      // [hidden, inter], [hidden]
};

// Biases the config does not have stay empty.
struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> norm;            // [hidden]
  std::vector<float> lm_head_weight;  // [vocab, hidden]; empty when tie_word_embeddings

  // The output projection: lm_head_weight, or embed_tokens when the embeddings are tied.
  const float* lm_head() const {
    return lm_head_weight.empty() ? embed_tokens.data() : lm_head_weight.data();
  }
};

// What a tensor is, for initialisation (see dummy_weights.h).
enum class WeightKind { kEmbedding, kLinear, kBias, kNorm };

template <typename Vector>
struct BasicWeightEntry {
  std::string name;            // Hugging Face name
  std::vector<int64_t> shape;  // expected shape
  WeightKind kind = WeightKind::kLinear;
  int64_t fan_in = 0;      // in_features for linear weights and their biases; hidden otherwise
  Vector* data = nullptr;  // the ModelWeights member it binds to

  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};
using WeightEntry = BasicWeightEntry<std::vector<float>>;
using ConstWeightEntry = BasicWeightEntry<const std::vector<float>>;

// Every tensor `config` needs, in checkpoint order (embeddings, layers, norm, lm_head), bound to
// members of `weights`, whose `layers` it resizes to config.num_layers. `weights` may be null
// (data pointers then null): the list of names and shapes alone.
std::vector<WeightEntry> ListWeights(const ModelConfig& config, ModelWeights* weights);
// The same over const weights, which must have config.num_layers layers (checked).
std::vector<ConstWeightEntry> ListWeights(const ModelConfig& config, const ModelWeights& weights);

// Parameter count of `config` (tied embeddings counted once).
int64_t NumParameters(const ModelConfig& config);

struct WeightLoadStats {
  int64_t num_loaded = 0;
  int64_t bytes_loaded = 0;          // fp32 bytes held
  std::vector<std::string> ignored;  // checkpoint tensors the model does not use
};

// Binds the tensors of `checkpoint` to a ModelWeights for `config`, converting to fp32.
// Every tensor is checked before any data is read: NotFound names a missing tensor
// ("checkpoint has no tensor model.norm.weight"); InvalidArgument a shape mismatch
// ("model.layers.3.self_attn.k_proj.weight: expected shape [256, 1024], got [512, 1024]") or
// an unsupported dtype. Tensors the model does not use are ignored, counted in `stats` and in
// one log line.
absl::StatusOr<ModelWeights> BindWeights(const ModelConfig& config,
                                         const SafetensorsCheckpoint& checkpoint,
                                         WeightLoadStats* stats = nullptr);

// Opens the safetensors of `dir` and binds them (errors prefixed with `dir`).
absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config, const std::string& dir,
                                         WeightLoadStats* stats = nullptr);

// InvalidArgument naming the first tensor whose size does not match `config` (for weights built
// in code).
absl::Status CheckWeightShapes(const ModelConfig& config, const ModelWeights& weights);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_WEIGHTS_H_
