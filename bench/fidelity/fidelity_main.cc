// bench_fidelity: how closely each selection policy follows dense attention on one checkpoint
// and prompt (bench/fidelity/fidelity.h; docs/fidelity.md explains the metrics).
//
//   bench_fidelity [--model DIR | --preset NAME] [--load_format auto|dummy]
//                  [--prompt_file PATH | --prompt_tokens N] [--policies a,b,...|all]
//                  [--k K --n_init I --n_local L --chunk_size C --theta T]
//                  [--decode_steps 8] [--continuation_tokens 32] [--json PATH]
//                  [--kv_dtype bf16|fp8]
// Without --model, --preset (default llama-gqa) writes a demo checkpoint (weights and trained
// tokenizer) into a temporary directory. --load_format dummy without --model uses the preset's
// config with dummy weights in memory and no tokenizer (the prompt is then synthetic ids).
// --kv_dtype fp8 runs the policies with the FP8 KV cache simulation against the unquantized dense
// reference (add "dense" to --policies to measure the FP8 cache alone; docs/fp8_kv.md).
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/fidelity/fidelity.h"
#include "bench/fidelity/report.h"
#include "bench/fidelity/synthetic_prompt.h"
#include "common/flags.h"
#include "common/status.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/model_loader.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model_presets.h"

ABSL_FLAG(std::string, model, "", "Hugging Face checkpoint directory.");
ABSL_FLAG(std::string, preset, "llama-gqa",
          "without --model: demo preset (llama-gqa, qwen2-bias, llama3-rope).");
ABSL_FLAG(std::string, load_format, "auto", "auto (safetensors) or dummy (random weights).");
ABSL_FLAG(uint64_t, dummy_seed, 0, "seed of dummy / demo weights.");
ABSL_FLAG(int32_t, vocab_size, 2048, "vocabulary of a demo checkpoint or in-memory dummy model.");
ABSL_FLAG(std::string, prompt_file, "", "prompt text file (needs a tokenizer).");
ABSL_FLAG(int64_t, prompt_tokens, 4096, "length of the synthetic prompt (without --prompt_file).");
ABSL_FLAG(uint64_t, prompt_seed, 1, "seed of the synthetic prompt.");
ABSL_FLAG(std::vector<std::string>, policies,
          std::vector<std::string>({"tokenselect", "topk", "head_vote", "streaming"}),
          "comma-separated policy names (engine::ParsePolicy), or 'all'.");
ABSL_FLAG(int64_t, k, 2048, "selection budget: tokens picked by the policy.");
ABSL_FLAG(int64_t, n_init, 128, "selection budget: sink tokens always kept.");
ABSL_FLAG(int64_t, n_local, 512, "selection budget: recent tokens always kept.");
ABSL_FLAG(int64_t, chunk_size, 512, "prefill chunk size.");
ABSL_FLAG(double, theta, 0.9, "selection-cache cosine threshold (> 1 disables the cache).");
ABSL_FLAG(int64_t, decode_steps, 8, "decode steps probed per layer (metric a).");
ABSL_FLAG(int64_t, continuation_tokens, 32, "greedy continuation length (metrics b, c).");
ABSL_FLAG(bool, probe_prefill, true, "also probe the prompt's last prefill chunk.");
ABSL_FLAG(std::string, json, "", "also write the report as JSON to this path.");
ABSL_FLAG(int32_t, threads, 0, "OpenMP threads (0: the OpenMP default).");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "the policies' KV cache: bf16 (as the model computes it) or fp8 (e4m3 simulation).");

namespace tokenselect::bench {
namespace {

// The tokenizer of the result is null for an in-memory dummy model.
absl::StatusOr<engine::LoadedModel> LoadModel() {
  ASSIGN_OR_RETURN(const engine::LoadFormat format,
                   engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format)));
  const uint64_t seed = absl::GetFlag(FLAGS_dummy_seed);
  std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty() && format == engine::LoadFormat::kDummy) {
    engine::PresetOptions preset;
    preset.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    ASSIGN_OR_RETURN(engine::ModelConfig config,
                     engine::PresetConfig(absl::GetFlag(FLAGS_preset), preset));
    engine::DummyWeightOptions weights;
    weights.seed = seed;
    weights.init = engine::DummyInit::kScaled;
    ASSIGN_OR_RETURN(engine::ModelWeights w, engine::LoadDummyWeights(config, weights));
    engine::LoadedModel loaded;
    ASSIGN_OR_RETURN(loaded.model, engine::Model::Create(std::move(config), std::move(w)));
    return loaded;
  }
  std::string temp;
  if (dir.empty()) {
    char pattern[] = "/tmp/bench_fidelity_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return absl::InternalError("cannot create a temp dir");
    temp = dir = pattern;
    engine::DemoCheckpointOptions demo;
    demo.preset = absl::GetFlag(FLAGS_preset);
    demo.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    demo.weight_seed = seed;
    std::fprintf(stderr, "writing demo checkpoint %s to %s\n", demo.preset.c_str(), dir.c_str());
    RETURN_IF_ERROR(engine::WriteDemoCheckpoint(dir, demo));
  }
  absl::StatusOr<engine::LoadedModel> loaded = engine::LoadModelDirectory(dir, format, seed);
  if (!temp.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp, ignored);
  }
  return loaded;
}

absl::StatusOr<std::vector<int32_t>> Prompt(const engine::LoadedModel& loaded) {
  const std::string path = absl::GetFlag(FLAGS_prompt_file);
  const int64_t n = absl::GetFlag(FLAGS_prompt_tokens);
  const uint64_t seed = absl::GetFlag(FLAGS_prompt_seed);
  if (!path.empty()) {
    if (loaded.tokenizer == nullptr) {
      return absl::InvalidArgumentError("--prompt_file needs a checkpoint with a tokenizer");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --prompt_file ", path));
    std::stringstream text;
    text << in.rdbuf();
    return loaded.tokenizer->Encode(text.str(), /*add_special_tokens=*/true);
  }
  if (n < 1) return absl::InvalidArgumentError("--prompt_tokens must be >= 1");
  if (loaded.tokenizer != nullptr) return SyntheticPromptFromText(*loaded.tokenizer, n, seed);
  return SyntheticPromptIds(loaded.model->config().vocab_size, n, seed);
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  ASSIGN_OR_RETURN(engine::LoadedModel loaded, LoadModel());
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, Prompt(loaded));

  FidelityOptions options;
  options.selection.k = absl::GetFlag(FLAGS_k);
  options.selection.n_init = absl::GetFlag(FLAGS_n_init);
  options.selection.n_local = absl::GetFlag(FLAGS_n_local);
  options.selection.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  options.selection.theta = absl::GetFlag(FLAGS_theta);
  options.policies = absl::GetFlag(FLAGS_policies);
  if (options.policies.size() == 1 && options.policies[0] == "all") {
    options.policies = AllPolicyNames();
  }
  options.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  options.continuation_tokens = absl::GetFlag(FLAGS_continuation_tokens);
  options.probe_last_prefill_chunk = absl::GetFlag(FLAGS_probe_prefill);
  ASSIGN_OR_RETURN(options.kv_dtype, engine::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype)));

  ASSIGN_OR_RETURN(FidelityReport report, RunFidelity(*loaded.model, prompt, options));
  const std::string text = FormatReport(report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << ReportToJson(report);
    if (!out) return absl::InternalError(absl::StrCat("cannot write --json ", json_path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tokenselect::bench

int main(int argc, char** argv) {
  absl::StatusOr<std::vector<std::string>> positional = tokenselect::common::ParseFlags(
      argc, argv, "bench_fidelity: fidelity of selection policies against dense attention");
  if (!positional.ok()) {
    std::fprintf(stderr, "%s\n", positional.status().ToString().c_str());
    return 2;
  }
  const absl::Status status = tokenselect::bench::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "bench_fidelity: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
