// Small deterministic test models (docs/DESIGN.md section 3: "a generator writes small
// deterministic test checkpoints for tests and the demo"). Each preset covers one variant of the
// Llama family:
//   "llama-gqa"    LlamaForCausalLM, 8 query heads over 2 KV heads (group 4), head_dim 32
//   "qwen2-bias"   Qwen2ForCausalLM with q/k/v biases, 8 heads over 4 KV heads, tied embeddings
//   "llama3-rope"  LlamaForCausalLM with rope_scaling llama3 (factor 8, original context 256)
//                  and rope_theta 500000; head_dim 64, so q_dim (512) != hidden_size (256)
// All have hidden_size 256, intermediate_size 512 and 4 layers: 2.2M parameters in the layers
// (2.9M for llama3-rope) plus the embeddings (vocab_size x 256, twice unless tied): about 10 MB
// in fp32 at a vocabulary of 512. The vocabulary comes from the caller because the tokenizer is
// trained separately.
#ifndef TOKENSELECT_ENGINE_MODEL_MODEL_PRESETS_H_
#define TOKENSELECT_ENGINE_MODEL_MODEL_PRESETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/checkpoint_writer.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"

namespace tokenselect::engine {

struct PresetOptions {
  int64_t vocab_size = 512;
  int64_t bos_token_id = 1;  // -1: none
  int64_t eos_token_id = 2;  // -1: none
  uint64_t seed = 0;         // of the dummy weights
  // kScaled: "trained-looking" (greedy generation is nonsense but not degenerate);
  // kHuggingFace: transformers' own N(0, 0.02) init (dummy_weights.h).
  DummyInit init = DummyInit::kScaled;
};

// The preset names, in the order above.
std::vector<std::string> PresetNames();

// Llama-3-8B's shape (32 layers, hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336,
// vocabulary 128256, Llama-3 RoPE scaling): the benchmarks' dummy model.
ModelConfig Llama3_8BConfig();

// The config of preset `name`. NotFound listing the presets for an unknown name;
// InvalidArgument (ValidateModelConfig) for a bad vocabulary size or token id.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name, const PresetOptions& options);

// Writes preset `name` with options.init's dummy weights (kScaled unless asked) to `dir`.
absl::Status WritePresetCheckpoint(const std::string& dir, absl::string_view name,
                                   const PresetOptions& options,
                                   const CheckpointOptions& checkpoint = {});

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_MODEL_PRESETS_H_
