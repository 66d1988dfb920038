// Small deterministic Hugging Face checkpoints with a trained tokenizer, for tests, the demo
// (`make run`) and the HF parity data (tests/data/golden/). A checkpoint is config.json,
// generation_config.json, model.safetensors (engine/model/model_presets.h) and a byte-level BPE
// tokenizer trained on the embedded mixed corpus (tokenizer/bpe_trainer.h) with Llama-3's
// special tokens and a Llama-3 chat template. The same options always give byte-identical files.
#ifndef TOKENSELECT_ENGINE_GENERATION_DEMO_CHECKPOINT_H_
#define TOKENSELECT_ENGINE_GENERATION_DEMO_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model/dtype.h"
#include "engine/model/dummy_weights.h"

namespace tokenselect::engine {

struct DemoCheckpointOptions {
  std::string preset = "llama-gqa";  // llama-gqa, qwen2-bias, llama3-rope
  int32_t vocab_size = 2048;         // 256 bytes + merges + 5 special tokens
  uint64_t weight_seed = 0;
  DummyInit init = DummyInit::kScaled;  // weights: trained-looking, or transformers' N(0, 0.02)
  DType dtype = DType::kF32;  // storage dtype: F32, F16 or BF16
};

// Writes the checkpoint to `dir` (created if needed). NotFound for an unknown preset;
// InvalidArgument for a vocabulary too small for the special tokens or an unsupported dtype;
// Internal for I/O errors.
absl::Status WriteDemoCheckpoint(const std::string& dir, const DemoCheckpointOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_DEMO_CHECKPOINT_H_
