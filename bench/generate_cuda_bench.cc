// End to end on one GPU: a dummy Llama-3-8B (random bf16 weights of the real shapes, generated
// slab by slab, --load-format dummy style) through CudaModel with the GPU selection providers.
// For each policy: TTFT of an N-token prompt (chunked prefill, chunk 512, up to the first
// greedy token) and decode ms/token over the following steps, next to the bandwidth floor of a
// decode step = (weight bytes + the KV bytes the policy must read) / measured copy bandwidth:
//   dense            every layer reads all N keys and values
//   tokenselect      every layer reads all N keys (the selection scan) plus the n_init + k +
//                    n_local selected keys and values, at the default theta 0.9 (random dummy
//                    weights give consecutive queries that rarely pass it)
//   tokenselect-hit  theta = -1: every lookup after a layer's first hits the selection cache,
//                    the decode speed of a model whose queries stay similar (floor: weights plus
//                    the selected keys and values only)
//   quest, infllm    the baselines at the same budget (optional): Quest reads its page bounds
//                    (2 bf16 rows per page of 16), InfLLM its representatives' keys (4 per block
//                    of 128), then the selected keys and values; InfLLM's prefill also computes
//                    each chunk's received attention
//   tokenselect_span the span index (optional): each chunk's attention map and span detection in
//                    prefill; decode reads the index vectors, then the keys of the best spans'
//                    tokens (4 k) for the exact soft vote
//   tokenselect_span-hit  theta = -1 (optional), as tokenselect-hit: the span index is still built
//                    every step, the selection reads no key
//   cascade          the Cascading KV cache baseline (optional): every step scores the keys its
//                    cache holds (k + n_local) and the new ones, then attends the sinks and them
//   head_vote        TokenSelect's hard-vote ablation (optional): the same key scan, then a
//                    top-k per head and the vote over them (a head at a time)
// The copy bandwidth is a device-to-device cudaMemcpy of 2 GiB measured in the same run, counted
// as bytes read + written per second (a read-only stream runs at about this rate).
// Then batched decode (CudaModel::DecodeBatch: one GEMM pass for B requests): B sequences of
// --batch_context tokens each, dense, decode tokens/s for B = 1, 8, 32.
//   bench_generate_cuda [--tokens 131072] [--decode 64]
//                       [--policies dense,tokenselect,tokenselect-hit] [--batch_context 2048]
//   (--policies may also name quest, infllm, tokenselect_span, tokenselect_span-hit, cascade and
//   head_vote)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/selection/cuda_selection.h"
#include "engine/model/model_presets.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::engine {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Main(int argc, char** argv) {
  int64_t tokens = 131072, decode = 64, batch_context = 2048;
  std::string policies = "dense,tokenselect,tokenselect-hit";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokens") tokens = std::atoll(argv[i + 1]);
    if (flag == "--decode") decode = std::atoll(argv[i + 1]);
    if (flag == "--policies") policies = argv[i + 1];
    if (flag == "--batch_context") batch_context = std::atoll(argv[i + 1]);
  }
  const ModelConfig config = Llama3_8BConfig();
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  // 2 GiB device to device: median of 10 copies after 2 warm-ups, each waited for.
  const size_t copy_bytes = size_t{2} << 30;
  const double copy_gbs =
      bench::CopyGBs(copy_bytes, bench::CopyMs(nullptr, copy_bytes, {10, 2, /*sync_each=*/true}));
  std::printf("device: %s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, copy_gbs);

  CudaModelOptions options;
  options.max_tokens = std::max(tokens + decode + 8, 32 * (batch_context + decode + 8));
  options.max_chunk = 512;
  options.max_batch = 32;
  const auto load_start = std::chrono::steady_clock::now();
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kHuggingFace;
  auto model = CudaModel::CreateDummy(config, dummy, options);
  if (!model.ok()) {
    std::fprintf(stderr, "model: %s\n", model.status().ToString().c_str());
    return 1;
  }
  std::printf("dummy Llama-3-8B: %.2f GB of bf16 weights, %.2f GiB of KV for %lld tokens, "
              "loaded in %.1f s\n",
              (*model)->weight_bytes() / 1e9, (*model)->kv_bytes() / double(1 << 30),
              static_cast<long long>(options.max_tokens), Seconds(load_start));

  std::vector<float> logits_scratch;
  std::vector<int32_t> prompt(static_cast<size_t>(std::max(tokens, batch_context)));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>(3 + (i * 7919) % 128000);
  }

  struct Row {
    std::string policy;
    double ttft_s, decode_ms, floor_ms, hit_rate;
  };
  std::vector<Row> rows;
  const double weight_bytes = static_cast<double>((*model)->weight_bytes());
  const double kv_row = 2.0 * config.kv_dim();  // bytes of one token's keys (or values), a layer
  for (const std::string& policy_name :
       {std::string("dense"), std::string("tokenselect"), std::string("tokenselect-hit"),
        std::string("quest"), std::string("infllm"), std::string("tokenselect_span"),
        std::string("tokenselect_span-hit"), std::string("cascade"), std::string("head_vote")}) {
    if (("," + policies + ",").find("," + policy_name + ",") == std::string::npos) continue;
    const std::string hit_suffix = "-hit";
    const bool always_hit = policy_name.size() > hit_suffix.size() &&
                            policy_name.compare(policy_name.size() - hit_suffix.size(),
                                                hit_suffix.size(), hit_suffix) == 0;
    SelectionOptions sel;
    sel.policy = *ParsePolicy(
        policy_name.substr(0, policy_name.size() - (always_hit ? hit_suffix.size() : 0)));
    sel.chunk_size = 512;
    if (always_hit) sel.theta = -1.0;
    auto provider = CudaSelectionAttention::Create(sel, config, options.max_tokens,
                                                   options.max_chunk);
    if (!provider.ok()) {
      std::fprintf(stderr, "provider: %s\n", provider.status().ToString().c_str());
      return 1;
    }
    auto seq = (*model)->NewSequence(tokens + decode + 8);
    if (!seq.ok()) {
      std::fprintf(stderr, "sequence: %s\n", seq.status().ToString().c_str());
      return 1;
    }
    std::vector<float> logits;
    cudaDeviceSynchronize();
    const auto prefill_start = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < tokens; begin += sel.chunk_size) {
      const int64_t len = std::min<int64_t>(sel.chunk_size, tokens - begin);
      const bool last = begin + len == tokens;
      const absl::Status st =
          (*model)->Forward(seq->get(), absl::MakeConstSpan(prompt).subspan(begin, len),
                            provider->get(), last ? &logits : nullptr);
      if (!st.ok()) {
        std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    auto first = (*model)->GreedyToken();
    if (!first.ok()) return 1;
    const double ttft = Seconds(prefill_start);
    // Decode: greedy on the GPU; logits stay on the device except for the argmax.
    int32_t next = *first;
    double decode_s = 0;
    int64_t timed = 0;
    for (int64_t step = 0; step < decode; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const absl::Status st =
          (*model)->Forward(seq->get(), absl::MakeConstSpan(&next, 1), provider->get(), &logits);
      auto tok = (*model)->GreedyToken();
      if (!st.ok() || !tok.ok()) {
        std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
        return 1;
      }
      next = *tok;
      if (step >= 4) {  // the first steps capture the CUDA graphs
        decode_s += Seconds(t0);
        ++timed;
      }
    }
    auto counters = (*provider)->CacheCounters((*model)->stream());
    const double hit_rate =
        counters.ok() && counters->lookups() > 0 ? double(counters->hits) / counters->lookups()
                                                 : 0.0;
    const double n = static_cast<double>(tokens);
    double kv_bytes;
    if (sel.policy == SelectionPolicyKind::kDense) {
      kv_bytes = 2 * n * kv_row * config.num_layers;
    } else {
      const double selected = double(sel.n_init + sel.k + sel.n_local);
      double scan = always_hit ? 0.0 : n * kv_row;  // the keys the selection reads
      if (sel.policy == SelectionPolicyKind::kQuest) {
        scan = 2.0 * n / sel.baselines.quest_page_size * kv_row;
      } else if (sel.policy == SelectionPolicyKind::kInfLlm) {
        scan = n / sel.baselines.infllm_block_size * sel.baselines.infllm_representatives * kv_row;
      } else if (sel.policy == SelectionPolicyKind::kCascade) {
        scan = static_cast<double>(sel.k + sel.n_local) * kv_row;  // the held tokens' keys
      } else if (sel.policy == SelectionPolicyKind::kTokenSelectSpan && !always_hit) {
        // The index vectors, then the keys of the kept spans' tokens (the token budget).
        auto states = (*provider)->ExportLayerStates((*model)->stream());
        double vectors = 0;
        if (states.ok()) {
          for (const SelectionLayerState& st : *states) vectors += st.spans.num_index_tokens();
          vectors /= std::max<size_t>(1, states->size());
          std::printf("tokenselect_span: %.0f index vectors per layer, %zu spans in layer 0\n",
                      vectors, states->empty() ? size_t{0} : (*states)[0].spans.spans().size());
        }
        scan = (vectors + static_cast<double>(SpanTokenBudget(sel))) * kv_row;
      }
      kv_bytes = (scan + 2 * selected * kv_row) * config.num_layers;
    }
    const double floor_ms = (weight_bytes + kv_bytes) / (copy_gbs * 1e9) * 1e3;
    rows.push_back({policy_name, ttft, 1e3 * decode_s / std::max<int64_t>(1, timed), floor_ms,
                    hit_rate});
    std::printf("%s: TTFT %.2f s for %lld tokens; decode %.2f ms/token (floor %.2f ms); "
                "cache hit rate %.1f%%\n",
                policy_name.c_str(), ttft, static_cast<long long>(tokens), rows.back().decode_ms,
                floor_ms, 100 * hit_rate);
  }
  std::printf("\n| policy | prompt tokens | TTFT (s) | decode ms/token | decode floor ms (weights "
              "+ KV read) | selection-cache hit rate |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.1f%% |\n", r.policy.c_str(),
                static_cast<long long>(tokens), r.ttft_s, r.decode_ms, r.floor_ms,
                100 * r.hit_rate);
  }
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[0].policy != "dense") break;
    std::printf("%s vs dense: TTFT %.2fx faster, decode %.2fx faster\n", rows[i].policy.c_str(),
                rows[0].ttft_s / rows[i].ttft_s, rows[0].decode_ms / rows[i].decode_ms);
  }

  // Batched decode: B sequences of batch_context tokens, one DecodeBatch per step (dense).
  std::printf("\n| batch | context per sequence | ms per decode step | decode tokens/s | "
              "vs batch 1 |\n|---|---|---|---|---|\n");
  double single_tps = 0;
  for (int64_t batch : {1, 8, 32}) {
    std::vector<std::unique_ptr<CudaSequence>> seqs;
    std::vector<CudaSequence*> ptrs;
    std::vector<int32_t> next(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      auto seq = (*model)->NewSequence(batch_context + decode + 8);
      if (!seq.ok()) {
        std::fprintf(stderr, "batch sequence: %s\n", seq.status().ToString().c_str());
        return 1;
      }
      for (int64_t begin = 0; begin < batch_context; begin += 512) {
        const int64_t len = std::min<int64_t>(512, batch_context - begin);
        std::vector<float>* want = begin + len == batch_context ? &logits_scratch : nullptr;
        if (!(*model)->Forward(seq->get(), absl::MakeConstSpan(prompt).subspan(begin, len),
                               nullptr, want).ok()) {
          return 1;
        }
      }
      next[b] = *(*model)->GreedyToken();
      ptrs.push_back(seq->get());
      seqs.push_back(std::move(*seq));
    }
    const std::vector<CudaAttentionProvider*> dense(static_cast<size_t>(batch), nullptr);
    double seconds = 0;
    int64_t timed = 0;
    for (int64_t step = 0; step < decode; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!(*model)->DecodeBatch(ptrs, next, dense, &logits_scratch).ok()) return 1;
      auto ids = (*model)->GreedyTokens();
      if (!ids.ok()) return 1;
      next = *ids;
      if (step >= 4) {
        seconds += Seconds(t0);
        ++timed;
      }
    }
    const double ms = 1e3 * seconds / std::max<int64_t>(1, timed);
    const double tps = batch / (ms * 1e-3);
    if (batch == 1) single_tps = tps;
    std::printf("| %lld | %lld | %.2f | %.0f | %.2fx |\n", static_cast<long long>(batch),
                static_cast<long long>(batch_context), ms, tps, tps / single_tps);
  }
  return 0;
}

}  // namespace
}  // namespace tokenselect::engine

int main(int argc, char** argv) { return tokenselect::engine::Main(argc, argv); }
