// Tensor parallelism end to end (engine/parallel/tp_cuda_model.h, docs/parallel.md): a dummy
// Llama-3-8B (real shapes, random bf16 weights N(0, 0.02) generated slab by slab, the
// `--load-format dummy` style of bench_generate_cuda) sharded over 1, 2 and 4 GPUs, at long
// contexts, dense vs TokenSelect:
//   chunk-512 prefill   one 512-token chunk appended to a sequence already holding N tokens
//                       (median of the chunks after the first, which sizes workspaces)
//   decode ms/token     one token per step with greedy choice on the GPU, after 4 warm-up steps
//                       (which capture the CUDA graphs)
// The N-token context is written first by a streaming prefill (sinks + window: its cost does
// not grow with N), so that reaching 1M tokens takes seconds, not the minutes a dense prefill
// would; its keys are the model's own. Contexts that do not fit a rank's free memory (weights +
// KV + 8 GiB of slack) are skipped: 1M tokens of Llama-3-8B KV is 128 GiB, which needs >= 2 H200.
//   bench_tp_cuda [--tp 1,2,4] [--contexts 131072,1048576] [--policies dense,tokenselect]
//                 [--decode 16] [--chunks 3] [--graphs 1] [--prefill_graphs 1] [--theta 0.9]
//                 [--kv_dtype bf16|fp8]
//                 [--invariant_shards 0|1|2|4]  (TP-invariant numerics, docs/parallel.md; the
//                 TP sizes run must divide it)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_config.h"
#include "engine/model/model_presets.h"
#include "engine/parallel/tp_cuda_model.h"
#include "engine/selection/cuda_selection.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::engine {
namespace {

// Tensor parallelism in one process needs eager kernel loading (TpCudaModel::Create checks),
// asked for before the first CUDA call, so before main.
const bool kEagerLoading = [] {
  TpCudaModel::RequestEagerLoading(/*tp_size=*/2);
  return true;
}();

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::atoll(item.c_str()));
  }
  return out;
}

std::vector<std::string> ParseNames(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status SyncAll(TpCudaModel* model) {
  return model->RunOnRanks([](int, CudaModel* shard) {
    const cudaError_t err = cudaStreamSynchronize(shard->stream());
    return err == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(err));
  });
}

// One provider per rank, created and destroyed on the ranks' threads.
class Providers {
 public:
  static absl::StatusOr<std::unique_ptr<Providers>> Create(TpCudaModel* model,
                                                           const SelectionOptions& options,
                                                           int64_t max_tokens) {
    std::unique_ptr<Providers> p(new Providers(model));
    p->owned_.resize(static_cast<size_t>(model->size()));
    RETURN_IF_ERROR(model->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(p->owned_[rank],
                       CudaSelectionAttention::Create(options, shard->config(), max_tokens,
                                                      shard->options().max_chunk, model->size(),
                                                      shard->options().invariant_shards));
      return absl::OkStatus();
    }));
    for (auto& o : p->owned_) p->ptrs_.push_back(o.get());
    return p;
  }
  ~Providers() {
    model_
        ->RunOnRanks([this](int rank, CudaModel*) {
          owned_[rank].reset();
          return absl::OkStatus();
        })
        .IgnoreError();
  }
  absl::Span<CudaAttentionProvider* const> get() const { return ptrs_; }
  CudaSelectionAttention* rank0() const { return owned_[0].get(); }

 private:
  explicit Providers(TpCudaModel* model) : model_(model) {}
  TpCudaModel* model_;
  std::vector<std::unique_ptr<CudaSelectionAttention>> owned_;
  std::vector<CudaAttentionProvider*> ptrs_;
};

struct Row {
  int tp;
  int64_t context;
  std::string policy;
  double chunk_ms, decode_ms, hit_rate;
};

#define BENCH_CHECK(expr)                                                    \
  do {                                                                       \
    const absl::Status bench_st_ = (expr);                                   \
    if (!bench_st_.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, bench_st_.ToString().c_str()); \
      return bench_st_;                                                      \
    }                                                                        \
  } while (0)

// Everything for one TP size; appends its rows.
absl::Status RunTp(int tp, KvCacheDType kv_dtype, int invariant_shards,
                   const std::vector<int64_t>& contexts, const std::vector<std::string>& policies,
                   int64_t decode, int64_t chunks, bool graphs, bool prefill_graphs, double theta,
                   std::vector<Row>* rows) {
  const ModelConfig config = Llama3_8BConfig();
  const int64_t L = config.num_layers, hidden = config.hidden_size;
  const int64_t layer_params = hidden * (config.q_dim() + 2 * config.kv_dim()) +
                               config.q_dim() * hidden + 3 * hidden * config.intermediate_size +
                               2 * hidden;
  const double weights_per_rank =
      2.0 * (L * layer_params / tp + 2 * config.vocab_size * hidden + hidden);
  // K and V of this rank, bf16 or FP8.
  const double kv_per_token =
      2.0 * static_cast<double>(KvCacheElementBytes(kv_dtype)) * L * config.kv_dim() / tp;
  size_t free_bytes = 0, total_bytes = 0;
  cudaSetDevice(0);
  cudaMemGetInfo(&free_bytes, &total_bytes);
  const double slack = 8.0 * (1 << 30);
  const int64_t extra = static_cast<int64_t>(policies.size()) * (chunks * 512 + decode + 16) + 1024;
  const double room = (static_cast<double>(free_bytes) - weights_per_rank - slack) / kv_per_token;
  std::vector<int64_t> fit;
  for (int64_t c : contexts) {
    if (c + extra <= room) {
      fit.push_back(c);
    } else {
      std::printf(
          "TP=%d: context %lld does not fit (%.1f GiB free per GPU, %.1f GB of weights "
          "and %.1f GiB of KV per rank)\n",
          tp, static_cast<long long>(c), free_bytes / double(1 << 30), weights_per_rank / 1e9,
          (c + extra) * kv_per_token / double(1 << 30));
    }
  }
  if (fit.empty()) return absl::OkStatus();
  std::sort(fit.begin(), fit.end());

  TpCudaModelOptions options;
  options.tp_size = tp;
  options.model.max_tokens = fit.back() + extra;
  options.model.max_chunk = 512;
  options.model.max_batch = 8;
  options.model.use_graphs = graphs;
  options.model.graph_prefill_chunks = prefill_graphs;
  options.model.kv_dtype = kv_dtype;
  options.model.invariant_shards = invariant_shards;
  DummyWeightOptions dummy;
  dummy.init = DummyInit::kHuggingFace;
  const auto load_start = std::chrono::steady_clock::now();
  auto model = TpCudaModel::CreateDummy(config, dummy, options);
  BENCH_CHECK(model.status());
  std::printf(
      "TP=%d: %.2f GB of weights and %.2f GiB of KV per GPU (%lld tokens), loaded in "
      "%.1f s\n",
      tp, (*model)->weight_bytes() / 1e9 / tp, (*model)->kv_bytes() / double(1 << 30) / tp,
      static_cast<long long>(options.model.max_tokens), Seconds(load_start));
  std::fflush(stdout);
  TpCudaModel* m = model->get();
  auto seq = m->NewSequence(options.model.max_tokens);
  BENCH_CHECK(seq.status());
  std::vector<int32_t> chunk_ids(512);
  int64_t counter = 0;
  auto next_chunk = [&](int64_t len) {
    chunk_ids.resize(static_cast<size_t>(len));
    for (auto& id : chunk_ids) id = static_cast<int32_t>(3 + (counter++ * 7919) % 128000);
    return absl::MakeConstSpan(chunk_ids);
  };

  SelectionOptions fill_sel;
  fill_sel.policy = SelectionPolicyKind::kStreaming;
  fill_sel.chunk_size = 512;
  auto fill = Providers::Create(m, fill_sel, options.model.max_tokens);
  BENCH_CHECK(fill.status());
  for (int64_t context : fit) {
    const int64_t from = (*seq)->length();
    const auto fill_start = std::chrono::steady_clock::now();
    while ((*seq)->length() < context) {
      const int64_t len = std::min<int64_t>(512, context - (*seq)->length());
      BENCH_CHECK(m->Forward(seq->get(), next_chunk(len), (*fill)->get(), nullptr));
    }
    BENCH_CHECK(SyncAll(m));
    const double fill_s = Seconds(fill_start);
    std::printf("TP=%d: streaming prefill %lld -> %lld tokens in %.1f s (%.0f tokens/s)\n", tp,
                static_cast<long long>(from), static_cast<long long>(context), fill_s,
                (context - from) / fill_s);
    std::fflush(stdout);
    for (const std::string& name : policies) {
      SelectionOptions sel;
      sel.policy = *ParsePolicy(name);
      sel.chunk_size = 512;
      sel.theta = theta;
      auto providers = Providers::Create(m, sel, options.model.max_tokens);
      BENCH_CHECK(providers.status());
      std::vector<double> chunk_ms;
      for (int64_t c = 0; c < chunks; ++c) {
        BENCH_CHECK(SyncAll(m));
        const auto t0 = std::chrono::steady_clock::now();
        BENCH_CHECK(m->Forward(seq->get(), next_chunk(512), (*providers)->get(), nullptr));
        BENCH_CHECK(SyncAll(m));
        if (c > 0 || chunks == 1) chunk_ms.push_back(1e3 * Seconds(t0));
      }
      std::vector<float> logits;
      BENCH_CHECK(m->Forward(seq->get(), next_chunk(1), (*providers)->get(), &logits));
      auto first = m->GreedyToken();
      BENCH_CHECK(first.status());
      int32_t token = *first;
      double decode_s = 0;
      int64_t timed = 0;
      for (int64_t step = 0; step < decode + 4; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        BENCH_CHECK(
            m->Forward(seq->get(), absl::MakeConstSpan(&token, 1), (*providers)->get(), &logits));
        auto next = m->GreedyToken();
        BENCH_CHECK(next.status());
        token = *next;
        if (step >= 4) {
          decode_s += Seconds(t0);
          ++timed;
        }
      }
      double hit_rate = 0;
      absl::StatusOr<SelectionCacheCounters> counters;
      BENCH_CHECK(m->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
        if (rank == 0) counters = (*providers)->rank0()->CacheCounters(shard->stream());
        return absl::OkStatus();
      }));
      if (counters.ok() && counters->lookups() > 0) {
        hit_rate = double(counters->hits) / counters->lookups();
      }
      rows->push_back({tp, context, name, Median(chunk_ms),
                       1e3 * decode_s / std::max<int64_t>(1, timed), hit_rate});
      // Rank 0's whole-step graphs so far (the streaming fill's included): which path the timed
      // chunks and steps took.
      const CudaModel::StepGraphCounts graph_counts = m->shard(0)->step_graph_counts();
      std::printf(
          "TP=%d %s at %lld: chunk-512 prefill %.2f ms, decode %.2f ms/token, cache hit "
          "rate %.1f%% (whole-chunk graphs %lld captured, %lld updated, %lld replayed; decode "
          "graphs %lld captured, %lld replayed)\n",
          tp, name.c_str(), static_cast<long long>(context), rows->back().chunk_ms,
          rows->back().decode_ms, 100 * hit_rate,
          static_cast<long long>(graph_counts.chunk_captures),
          static_cast<long long>(graph_counts.chunk_updates),
          static_cast<long long>(graph_counts.chunk_replays),
          static_cast<long long>(graph_counts.captures),
          static_cast<long long>(graph_counts.replays));
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::string tp_list = "1,2,4", context_list = "131072,1048576", policy_list = "dense,tokenselect";
  int64_t decode = 16, chunks = 3;
  bool graphs = true, prefill_graphs = true;
  double theta = 0.9;
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  int invariant_shards = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--invariant_shards") invariant_shards = std::atoi(argv[i + 1]);
    if (flag == "--tp") tp_list = argv[i + 1];
    if (flag == "--contexts") context_list = argv[i + 1];
    if (flag == "--policies") policy_list = argv[i + 1];
    if (flag == "--decode") decode = std::atoll(argv[i + 1]);
    if (flag == "--chunks") chunks = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    if (flag == "--graphs") graphs = std::atoi(argv[i + 1]) != 0;
    if (flag == "--prefill_graphs") prefill_graphs = std::atoi(argv[i + 1]) != 0;
    if (flag == "--theta") theta = std::atof(argv[i + 1]);
    if (flag == "--kv_dtype") {
      auto parsed = ParseKvCacheDType(argv[i + 1]);
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
        return 2;
      }
      kv_dtype = *parsed;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf(
      "devices: %d x %s; decode steps %lld, graphs %s (prefill chunks %s), theta %.2f, KV cache "
      "%s, TP-invariant shards %d\n",
      devices, prop.name, static_cast<long long>(decode), graphs ? "on" : "off",
      graphs && prefill_graphs ? "on" : "off", theta,
      KvCacheDTypeName(kv_dtype), invariant_shards);
  const std::vector<std::string> policies = ParseNames(policy_list);
  std::vector<Row> rows;
  bool failed = false;
  for (int64_t tp : ParseList(tp_list)) {
    if (tp > devices) {
      std::printf("TP=%lld: skipped (%d GPUs)\n", static_cast<long long>(tp), devices);
      continue;
    }
    const absl::Status st =
        RunTp(static_cast<int>(tp), kv_dtype, invariant_shards, ParseList(context_list), policies,
              decode, chunks, graphs, prefill_graphs, theta, &rows);
    if (!st.ok()) {
      std::printf("TP=%lld failed: %s\n", static_cast<long long>(tp), st.ToString().c_str());
      failed = true;
    }
  }
  std::map<std::tuple<int64_t, std::string>, const Row*> one_gpu;
  for (const Row& r : rows) {
    if (r.tp == 1) one_gpu[{r.context, r.policy}] = &r;
  }
  std::printf(
      "\n| TP | context | policy | chunk-512 prefill ms | decode ms/token | decode vs TP=1 "
      "| prefill vs TP=1 | cache hit rate |\n|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    auto base = one_gpu.find({r.context, r.policy});
    char vs_decode[32] = "-", vs_chunk[32] = "-";
    if (base != one_gpu.end()) {
      std::snprintf(vs_decode, sizeof(vs_decode), "%.2fx", base->second->decode_ms / r.decode_ms);
      std::snprintf(vs_chunk, sizeof(vs_chunk), "%.2fx", base->second->chunk_ms / r.chunk_ms);
    }
    std::printf("| %d | %lld | %s | %.2f | %.2f | %s | %s | %.1f%% |\n", r.tp,
                static_cast<long long>(r.context), r.policy.c_str(), r.chunk_ms, r.decode_ms,
                vs_decode, vs_chunk, 100 * r.hit_rate);
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace tokenselect::engine

int main(int argc, char** argv) { return tokenselect::engine::Main(argc, argv); }
