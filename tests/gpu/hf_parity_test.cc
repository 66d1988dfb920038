// The GPU forward pass (CudaModel, bf16) against Hugging Face transformers (fp32, eager) on our
// generated checkpoints, from a golden directory written by tests/data/golden/make_golden.py:
// logits at the recorded positions of every prompt (lengths 1 to 1024; relative L2 over the
// vocabulary) and 32-token greedy continuations.
//   - the committed goldens (tests/data/golden: DummyInit::kScaled presets, whose random layers
//     amplify any rounding) are compared with a loose bound that documents the amplification;
//   - tests/data/golden_hf (make-model --init hf: transformers' own N(0, 0.02) init, quiet
//     models) gets the bound: relative L2 <= 2e-2 at every recorded position.
//   - tests/data/golden_trained (a small model trained on a synthetic language, committed with
//     its checkpoint: make_trained.py there) gets the whole target: relative L2 <= 2e-2
//     and identical greedy continuations on >= 95% of its 40 prompts. Its next-token
//     distributions have margins between the top candidates, as a trained model's do; the
//     random checkpoints' are nearly flat, so their continuations flip wherever the top two
//     logits sit within the bf16 rounding.
// TS_HF_GOLDEN_DIR points the second case at other goldens, with their checkpoints in one
// sub-directory per preset.
// TS_HF_PARITY_CONTINUATIONS names a file to which every prompt's continuation is appended as a
// JSON line {"golden", "preset", "prompt", "greedy"}: bench/hf_bf16_greedy.py --ours compares
// them with transformers' own bf16 continuations.
// Greedy agreement is printed for all three (see docs/gpu.md for what these models allow). At a
// continuation's first difference the test prints our logit of our token minus our logit of
// transformers' token, against the logits' RMS: how near a tie the flip was; for the quiet and
// the trained checkpoints every such gap must be a near-tie (at most 5% of the RMS), for the
// kScaled presets at most half the RMS.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/generation/cuda_backend.h"
#include "engine/generation/demo_checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/gpu/gpu_engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::engine {
namespace {

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

struct Summary {
  double worst = 0, median = 0;
  int same_greedy = 0, prompts = 0;
  // Over the continuations that differ: the largest gap at the first difference (our logit of
  // our token minus our logit of transformers' token) as a fraction of the logits' RMS.
  double worst_flip = 0;
};

// Runs every preset and prompt of `golden_dir` on the GPU. Checkpoints come from
// golden_dir/<preset> when present, else are regenerated with WriteDemoCheckpoint and `init` (the
// committed goldens' own checkpoints, byte for byte).
Summary Compare(const std::string& golden_dir, DummyInit init) {
  Summary summary;
  std::ifstream in(golden_dir + "/golden.json");
  EXPECT_TRUE(in.good()) << "missing " << golden_dir << "/golden.json (make_golden.py)";
  if (!in.good()) return summary;
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<double> rels;
  for (const auto& [preset, entry] : golden["presets"].items()) {
    std::string dir = golden_dir + "/" + preset;
    if (!Exists(dir + "/config.json")) {
      dir = ::testing::TempDir() + "/gpu_hf_parity_" + preset +
            (init == DummyInit::kHuggingFace ? "_hf" : "");
      DemoCheckpointOptions options;
      options.preset = preset;
      options.init = init;
      EXPECT_TRUE(WriteDemoCheckpoint(dir, options).ok());
    }
    TpCudaModelOptions one_gpu;
    one_gpu.model.max_tokens = 2048;
    one_gpu.model.max_chunk = 512;
    auto loaded = LoadTpCudaModelDirectory(dir, LoadFormat::kSafetensors, 0, one_gpu);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) continue;
    CudaModel& model = *loaded->model->shard(0);  // one rank: the plain model
    const int64_t vocab = model.config().vocab_size;
    const std::vector<float> hf_rows = ReadFloats(golden_dir + "/" + preset + ".logits.bin");
    int64_t row = 0;
    int prompt_index = 0;  // within the preset
    for (const nlohmann::json& prompt : entry["prompts"]) {
      const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
      std::vector<float> logits;
      for (int64_t p : prompt["logit_positions"].get<std::vector<int64_t>>()) {
        model.Reset();
        EXPECT_TRUE(model.Forward(absl::MakeConstSpan(ids).subspan(0, p + 1), &logits).ok());
        EXPECT_LE(static_cast<size_t>((row + 1) * vocab), hf_rows.size());
        const double rel =
            gpu_test::RelativeL2(logits.data(), hf_rows.data() + row * vocab, logits.size());
        rels.push_back(rel);
        ++row;
      }
      model.Reset();
      EXPECT_TRUE(model.Forward(ids, &logits).ok());
      const std::vector<int32_t> want = prompt["greedy"].get<std::vector<int32_t>>();
      std::vector<int32_t> greedy;
      double flip_gap = 0, flip_rms = 0;  // at the first difference: see the file comment
      for (int i = 0; i < 32; ++i) {
        auto next = model.GreedyToken();
        EXPECT_TRUE(next.ok());
        greedy.push_back(*next);
        if (flip_rms == 0 && i < static_cast<int>(want.size()) && *next != want[i]) {
          flip_gap = double(logits[*next]) - double(logits[want[i]]);
          double sum = 0;
          for (float l : logits) sum += double(l) * l;
          flip_rms = std::sqrt(sum / static_cast<double>(logits.size()));
        }
        if (i < 31) {
          EXPECT_TRUE(model.Forward(absl::MakeConstSpan(&greedy.back(), 1), &logits).ok());
        }
      }
      if (const char* path = std::getenv("TS_HF_PARITY_CONTINUATIONS")) {
        const nlohmann::json line = {{"golden", golden_dir},
                                     {"preset", preset},
                                     {"prompt", prompt_index},
                                     {"greedy", greedy}};
        std::ofstream(path, std::ios::app) << line.dump() << "\n";
      }
      ++prompt_index;
      ++summary.prompts;
      summary.same_greedy += greedy == want;
      const size_t first = gpu_test::FirstDifference(greedy, want);
      std::printf("  %s, %zu-token prompt: worst logits rel L2 so far %.3g; greedy %s (first "
                  "difference at %zu",
                  preset.c_str(), ids.size(), *std::max_element(rels.begin(), rels.end()),
                  greedy == want ? "identical" : "differs", first);
      if (greedy != want) {
        std::printf("; our top logit %.4g above transformers' pick, logits RMS %.4g", flip_gap,
                    flip_rms);
        // (No token differs within transformers' continuation: only the lengths do, which
        // greedy == want already counts; no gap to bound then.)
        if (flip_rms > 0) summary.worst_flip = std::max(summary.worst_flip, flip_gap / flip_rms);
      }
      if (prompt.contains("greedy_min_gap")) {
        std::printf("; transformers' smallest top-2 gap %.3g",
                    prompt["greedy_min_gap"].get<double>());
      }
      std::printf(")\n");
    }
  }
  if (!rels.empty()) {
    std::sort(rels.begin(), rels.end());
    summary.worst = rels.back();
    summary.median = rels[rels.size() / 2];
  }
  return summary;
}

void Print(const std::string& what, const Summary& s) {
  std::printf("GPU vs transformers fp32, %s: logits rel L2 median %.3g worst %.3g; identical "
              "greedy continuations %d of %d; largest gap at a first difference %.3g of the "
              "logits' RMS\n",
              what.c_str(), s.median, s.worst, s.same_greedy, s.prompts, s.worst_flip);
}

TEST(GpuHfParityTest, CommittedGoldensScaledPresets) {
  const Summary s = Compare("tests/data/golden", DummyInit::kScaled);
  Print("kScaled presets", s);
  // These random layers amplify rounding (docs/gpu.md): a loose bound that still catches a
  // broken forward pass (which lands at O(1)).
  EXPECT_LE(s.median, 0.1);
  EXPECT_LE(s.worst, 0.3);
  // Their continuations part at gaps of the same order as those errors (twenty-sixth session,
  // H200: at most 0.21 of the logits' RMS, with logits rel L2 up to 0.12); a wrong forward pass
  // parts at gaps of a few RMS.
  EXPECT_LE(s.worst_flip, 0.5);
}

TEST(GpuHfParityTest, QuietCheckpoints) {
  const char* env = std::getenv("TS_HF_GOLDEN_DIR");
  const std::string dir = env != nullptr ? env : "tests/data/golden_hf";
  const Summary s = Compare(dir, DummyInit::kHuggingFace);
  Print(dir, s);
  EXPECT_LE(s.worst, 2e-2);
  // These nearly flat distributions keep the issue's >= 95% identical continuations out of
  // reach (the file comment; transformers' own bf16 gets the same 11 of 15, on the same four
  // prompts: bench/hf_bf16_greedy.py, docs/gpu.md). What is asserted instead: every
  // continuation that differs parts at a near-tie, where our top logit is within 5% of the
  // logits' RMS of transformers' pick (twenty-fifth session, H100 and H200: at most 1.8%; the
  // bf16 error per logit is ~0.7% of the RMS). A wrong forward pass parts at gaps of the RMS's
  // order.
  EXPECT_LE(s.worst_flip, 0.05);
}

TEST(GpuHfParityTest, TrainedCheckpoint) {
  const Summary s = Compare("tests/data/golden_trained", DummyInit::kHuggingFace);
  Print("trained checkpoint", s);
  EXPECT_EQ(s.prompts, 40);
  EXPECT_LE(s.worst, 2e-2);
  EXPECT_GE(s.same_greedy * 100, s.prompts * 95);
  EXPECT_LE(s.worst_flip, 0.05);  // as for the quiet checkpoints, should any differ
}

}  // namespace
}  // namespace tokenselect::engine
