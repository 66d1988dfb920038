// The trained checkpoint of tests/data/golden_trained (make_trained.py there: a small Llama
// trained on a synthetic language, so its next-token distributions have margins between the top
// candidates, as a trained model's do) with its golden prompts and transformers' greedy
// continuations, for the GPU tests that compare continuations. Paths are relative to the source
// root, where ctest runs the tests.
#ifndef TOKENSELECT_TESTS_GPU_TRAINED_CHECKPOINT_H_
#define TOKENSELECT_TESTS_GPU_TRAINED_CHECKPOINT_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "nlohmann/json.hpp"

namespace tokenselect::gpu_test {

inline constexpr char kTrainedModel[] = "llama-topics";
inline constexpr char kTrainedDir[] = "tests/data/golden_trained/llama-topics";

struct TrainedPrompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;  // transformers' 32-token greedy continuation (fp32)
};

// The golden prompts (40, of 1 to 1024 tokens) in the manifest's order.
inline absl::StatusOr<std::vector<TrainedPrompt>> TrainedPrompts() {
  const std::string path = "tests/data/golden_trained/golden.json";
  std::ifstream in(path);
  if (!in.good()) {
    return absl::NotFoundError(path + " not found (run from the source root)");
  }
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<TrainedPrompt> out;
  for (const nlohmann::json& p : golden["presets"][kTrainedModel]["prompts"]) {
    out.push_back({p["ids"].get<std::vector<int32_t>>(), p["greedy"].get<std::vector<int32_t>>()});
  }
  return out;
}

struct TrainedCheckpoint {
  engine::ModelConfig config;
  engine::ModelWeights weights;  // fp32 (the committed bf16 values, exactly)
};

inline absl::StatusOr<TrainedCheckpoint> LoadTrainedCheckpoint() {
  TrainedCheckpoint out;
  ASSIGN_OR_RETURN(out.config, engine::LoadModelConfig(kTrainedDir));
  ASSIGN_OR_RETURN(out.weights, engine::LoadWeights(out.config, kTrainedDir));
  return out;
}

}  // namespace tokenselect::gpu_test

#endif  // TOKENSELECT_TESTS_GPU_TRAINED_CHECKPOINT_H_
