#include "engine/model/model_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "engine/model/dummy_weights.h"

namespace tokenselect::engine {

ModelConfig Llama3_8BConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 131072;
  c.rope.head_dim = 128;
  c.rope.theta = 500000.0;
  c.rope.scaling = kernels::RopeScaling::kLlama3;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position = 8192;
  return c;
}

std::vector<std::string> PresetNames() { return {"llama-gqa", "qwen2-bias", "llama3-rope"}; }

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name, const PresetOptions& options) {
  ModelConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = options.vocab_size;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 4096;
  c.rope.theta = 10000.0;
  if (name == "llama-gqa") {
    c.architecture = Architecture::kLlama;
  } else if (name == "qwen2-bias") {
    c.architecture = Architecture::kQwen2;
    c.num_kv_heads = 4;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.rms_norm_eps = 1e-6;
    c.rope.theta = 1000000.0;
  } else if (name == "llama3-rope") {
    c.architecture = Architecture::kLlama;
    c.head_dim = 64;
    c.max_position_embeddings = 2048;
    c.rope.theta = 500000.0;
    c.rope.scaling = kernels::RopeScaling::kLlama3;
    c.rope.factor = 8.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position = 256;
  } else {
    return absl::NotFoundError(absl::StrCat(
        "no model preset '", name, "' (presets: ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  c.rope.head_dim = c.head_dim;
  if (options.bos_token_id >= 0) c.bos_token_ids = {options.bos_token_id};
  if (options.eos_token_id >= 0) c.eos_token_ids = {options.eos_token_id};
  c.torch_dtype = "float32";
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

absl::Status WritePresetCheckpoint(const std::string& dir, absl::string_view name,
                                   const PresetOptions& options,
                                   const CheckpointOptions& checkpoint) {
  ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(name, options));
  DummyWeightOptions dummy;
  dummy.seed = options.seed;
  dummy.init = options.init;
  ASSIGN_OR_RETURN(ModelWeights weights, LoadDummyWeights(config, dummy));
  return WriteCheckpoint(dir, config, weights, checkpoint);
}

}  // namespace tokenselect::engine
