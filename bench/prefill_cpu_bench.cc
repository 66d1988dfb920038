// bench_prefill_cpu: the cost of one prefill chunk (512 tokens) on top of N cached tokens, dense
// attention against TokenSelect, on the CPU engine (docs/fidelity.md has results).
//
// The model is small and random (hidden 512, 8 heads over 2 KV heads, head_dim 64, 2 layers by
// default; dummy weights). Instead of prefilling N tokens (O(N^2) for dense), the request's KV
// cache is filled directly: TokenTable::Append(N), then seeded random keys and values in the
// PagePool rows of those tokens. Then Model::Forward runs one chunk at position N with the
// dense provider and with SelectionAttention (tokenselect, budget n_init + k + n_local), and the
// table is truncated back to N between repetitions. Reported: median ms per chunk, the ratio
// dense / tokenselect per N, and the share of the TokenSelect chunk spent in selection (the
// policy: selection query, key scan, soft vote, top-k).
//
// Napkin math: dense attention of a chunk of c queries over N + c keys is about
// 4 H d (c N + c^2 / 2) FLOPs per layer; TokenSelect's key scan is 2 H d N (the scores) plus the
// attention over the ~n_init + k + n_local + c selected keys. So the dense / tokenselect ratio
// grows about linearly in N until the scan dominates.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model.h"
#include "engine/selection/selection_attention.h"

ABSL_FLAG(std::vector<std::string>, cached, std::vector<std::string>({"8192", "32768", "131072"}),
          "comma-separated numbers of cached tokens N.");
ABSL_FLAG(int64_t, chunk, 512, "prefill chunk size (new tokens per forward call).");
ABSL_FLAG(int64_t, layers, 2, "model layers (cost is linear in it).");
ABSL_FLAG(int64_t, hidden, 512, "hidden size.");
ABSL_FLAG(int64_t, heads, 8, "query heads.");
ABSL_FLAG(int64_t, kv_heads, 2, "KV heads.");
ABSL_FLAG(int64_t, head_dim, 64, "head dim.");
ABSL_FLAG(int64_t, intermediate, 1408, "MLP intermediate size.");
ABSL_FLAG(int64_t, n_init, 128, "TokenSelect budget: sink tokens.");
ABSL_FLAG(int64_t, k, 2048, "TokenSelect budget: picked tokens.");
ABSL_FLAG(int64_t, n_local, 512, "TokenSelect budget: recent tokens.");
ABSL_FLAG(int32_t, reps, 3, "timed repetitions per case (the median is reported).");
ABSL_FLAG(double, max_case_seconds, 15.0,
          "stop repeating a case once its timed runs took this long (at least one run).");
ABSL_FLAG(int32_t, threads, 0, "OpenMP threads (0: the OpenMP default).");
ABSL_FLAG(uint64_t, seed, 7, "seed of the weights, the synthetic K/V and the chunk's tokens.");

namespace tokenselect::bench {
namespace {

// Uniform values in [-1, 1) from xorshift32, fast enough for hundreds of MiB.
void FillRandom(float* x, int64_t n, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    x[i] = static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct CaseResult {
  double ms = 0;            // median chunk time
  double selection_ms = 0;  // median selection time within it (tokenselect)
  int reps = 0;
};

// Times Forward of `chunk` at position n with `provider` (nullptr: dense).
absl::StatusOr<CaseResult> TimeChunk(const engine::Model& model, engine::TokenTable* table,
                                     int64_t n, const std::vector<int32_t>& chunk,
                                     engine::SelectionAttention* selection,
                                     engine::ForwardWorkspace* ws) {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const double budget = absl::GetFlag(FLAGS_max_case_seconds);
  std::vector<double> times, selection_times;
  std::vector<float> logits;
  double spent = 0;
  for (int r = 0; r < reps && (r == 0 || spent < budget); ++r) {
    // Back to N cached tokens (the pages stay; a smaller earlier N is grown again).
    if (table->length() > n) table->Truncate(n);
    if (table->length() < n) RETURN_IF_ERROR(table->Append(n - table->length()).status());
    engine::ForwardRequest request;
    request.tokens = chunk;
    request.table = table;
    request.attention = selection;
    request.logits = engine::LogitsRows::kNone;
    const double before = selection != nullptr ? selection->stats().selection_seconds : 0;
    const common::Stopwatch watch;
    RETURN_IF_ERROR(model.Forward(request, ws, &logits));
    const double seconds = watch.ElapsedSeconds();
    spent += seconds;
    times.push_back(seconds * 1e3);
    if (selection != nullptr) {
      selection_times.push_back((selection->stats().selection_seconds - before) * 1e3);
    }
  }
  CaseResult result;
  result.ms = Median(times);
  if (!selection_times.empty()) result.selection_ms = Median(selection_times);
  result.reps = static_cast<int>(times.size());
  return result;
}

engine::ModelConfig BenchConfig() {
  engine::ModelConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_heads = absl::GetFlag(FLAGS_heads);
  c.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  c.head_dim = absl::GetFlag(FLAGS_head_dim);
  c.vocab_size = 1024;
  c.max_position_embeddings = 1 << 20;
  c.rope.theta = 500000.0;
  c.rope.head_dim = c.head_dim;
  return c;
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  std::vector<int64_t> sizes;
  for (const std::string& s : absl::GetFlag(FLAGS_cached)) {
    int64_t n;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--cached: '", s, "' is not a count"));
    }
    sizes.push_back(n);
  }
  std::sort(sizes.begin(), sizes.end());
  const int64_t chunk_len = absl::GetFlag(FLAGS_chunk);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  engine::ModelConfig config = BenchConfig();
  ASSIGN_OR_RETURN(engine::ModelWeights weights, engine::LoadDummyWeights(config, seed));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model,
                   engine::Model::Create(config, std::move(weights)));
  const int64_t page_size = 16;
  const int64_t max_tokens = sizes.back() + chunk_len;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::PagePool> pool,
                   engine::PagePool::Create(
                       model->KvCacheOptions((max_tokens + page_size - 1) / page_size, page_size)));

  // The synthetic cache: every token of the largest N gets random K/V in every layer; smaller
  // N use a prefix (the table is truncated to N before each timed chunk).
  engine::TokenTable table(pool.get(), "prefill_bench");
  RETURN_IF_ERROR(table.Reserve(max_tokens));
  RETURN_IF_ERROR(table.Append(sizes.back()).status());
  const int64_t stride = pool->slot_stride();
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    // Pages are handed out in ascending order by a fresh pool: the first tokens' slots are
    // one contiguous range.
    const int64_t first = table.Slot(0);
    FillRandom(pool->k(layer) + first * stride, sizes.back() * stride,
               static_cast<uint32_t>(seed + 2 * layer + 1));
    FillRandom(pool->v(layer) + first * stride, sizes.back() * stride,
               static_cast<uint32_t>(seed + 2 * layer + 2));
  }
  for (int64_t i = 1; i < sizes.back(); ++i) {
    if (table.Slot(i) != table.Slot(0) + i) return absl::InternalError("non-contiguous slots");
  }
  std::vector<int32_t> chunk(chunk_len);
  for (int64_t i = 0; i < chunk_len; ++i) chunk[i] = static_cast<int32_t>((i * 7919 + seed) % 1024);

  engine::SelectionOptions options;
  options.policy = engine::SelectionPolicyKind::kTokenSelect;
  options.n_init = absl::GetFlag(FLAGS_n_init);
  options.k = absl::GetFlag(FLAGS_k);
  options.n_local = absl::GetFlag(FLAGS_n_local);
  options.chunk_size = chunk_len;

  std::printf(
      "bench_prefill_cpu: %lld layers (cost is linear in layers; fewer than a real model "
      "to keep the run short), hidden %lld, H %lld, H_kv %lld, d %lld; chunk %lld; "
      "tokenselect budget %lld + %lld + %lld; %d OpenMP threads; median of <= %d reps\n",
      static_cast<long long>(config.num_layers), static_cast<long long>(config.hidden_size),
      static_cast<long long>(config.num_heads), static_cast<long long>(config.num_kv_heads),
      static_cast<long long>(config.head_dim), static_cast<long long>(chunk_len),
      static_cast<long long>(options.n_init), static_cast<long long>(options.k),
      static_cast<long long>(options.n_local), omp_get_max_threads(), absl::GetFlag(FLAGS_reps));
  std::printf("%9s %12s %10s %14s %10s %8s %12s %9s\n", "N", "dense_ms", "dense_GF/s",
              "tokenselect_ms", "select_ms", "select%", "dense/tsel", "reps d/t");
  engine::ForwardWorkspace ws;
  {  // Warm-up: workspace sizing, thread pools, page faults of the chunk's slots.
    ASSIGN_OR_RETURN(std::unique_ptr<engine::SelectionAttention> warm,
                     engine::SelectionAttention::Create(options, config.num_layers));
    RETURN_IF_ERROR(TimeChunk(*model, &table, sizes.front(), chunk, warm.get(), &ws).status());
  }
  std::vector<double> ratios;
  for (int64_t n : sizes) {
    ASSIGN_OR_RETURN(std::unique_ptr<engine::SelectionAttention> selection,
                     engine::SelectionAttention::Create(options, config.num_layers));
    ASSIGN_OR_RETURN(CaseResult ts, TimeChunk(*model, &table, n, chunk, selection.get(), &ws));
    ASSIGN_OR_RETURN(CaseResult dense, TimeChunk(*model, &table, n, chunk, nullptr, &ws));
    const double c = static_cast<double>(chunk_len), nn = static_cast<double>(n);
    const double dense_flops = static_cast<double>(config.num_layers) * 4.0 *
                               static_cast<double>(config.num_heads * config.head_dim) *
                               (c * nn + c * c / 2);
    const double ratio = dense.ms / ts.ms;
    ratios.push_back(ratio);
    std::printf("%9lld %12.1f %10.1f %14.1f %10.2f %7.1f%% %12.2f %5d/%d\n",
                static_cast<long long>(n), dense.ms, dense_flops / (dense.ms * 1e6), ts.ms,
                ts.selection_ms, 100.0 * ts.selection_ms / ts.ms, ratio, dense.reps, ts.reps);
    std::fflush(stdout);
  }
  bool grows = true;
  for (size_t i = 1; i < ratios.size(); ++i) grows = grows && ratios[i] > ratios[i - 1];
  std::printf("dense/tokenselect ratio grows with N: %s\n", grows ? "yes" : "NO");
  std::printf("(dense_GF/s counts attention FLOPs only, 4 H d per visible query-key pair)\n");
  table.Release();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tokenselect::bench

int main(int argc, char** argv) {
  absl::StatusOr<std::vector<std::string>> positional = tokenselect::common::ParseFlags(
      argc, argv, "bench_prefill_cpu: prefill chunk cost, dense vs TokenSelect");
  if (!positional.ok()) {
    std::fprintf(stderr, "%s\n", positional.status().ToString().c_str());
    return 2;
  }
  const absl::Status status = tokenselect::bench::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "bench_prefill_cpu: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
