// The fixed hyper-parameters of a Llama-family model, read from a Hugging Face config.json.
//
// Architectures (docs/DESIGN.md section 3):
//   LlamaForCausalLM    Llama 2/3/3.1, Yi; optional attention_bias (q/k/v/o) and mlp_bias;
//                       rope_scaling "linear" or "llama3"
//   Qwen2ForCausalLM    q/k/v projections always carry a bias, o_proj none
//   MistralForCausalLM  no biases; sliding_window is parsed but not applied (see below)
// Both the transformers 4 spelling (top-level rope_theta, rope_scaling with "type" or
// "rope_type") and the transformers 5 spelling (rope_parameters with rope_theta inside) are read.
#ifndef TOKENSELECT_ENGINE_MODEL_MODEL_CONFIG_H_
#define TOKENSELECT_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"

namespace tokenselect::engine {

enum class Architecture { kLlama, kQwen2, kMistral };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM".
const char* ArchitectureName(Architecture arch);
// "llama", "qwen2", "mistral": the config.json model_type.
const char* ModelTypeName(Architecture arch);

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads (default: num_heads)
  int64_t head_dim = 0;      // head_dim (default: hidden_size / num_heads)
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  // Biases. Llama: attention_bias puts one on q/k/v/o, mlp_bias on gate/up/down.
  // Qwen2: q/k/v always. Mistral: none.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  // Mistral's sliding window (0: none). Not applied by the engine: its attention lists come
  // from the selection policies instead (docs/DESIGN.md section 4). Model::Create logs it.
  int64_t sliding_window = 0;
  // RoPE: theta and scaling; head_dim is copied from above.
  kernels::RopeParams rope;
  std::vector<int64_t> bos_token_ids;   // empty when absent
  std::vector<int64_t> eos_token_ids;   // config.json allows an int or a list
  std::string torch_dtype = "float32";  // "torch_dtype" or (transformers 5) "dtype"

  // Derived sizes.
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t group_size() const { return num_heads / num_kv_heads; }
};

// Parses the text of a config.json. Errors are InvalidArgument and name the field, e.g.
//   "config.json: num_key_value_heads (5) must divide num_attention_heads (32)";
// an architecture outside the list above is Unimplemented and named; so is an unsupported
// rope_scaling type or hidden_act.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

// Reads and parses <dir>/config.json (NotFound when the file is missing).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// Checks the invariants ParseModelConfig guarantees (positive sizes, head divisibility, even
// head_dim, valid rope parameters). For configs built in code (presets, tests).
absl::Status ValidateModelConfig(const ModelConfig& config);

// The RoPE parameters for kernels::RopeInverseFrequencies.
kernels::RopeParams ToRopeParams(const ModelConfig& config);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_MODEL_CONFIG_H_
