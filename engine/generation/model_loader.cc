#include "engine/generation/model_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

absl::StatusOr<LoadFormat> ParseLoadFormat(absl::string_view name) {
  if (name == "auto" || name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return absl::InvalidArgumentError(
      absl::StrCat("load_format must be auto, safetensors or dummy, got '", name, "'"));
}

absl::StatusOr<LoadedModel> LoadModelDirectory(const std::string& dir, LoadFormat format,
                                               uint64_t dummy_seed) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::LoadFromDirectory(dir));
  if (tok->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the tokenizer has ", tok->vocab_size(), " tokens but config.json vocab_size is ",
        config.vocab_size));
  }
  ModelWeights weights;
  if (format == LoadFormat::kDummy) {
    ASSIGN_OR_RETURN(weights, LoadDummyWeights(config, dummy_seed));
  } else {
    WeightLoadStats stats;
    ASSIGN_OR_RETURN(weights, LoadWeights(config, dir, &stats));
    TS_LOG(INFO, "loaded {} tensors ({:.1f} MiB fp32) from {}", stats.num_loaded,
           stats.bytes_loaded / double(1 << 20), dir);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(std::move(config), std::move(weights)));
  return LoadedModel{std::move(model), std::move(tok)};
}

}  // namespace tokenselect::engine
