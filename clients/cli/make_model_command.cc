// tokenselect make-model --preset NAME --out DIR
// Writes a small deterministic Hugging Face checkpoint with a trained byte-level BPE tokenizer
// (engine/generation/demo_checkpoint.h). The same flags always give byte-identical files.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cli/command.h"
#include "common/status.h"
#include "engine/generation/demo_checkpoint.h"

ABSL_FLAG(std::string, preset, "llama-gqa",
          "make-model: checkpoint preset: llama-gqa, qwen2-bias or llama3-rope.");
ABSL_FLAG(std::string, out, "", "make-model: output directory (created if needed).");
ABSL_FLAG(int32_t, vocab_size, 2048,
          "make-model: tokenizer vocabulary size (256 bytes + merges + 5 special tokens).");
ABSL_FLAG(uint64_t, weight_seed, 0, "make-model: seed of the random weights.");
ABSL_FLAG(std::string, dtype, "float32", "make-model: storage dtype: float32, float16, bfloat16.");
ABSL_FLAG(std::string, init, "scaled",
          "make-model: weight init: scaled (trained-looking scales, the default) or hf "
          "(transformers' own N(0, 0.02) init: near-linear, quiet models).");

namespace tokenselect::cli {

absl::Status RunMakeModel(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected arguments: ", absl::StrJoin(args, " ")));
  }
  engine::DemoCheckpointOptions options;
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  options.preset = absl::GetFlag(FLAGS_preset);
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.weight_seed = absl::GetFlag(FLAGS_weight_seed);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "float32") {
    options.dtype = engine::DType::kF32;
  } else if (dtype == "float16") {
    options.dtype = engine::DType::kF16;
  } else if (dtype == "bfloat16") {
    options.dtype = engine::DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be float32, float16 or bfloat16, got '", dtype, "'"));
  }
  const std::string init = absl::GetFlag(FLAGS_init);
  if (init == "scaled") {
    options.init = engine::DummyInit::kScaled;
  } else if (init == "hf") {
    options.init = engine::DummyInit::kHuggingFace;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--init must be scaled or hf, got '", init, "'"));
  }
  RETURN_IF_ERROR(engine::WriteDemoCheckpoint(out, options));
  std::printf("wrote %s (preset %s)\n", out.c_str(), options.preset.c_str());
  return absl::OkStatus();
}

}  // namespace tokenselect::cli
