// Loading a model directory for serving: config.json, the weights (safetensors, or dummy random
// weights for benchmarks at any shape) and the tokenizer (tokenizer.json +
// tokenizer_config.json). Shared by the CLI and the workers.
#ifndef TOKENSELECT_ENGINE_GENERATION_MODEL_LOADER_H_
#define TOKENSELECT_ENGINE_GENERATION_MODEL_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

enum class LoadFormat {
  kSafetensors,  // the directory's *.safetensors ("auto")
  kDummy,        // deterministic random weights of config.json's shape; no weight files read
};

// "auto" / "safetensors" -> kSafetensors, "dummy" -> kDummy; InvalidArgument naming
// load_format otherwise.
absl::StatusOr<LoadFormat> ParseLoadFormat(absl::string_view name);

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

// Loads `dir`. Errors name the file and what is wrong (config field, tensor name and shapes,
// tokenizer field); nothing is partially loaded.
absl::StatusOr<LoadedModel> LoadModelDirectory(const std::string& dir, LoadFormat format,
                                               uint64_t dummy_seed = 0);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_MODEL_LOADER_H_
