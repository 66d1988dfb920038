// CPU model throughput on a dummy ~125M-parameter Llama shape (hidden 768, 12 layers, 12 heads
// over 4 KV heads, intermediate 2560, vocab 32000, tied embeddings):
//   prefill tokens/s: one 512-token prompt chunk (dense attention);
//   decode tokens/s:  single-token forward passes after the prompt (median of --decode_steps);
//   the memory-bound limit of decode: fp32 weight bytes read per token over the measured copy
//   bandwidth (2 GiB, the same OpenMP threads, counting bytes read + written), and achieved /
//   limit. Weights that fit in a large L3 can beat this limit; the report prints their size.
// Numbers depend on the machine and its load; quote them with the machine and thread count.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/clock.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/model/weights.h"

ABSL_FLAG(int, prompt_tokens, 512, "Prompt tokens of the prefill measurement.");
ABSL_FLAG(int, decode_steps, 32, "Decode steps measured (median reported).");
ABSL_FLAG(int, threads, 0, "OpenMP threads (0: the default).");

namespace tokenselect::engine {
namespace {

ModelConfig Config125M() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.hidden_size = 768;
  c.intermediate_size = 2560;
  c.num_layers = 12;
  c.num_heads = 12;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.vocab_size = 32000;
  c.tie_word_embeddings = true;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 8192;
  c.rope.theta = 10000.0;
  c.rope.head_dim = c.head_dim;
  return c;
}

// Copy bandwidth in bytes/s, counting read + write, best of several copies of 2 GiB (far beyond
// any L3) split over the same OpenMP threads the forward pass uses.
double MemcpyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  std::vector<char> a(bytes), b(bytes);
  const int threads = omp_get_max_threads();
  const size_t slice = (bytes + threads - 1) / threads;
#pragma omp parallel for
  for (int t = 0; t < threads; ++t) {  // first touch by the copying thread
    const size_t begin = std::min(bytes, t * slice), end = std::min(bytes, begin + slice);
    std::memset(a.data() + begin, 1, end - begin);
    std::memset(b.data() + begin, 2, end - begin);
  }
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const common::Stopwatch w;
#pragma omp parallel for
    for (int t = 0; t < threads; ++t) {
      const size_t begin = std::min(bytes, t * slice), end = std::min(bytes, begin + slice);
      std::memcpy(b.data() + begin, a.data() + begin, end - begin);
    }
    best = std::max(best, 2.0 * bytes / w.ElapsedSeconds());
  }
  if (b[12345] != 1) std::printf("memcpy check failed\n");
  return best;
}

int Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  const ModelConfig config = Config125M();
  auto weights = LoadDummyWeights(config, /*seed=*/1);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  auto model = Model::Create(config, std::move(*weights));
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const int prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  auto pool = PagePool::Create((*model)->KvCacheOptions((prompt + steps) / 16 + 2, 16));
  TokenTable table(pool->get(), "bench");
  ForwardWorkspace ws;
  std::vector<float> logits;
  std::vector<int32_t> ids(prompt);
  for (int i = 0; i < prompt; ++i) ids[i] = (i * 7919) % config.vocab_size;

  ForwardRequest request;
  request.table = &table;
  request.tokens = ids;
  request.logits = LogitsRows::kLast;
  const common::Stopwatch prefill;
  if (auto s = (*model)->Forward(request, &ws, &logits); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const double prefill_s = prefill.ElapsedSeconds();

  std::vector<double> step_s;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    request.tokens = absl::MakeConstSpan(&next, 1);
    const common::Stopwatch w;
    if (auto s = (*model)->Forward(request, &ws, &logits); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    step_s.push_back(w.ElapsedSeconds());
  }
  std::sort(step_s.begin(), step_s.end());
  const double decode_s = step_s[step_s.size() / 2];

  const double params = static_cast<double>(NumParameters(config));
  const double weight_bytes = params * sizeof(float);
  const double bandwidth = MemcpyBandwidth();
  const double limit_tok_s = bandwidth / weight_bytes;
  std::printf("model: dummy Llama %.1fM parameters (fp32 %.0f MiB), %d threads\n", params / 1e6,
              weight_bytes / (1 << 20), omp_get_max_threads());
  std::printf("copy bandwidth (read+write, %d threads): %.1f GB/s\n", omp_get_max_threads(),
              bandwidth / 1e9);
  std::printf("%-28s %12s %14s\n", "measure", "value", "note");
  std::printf("%-28s %12.1f %14s\n", "prefill tokens/s", prompt / prefill_s,
              (std::to_string(prompt) + " tokens").c_str());
  std::printf("%-28s %12.1f %14s\n", "decode tokens/s (median)", 1.0 / decode_s,
              (std::to_string(steps) + " steps").c_str());
  std::printf("%-28s %12.1f %14s\n", "decode memory-bound limit", limit_tok_s,
              "weights/memcpy");
  std::printf("%-28s %12.2f\n", "decode achieved / limit", (1.0 / decode_s) / limit_tok_s);
  return 0;
}

}  // namespace
}  // namespace tokenselect::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tokenselect::engine::Run();
}
