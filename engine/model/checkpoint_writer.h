// Writes Hugging Face checkpoint directories: config.json, generation_config.json and
// model.safetensors (or shards model-0000i-of-0000N.safetensors with
// model.safetensors.index.json). The result loads with transformers'
// AutoModelForCausalLM.from_pretrained and with LoadModelConfig + LoadWeights:
// tests/unit/engine/model/hf_parity.py checks, with transformers 5.17 in fp32, that every
// preset, a Mistral and a sharded bf16 Llama with all biases load with no missing or unexpected
// weights and give engine::Model's logits (max relative error < 1e-5) and greedy tokens.
// The tokenizer files are someone else's: this writes none.
#ifndef TOKENSELECT_ENGINE_MODEL_CHECKPOINT_WRITER_H_
#define TOKENSELECT_ENGINE_MODEL_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model/dtype.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

struct CheckpointOptions {
  DType dtype = DType::kF32;  // storage dtype: F32, F16 or BF16 (rounded to nearest even)
  // > 0: when the tensors take more bytes than this, write shards of at most this size (a
  // tensor larger than the limit gets a shard of its own) and an index. 0: one file.
  int64_t max_shard_bytes = 0;
};

// The config.json text for `config` (transformers 4 spelling: top-level rope_theta and
// rope_scaling, which transformers 5 also reads); torch_dtype/dtype name `dtype`.
std::string ModelConfigJson(const ModelConfig& config, DType dtype);

// generation_config.json: bos/eos token ids.
std::string GenerationConfigJson(const ModelConfig& config);

// Writes the checkpoint to `dir` (created if needed; existing files of the same names are
// replaced). InvalidArgument when `weights` do not match `config` or the dtype is not
// F32/F16/BF16; Internal for I/O errors.
absl::Status WriteCheckpoint(const std::string& dir, const ModelConfig& config,
                             const ModelWeights& weights, const CheckpointOptions& options = {});

// Writes a checkpoint of dummy weights (LoadDummyWeights' values) tensor by tensor, chunk by
// chunk, never holding the model in memory: fit for 8B-scale benchmark checkpoints in bf16.
absl::Status WriteDummyCheckpoint(const std::string& dir, const ModelConfig& config,
                                  const DummyWeightOptions& dummy,
                                  const CheckpointOptions& options = {});

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CHECKPOINT_WRITER_H_
