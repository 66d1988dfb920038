// Coarse-to-fine selection on the GPU against the exact soft vote (kernels/cuda/span_scoring.h),
// Llama-3-8B attention shape (H = 32, H_kv = 8, d = 128, bf16 keys), one layer, batch 1,
// budget (n_init 128, k 2048, n_local 512), span token budget 4 k = 8192:
//   exact    ScoreKeys + VoteFromLogits + TopK over all N - 640 candidates (selection.h)
//   span     SpanSelect: span scores from the index vectors, greedy span choice, the exact soft
//            vote over the kept tokens only
//   quest    QuestSelect over prebuilt page bounds (QuestBuildPageBounds timed on its own)
//   infllm   InfLlmSelect over prebuilt representatives (InfLlmRepresentatives timed on its own)
// at N = 128K and 1M cached tokens, for three key sets over the same span index:
//   spans    20 random spans of the index have their keys shifted towards the query (so the
//            exact top-k is concentrated in a few spans, the case the span index is built for)
//   needles  1500 single tokens at random positions shifted the same way (relevant tokens that
//            the index vectors mostly do not represent: the span index's bad case)
//   random   no planted structure
// The span index: contiguous spans of 64..512 tokens covering [0, N), index-vector counts from
// the r_v rule (1 + round(7 exp(-3 (1 - r_a))), r_a ~ U(0.4, 1): 2..8), index tokens at random
// inside the span.
//
// Checks first (each path against a host replay of its rule on the downloaded scores, span
// scores against a double recomputation on a sample), then times: CUDA events, median of reps,
// L2 flushed (a 256 MB memset) before every rep, so that each selection starts cold as it would
// after the other 31 layers; "graph" replays one call as a CUDA graph (no host launch gaps),
// "stream" launches it directly. Key bytes are counted exactly: rows of H_kv * d * 2 = 2048 B
// read by each path (for span: the scored spans' index vectors plus the max_kept rows of the
// soft vote, padding included). GB/s are key bytes / time, against a device-to-device copy
// (read + write bytes) measured in the same run.
//   bench_span_cuda [--quick] [--tiny] [--reps R]   --quick: N = 128K only; --tiny: an index of
//                   1..5-token spans with 1 or 2 index vectors (a random-weight model's)
//   bench_span_cuda --detect    the prefill side instead: one chunk's map and span detection
//   bench_span_cuda --profile   N = 1M, SpanSelect calls only (for a profiler)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/span_detection.h"
#include "kernels/cuda/span_scoring.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;

constexpr int64_t kHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kDim = 128;
constexpr int64_t kRow = kKvHeads * kDim;
constexpr double kRowBytes = kRow * 2.0;
constexpr int64_t kInit = 128;
constexpr int64_t kK = 2048;
constexpr int64_t kLocal = 512;
constexpr int64_t kBudget = 4 * kK;
int kReps = 30;  // --reps
// --tiny: spans of 1..5 tokens with 1 or 2 index vectors each (what the detection finds on
// random-weight models: ~44K spans and ~68K index vectors per layer at 128K in
// bench_generate_cuda), instead of 64..512 tokens with 2..8.
bool g_tiny = false;

cudaStream_t g_stream;
DeviceBuffer<char>* g_flush = nullptr;

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Standard normal keys (Box-Muller on a hash of the index).
__global__ void FillNormalBf16(__nv_bfloat16* out, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t a = Hash(2 * static_cast<uint64_t>(i) + (static_cast<uint64_t>(seed) << 40));
    const uint32_t b = Hash(2 * static_cast<uint64_t>(i) + 1 + (static_cast<uint64_t>(seed) << 40));
    const float u1 = (static_cast<float>(a >> 8) + 1.0f) * (1.0f / 16777217.0f);
    const float u2 = static_cast<float>(b >> 8) * (1.0f / 16777216.0f);
    out[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

// keys[slot(token)] += alpha * dir, one block per planted token.
__global__ void PlantKernel(__nv_bfloat16* keys, const int32_t* slots, const int32_t* tokens,
                            const float* alpha, const float* dir) {
  const int64_t row = static_cast<int64_t>(slots[tokens[blockIdx.x]]) * kRow;
  for (int i = threadIdx.x; i < kRow; i += blockDim.x) {
    keys[row + i] = __float2bfloat16_rn(__bfloat162float(keys[row + i]) + alpha[blockIdx.x] * dir[i]);
  }
}

// Median ms of `reps` runs of fn, each after an L2 flush; with `graph`, fn is captured once and
// replayed. Either way fn runs once first (lazy initialisation in launchers, outside capture).
double ColdMedianMs(const std::function<void()>& fn, bool graph, int reps = -1) {
  if (reps < 0) reps = kReps;
  const bench::TimingOptions cold = {reps, /*warmup=*/0, /*sync_each=*/false, g_flush};
  const auto call = [&](int) { fn(); };
  if (graph) return bench::GraphMedianMs(g_stream, call, /*inner=*/1, cold);
  fn();
  TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  return bench::MedianMs(g_stream, call, cold);
}

struct HostIndex {
  std::vector<int32_t> begin, end, indptr{0}, tokens;
  int64_t num_spans() const { return static_cast<int64_t>(begin.size()); }
};

HostIndex MakeIndex(int64_t n, std::mt19937& rng) {
  HostIndex ix;
  std::uniform_int_distribution<int64_t> len(g_tiny ? 1 : 64, g_tiny ? 5 : 512);
  std::uniform_real_distribution<double> ra(0.4, 1.0);
  for (int64_t t = 0; t < n;) {
    const int64_t e = std::min(n, t + len(rng));
    const int64_t count =
        std::min<int64_t>(e - t, g_tiny ? 1 + static_cast<int64_t>(rng() % 2)
                                        : 1 + std::llround(7.0 * std::exp(-3.0 * (1.0 - ra(rng)))));
    std::set<int32_t> picked;
    std::uniform_int_distribution<int64_t> at(t, e - 1);
    while (static_cast<int64_t>(picked.size()) < count) picked.insert(static_cast<int32_t>(at(rng)));
    ix.begin.push_back(static_cast<int32_t>(t));
    ix.end.push_back(static_cast<int32_t>(e));
    ix.tokens.insert(ix.tokens.end(), picked.begin(), picked.end());
    ix.indptr.push_back(static_cast<int32_t>(ix.tokens.size()));
    t = e;
  }
  return ix;
}

// Host top-k by (score desc, index asc), ascending indices.
std::vector<int32_t> HostTopK(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int64_t>(k, static_cast<int64_t>(s.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return s[a] != s[b] ? s[a] > s[b] : a < b;
  });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> Picks(const std::vector<int32_t>& tokens, int64_t n) {
  std::vector<int32_t> out;
  for (int32_t t : tokens) {
    if (t >= kInit && t < n - kLocal) out.push_back(t);
  }
  return out;
}

double Recall(const std::vector<int32_t>& picks, const std::vector<int32_t>& exact) {
  std::vector<int32_t> both;
  std::set_intersection(picks.begin(), picks.end(), exact.begin(), exact.end(),
                        std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(exact.size());
}

std::vector<int32_t> DownloadSelected(const DeviceBuffer<int32_t>& tokens,
                                      const DeviceBuffer<int32_t>& count) {
  std::vector<int32_t> all = tokens.Download();
  all.resize(static_cast<size_t>(count.Download()[0]));
  return all;
}

struct Row {
  int64_t n;
  std::string key_set;
  std::string method;
  double graph_ms;
  double stream_ms;
  double key_bytes;
  double recall;  // < 0: not applicable
};

bool g_ok = true;
void Check(bool ok, const std::string& what) {
  std::printf("check %-60s %s\n", what.c_str(), ok ? "OK" : "FAILED");
  g_ok = g_ok && ok;
}

void RunSize(int64_t n, double copy_gbps, bool profile, std::vector<Row>* rows) {
  std::mt19937 rng(static_cast<uint32_t>(n));
  const int64_t cands = n - kInit - kLocal;
  const std::vector<int32_t> slots = bench::PagedSlots(n, 0, &rng);
  const HostIndex ix = MakeIndex(n, rng);
  const int64_t num_spans = ix.num_spans();
  std::printf("\nN = %lld: %lld spans, %lld index vectors (%.2f per span, %.1f tokens per span)\n",
              static_cast<long long>(n), static_cast<long long>(num_spans),
              static_cast<long long>(ix.tokens.size()),
              static_cast<double>(ix.tokens.size()) / num_spans,
              static_cast<double>(n) / num_spans);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> query(kHeads * kDim);
  for (float& x : query) x = normal(rng) * 3.0f / std::sqrt(static_cast<float>(kDim));
  std::vector<float> dir(kRow);
  const int64_t g = kHeads / kKvHeads;
  for (int64_t kv = 0; kv < kKvHeads; ++kv) {
    double norm = 0;
    for (int64_t e = 0; e < kDim; ++e) {
      float s = 0;
      for (int64_t gi = 0; gi < g; ++gi) s += query[(kv * g + gi) * kDim + e];
      dir[kv * kDim + e] = s;
      norm += static_cast<double>(s) * s;
    }
    for (int64_t e = 0; e < kDim; ++e) dir[kv * kDim + e] /= static_cast<float>(std::sqrt(norm));
  }

  DeviceBuffer<__nv_bfloat16> keys(static_cast<size_t>(n * kRow));
  DeviceBuffer<int32_t> d_slots(slots);
  DeviceBuffer<float> d_query(query), d_dir(dir);
  DeviceBuffer<int32_t> d_begin(ix.begin), d_end(ix.end), d_indptr(ix.indptr), d_vec(ix.tokens);

  SelectionProblem pr;
  pr.query = d_query.get();
  pr.k_cache = keys.get();
  pr.slots = d_slots.get();
  pr.num_tokens = n;
  pr.num_heads = kHeads;
  pr.num_kv_heads = kKvHeads;
  pr.head_dim = kDim;
  pr.n_init = kInit;
  pr.k = kK;
  pr.n_local = kLocal;
  const int64_t cap = SelectionCapacity(pr);

  // The exact soft vote over the candidates [kInit, n - kLocal).
  bench::ExactSelection sel(cands, kK, kHeads, kKvHeads, kDim);
  sel.score.query = d_query.get();
  sel.score.k_cache = keys.get();
  sel.score.slots = d_slots.get() + kInit;
  auto exact = [&] { TS_CUDA_CHECK(sel.Run(g_stream)); };

  // Span select buffers.
  const int64_t max_kept = SpanMaxKept(ix.begin.data(), ix.end.data(), ix.indptr.data(),
                                       num_spans, n, n, kInit, kLocal, kBudget);
  DeviceBuffer<int32_t> span_tokens(static_cast<size_t>(cap)), span_count(1);
  DeviceBuffer<float> span_scores(static_cast<size_t>(num_spans));
  DeviceBuffer<int32_t> kept(static_cast<size_t>(max_kept)), num_kept(1);
  DeviceBuffer<float> kept_votes(static_cast<size_t>(max_kept));
  const int64_t num_vectors = static_cast<int64_t>(ix.tokens.size());
  DeviceBuffer<char> span_ws(
      SpanSelectWorkspaceBytes(num_spans, num_vectors, max_kept, kHeads, kK));
  span_ws.Zero();
  SpanSelectParams ss;
  ss.out.tokens = span_tokens.get();
  ss.out.num_selected = span_count.get();
  ss.span_scores = span_scores.get();
  ss.kept_tokens = kept.get();
  ss.kept_votes = kept_votes.get();
  ss.num_kept = num_kept.get();
  ss.problem = pr;
  ss.index.span_begin = d_begin.get();
  ss.index.span_end = d_end.get();
  ss.index.vector_indptr = d_indptr.get();
  ss.index.vector_tokens = d_vec.get();
  ss.index.num_spans = num_spans;
  ss.index.num_vectors = num_vectors;
  ss.index.covered_end = n;
  ss.token_budget = kBudget;
  ss.max_kept = max_kept;
  ss.workspace = span_ws.get();
  auto span = [&] { TS_CUDA_CHECK(SpanSelect(ss, g_stream)); };
  // Index vectors of the scored spans (every span meeting the candidates; none is stale here).
  int64_t scored_vectors = 0;
  for (int64_t i = 0; i < num_spans; ++i) {
    if (std::max<int64_t>(ix.begin[i], kInit) < std::min<int64_t>(ix.end[i], n - kLocal)) {
      scored_vectors += ix.indptr[i + 1] - ix.indptr[i];
    }
  }
  const double span_bytes = (scored_vectors + max_kept) * kRowBytes;

  // Quest and InfLLM buffers.
  const int64_t pages = QuestNumPages(pr, 16);
  DeviceBuffer<__nv_bfloat16> bounds(static_cast<size_t>(pages * 2 * kRow));
  DeviceBuffer<int32_t> quest_tokens(static_cast<size_t>(cap)), quest_count(1);
  DeviceBuffer<float> page_scores(static_cast<size_t>(pages));
  DeviceBuffer<char> quest_ws(QuestSelectWorkspaceBytes(pages, kK, 16));
  QuestBoundsParams qb;
  qb.page_bounds = bounds.get();
  qb.problem = pr;
  qb.page_size = 16;
  QuestSelectParams qs;
  qs.out.tokens = quest_tokens.get();
  qs.out.num_selected = quest_count.get();
  qs.page_scores = page_scores.get();
  qs.page_bounds = bounds.get();
  qs.problem = pr;
  qs.page_size = 16;
  qs.workspace = quest_ws.get();
  const int64_t blocks = InfLlmNumBlocks(pr, 128);
  std::vector<float> received(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(0.0f, 2.0f);
  for (float& x : received) x = u(rng);
  DeviceBuffer<float> d_received(received);
  DeviceBuffer<int32_t> reps(static_cast<size_t>(blocks * 4));
  DeviceBuffer<int32_t> infllm_tokens(static_cast<size_t>(cap)), infllm_count(1);
  DeviceBuffer<float> block_scores(static_cast<size_t>(blocks));
  DeviceBuffer<char> infllm_ws(InfLlmSelectWorkspaceBytes(blocks, kK, 128));
  InfLlmRepsParams rp;
  rp.rep_slots = reps.get();
  rp.received = d_received.get();
  rp.received_size = n;
  rp.problem = pr;
  rp.block_size = 128;
  rp.reps = 4;
  InfLlmSelectParams is;
  is.out.tokens = infllm_tokens.get();
  is.out.num_selected = infllm_count.get();
  is.block_scores = block_scores.get();
  is.rep_slots = reps.get();
  is.problem = pr;
  is.block_size = 128;
  is.reps = 4;
  is.workspace = infllm_ws.get();
  int64_t rep_rows = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    rep_rows += std::min<int64_t>(4, std::min<int64_t>(n - kLocal, kInit + (b + 1) * 128) -
                                         (kInit + b * 128));
  }

  for (const std::string key_set : {"spans", "needles", "random"}) {
    // Keys.
    FillNormalBf16<<<4096, 256, 0, g_stream>>>(keys.get(), n * kRow, 7);
    TS_CUDA_CHECK(cudaGetLastError());
    std::vector<int32_t> hot;
    std::vector<float> alpha;
    std::uniform_real_distribution<float> strength(2.5f, 5.0f), jitter(0.8f, 1.2f);
    if (key_set == "spans") {
      std::uniform_int_distribution<int64_t> pick(0, num_spans - 1);
      std::set<int64_t> chosen;
      while (chosen.size() < 20) {
        const int64_t i = pick(rng);
        if (ix.begin[i] >= kInit && ix.end[i] <= n - kLocal) chosen.insert(i);
      }
      for (int64_t i : chosen) {
        const float a = strength(rng);
        for (int32_t t = ix.begin[i]; t < ix.end[i]; ++t) {
          hot.push_back(t);
          alpha.push_back(a * jitter(rng));
        }
      }
    } else if (key_set == "needles") {
      std::uniform_int_distribution<int64_t> at(kInit, n - kLocal - 1);
      std::set<int32_t> needles;
      while (needles.size() < 1500) needles.insert(static_cast<int32_t>(at(rng)));
      for (int32_t t : needles) {
        hot.push_back(t);
        alpha.push_back(strength(rng));
      }
    }
    if (!hot.empty()) {
      DeviceBuffer<int32_t> d_hot(hot);
      DeviceBuffer<float> d_alpha(alpha);
      PlantKernel<<<static_cast<int>(hot.size()), 256, 0, g_stream>>>(
          keys.get(), d_slots.get(), d_hot.get(), d_alpha.get(), d_dir.get());
      TS_CUDA_CHECK(cudaGetLastError());
      TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    }
    TS_CUDA_CHECK(QuestBuildPageBounds(qb, g_stream));
    TS_CUDA_CHECK(InfLlmRepresentatives(rp, g_stream));
    if (profile) {  // SpanSelect alone, for a kernel-level profile (nsys)
      for (int i = 0; i < 100; ++i) span();
      TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
      std::printf("profile: 100 SpanSelect calls at N = %lld done\n", static_cast<long long>(n));
      return;
    }

    // Checks.
    exact();
    span();
    TS_CUDA_CHECK(QuestSelect(qs, g_stream));
    TS_CUDA_CHECK(InfLlmSelect(is, g_stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    const std::string tag = "N=" + std::to_string(n) + " " + key_set + ": ";
    std::vector<int32_t> exact_picks = sel.top.Download();
    Check(exact_picks == HostTopK(sel.vote.Download(), kK),
          tag + "exact top-k = host top-k of votes");
    for (int32_t& t : exact_picks) t += static_cast<int32_t>(kInit);

    const std::vector<float> scores = span_scores.Download();
    std::vector<int64_t> order;
    for (int64_t i = 0; i < num_spans; ++i) {
      if (!std::isnan(scores[i])) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
    std::vector<char> keep(static_cast<size_t>(cands), 0);
    int64_t used = 0;
    for (int64_t i : order) {
      const int64_t b = std::max<int64_t>(ix.begin[i], kInit);
      const int64_t e = std::min<int64_t>(ix.end[i], n - kLocal);
      if (used + (e - b) > kBudget) continue;
      used += e - b;
      for (int64_t t = b; t < e; ++t) keep[t - kInit] = 1;
    }
    std::vector<int32_t> host_kept;
    for (int64_t i = 0; i < cands; ++i) {
      if (keep[i]) host_kept.push_back(static_cast<int32_t>(kInit + i));
    }
    const int32_t m = num_kept.Download()[0];
    std::vector<int32_t> gpu_kept = kept.Download();
    gpu_kept.resize(static_cast<size_t>(std::max(m, 0)));
    Check(gpu_kept == host_kept, tag + "span kept list = host greedy on span scores");
    std::vector<float> kv = kept_votes.Download();
    kv.resize(static_cast<size_t>(std::max(m, 0)));
    std::vector<int32_t> want;
    for (int32_t w : HostTopK(kv, kK)) want.push_back(host_kept[w]);
    const std::vector<int32_t> span_picks = Picks(DownloadSelected(span_tokens, span_count), n);
    Check(span_picks == want, tag + "span picks = host top-k of kept votes");
    // A sample of span scores against double, from downloaded key rows.
    double worst = 0.0;
    for (int64_t s = 0; s < 32; ++s) {
      const int64_t i = order[static_cast<size_t>(s * 7919) % order.size()];
      std::vector<std::vector<float>> rows;
      for (int32_t j = ix.indptr[i]; j < ix.indptr[i + 1]; ++j) {
        std::vector<uint16_t> bits(kRow);
        TS_CUDA_CHECK(cudaMemcpy(bits.data(), keys.get() + static_cast<int64_t>(slots[ix.tokens[j]]) * kRow,
                                 kRow * 2, cudaMemcpyDeviceToHost));
        std::vector<float> r(kRow);
        for (int64_t e = 0; e < kRow; ++e) r[e] = gpu_test::Bf16BitsToFloat(bits[e]);
        rows.push_back(r);
      }
      double total = 0.0;
      for (int64_t h = 0; h < kHeads; ++h) {
        double best = -INFINITY;
        for (const auto& r : rows) {
          double dot = 0;
          for (int64_t e = 0; e < kDim; ++e) dot += static_cast<double>(query[h * kDim + e]) * r[(h / g) * kDim + e];
          best = std::max(best, dot);
        }
        total += best;
      }
      worst = std::max(worst, std::fabs(total - scores[i]) / (1.0 + std::fabs(total)));
    }
    Check(worst < 1e-4, tag + "span scores = double on 32 spans (rel " + std::to_string(worst) + ")");

    const std::vector<float> ps = page_scores.Download();
    const int64_t full = cands / 16;
    std::vector<float> full_scores(ps.begin(), ps.begin() + full);
    std::vector<int32_t> quest_want;
    for (int32_t p : HostTopK(full_scores, kK / 16)) {
      for (int64_t t = 0; t < 16; ++t) quest_want.push_back(static_cast<int32_t>(kInit + p * 16 + t));
    }
    const std::vector<int32_t> quest_picks = Picks(DownloadSelected(quest_tokens, quest_count), n);
    Check(quest_picks == quest_want, tag + "quest picks = host top pages of page scores");
    std::vector<int32_t> infllm_want;
    for (int32_t b : HostTopK(block_scores.Download(), kK / 128)) {
      for (int64_t t = 0; t < 128; ++t) infllm_want.push_back(static_cast<int32_t>(kInit + b * 128 + t));
    }
    const std::vector<int32_t> infllm_picks = Picks(DownloadSelected(infllm_tokens, infllm_count), n);
    Check(infllm_picks == infllm_want, tag + "infllm picks = host top blocks of block scores");
    std::printf("  %s: kept m = %d of max_kept %lld; recall vs exact: span %.4f, quest %.4f, "
                "infllm %.4f\n",
                key_set.c_str(), m, static_cast<long long>(max_kept),
                Recall(span_picks, exact_picks), Recall(quest_picks, exact_picks),
                Recall(infllm_picks, exact_picks));

    // Timings.
    auto add = [&](const std::string& method, const std::function<void()>& fn, double bytes,
                   double recall) {
      const double graph_ms = ColdMedianMs(fn, true);
      const double stream_ms = ColdMedianMs(fn, false);
      rows->push_back({n, key_set, method, graph_ms, stream_ms, bytes, recall});
      std::printf("  %-8s %-34s graph %8.4f ms  stream %8.4f ms  keys %9.2f MB  %7.1f GB/s (%5.1f%% "
                  "of copy)\n",
                  key_set.c_str(), method.c_str(), graph_ms, stream_ms, bytes / 1e6,
                  bytes / graph_ms / 1e6, 100.0 * bytes / graph_ms / 1e6 / copy_gbps);
    };
    add("exact soft vote (score+vote+top-k)", exact, cands * kRowBytes, 1.0);
    add("tokenselect_span (SpanSelect)", span, span_bytes, Recall(span_picks, exact_picks));
    if (key_set == "spans") {
      // Where the span path's time goes: the same call without the soft vote (max_kept 0), and
      // also without the greedy walk (token budget 0); the soft vote alone over 8192 rows.
      SpanSelectParams no_vote = ss;
      no_vote.max_kept = 0;
      DeviceBuffer<char> ws_a(SpanSelectWorkspaceBytes(num_spans, num_vectors, 0, kHeads, kK));
      ws_a.Zero();
      no_vote.workspace = ws_a.get();
      add("  span part: scores+sort+choose", [&] { TS_CUDA_CHECK(SpanSelect(no_vote, g_stream)); },
          scored_vectors * kRowBytes, -1.0);
      SpanSelectParams no_walk = no_vote;
      no_walk.token_budget = 0;
      add("  span part: scores+sort", [&] { TS_CUDA_CHECK(SpanSelect(no_walk, g_stream)); },
          scored_vectors * kRowBytes, -1.0);
      KeyScoreParams sp8 = sel.score;
      sp8.n = kBudget;
      VoteParams vp8 = sel.soft_vote;
      vp8.n = kBudget;
      TopKParams tp8 = sel.top_k;
      tp8.n = kBudget;
      add("  soft vote alone over 8192 rows", [&] {
            TS_CUDA_CHECK(ScoreKeys(sp8, g_stream));
            TS_CUDA_CHECK(VoteFromLogits(vp8, g_stream));
            TS_CUDA_CHECK(TopK(tp8, g_stream));
          }, kBudget * kRowBytes, -1.0);
    }
    if (key_set == "spans") {  // the baselines do not depend on the planted structure's kind
      add("quest select (16-token pages)", [&] { TS_CUDA_CHECK(QuestSelect(qs, g_stream)); },
          pages * 2 * kRowBytes, Recall(quest_picks, exact_picks));
      add("quest page bounds build", [&] { TS_CUDA_CHECK(QuestBuildPageBounds(qb, g_stream)); },
          cands * kRowBytes, -1.0);
      add("infllm select (128-blocks, 4 reps)", [&] { TS_CUDA_CHECK(InfLlmSelect(is, g_stream)); },
          rep_rows * kRowBytes, Recall(infllm_picks, exact_picks));
      add("infllm representatives build",
          [&] { TS_CUDA_CHECK(InfLlmRepresentatives(rp, g_stream)); }, 0.0, -1.0);
    }
  }
}

// The span index's prefill work for one chunk and layer of the Llama-3-8B shape: the chunk's
// attention map (ChunkAttentionMap) and the span detection on it (DetectChunkSpans), for c =
// 512 new tokens after 4096 cached ones, queries and keys standard normal bf16 (attention about
// as flat as a random-weight model's). Prints the spans found and both times.
void RunDetection() {
  const int64_t c = 512, first = 4096, n = first + c;
  std::mt19937 rng(3);
  const std::vector<int32_t> slots = bench::PagedSlots(n, 0, &rng);
  DeviceBuffer<__nv_bfloat16> keys(static_cast<size_t>(n * kRow)), q(c * kHeads * kDim);
  FillNormalBf16<<<1024, 256, 0, g_stream>>>(keys.get(), n * kRow, 11);
  FillNormalBf16<<<1024, 256, 0, g_stream>>>(q.get(), c * kHeads * kDim, 12);
  DeviceBuffer<int32_t> d_slots(slots);
  RopeParams rope;
  rope.head_dim = kDim;
  DeviceBuffer<float> inv_freq(RopeInverseFrequencies(rope));
  DeviceBuffer<float> received(c), map(c * c);
  DeviceBuffer<char> rws(ChunkAttentionMapWorkspaceBytes(c, kHeads));
  ReceivedAttentionParams rp;
  rp.received = received.get();
  rp.workspace = rws.get();
  rp.q = q.get();
  rp.q_row_stride = kHeads * kDim;
  rp.k_cache = keys.get();
  rp.slots = d_slots.get() + first;
  rp.first_position = first;
  rp.num_new = c;
  rp.num_heads = kHeads;
  rp.num_kv_heads = kKvHeads;
  rp.head_dim = kDim;
  rp.inv_freq = inv_freq.get();
  rp.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const int64_t max_spans = SpanDetectMaxSpans(c), max_tokens = SpanDetectMaxTokens(c, 8);
  DeviceBuffer<int32_t> counts(2), sx(max_spans), sy(max_spans), gap(max_spans),
      indptr(max_spans + 1), tokens(max_tokens);
  DeviceBuffer<double> score(max_spans);
  DeviceBuffer<char> dws(SpanDetectWorkspaceBytes(c));
  SpanDetectParams dp;
  dp.out = {counts.get(), sx.get(), sy.get(), gap.get(), indptr.get(), score.get(), tokens.get()};
  dp.map = map.get();
  dp.c = c;
  dp.workspace = dws.get();
  auto run_map = [&] { TS_CUDA_CHECK(ChunkAttentionMap(rp, map.get(), g_stream)); };
  auto run_detect = [&] { TS_CUDA_CHECK(DetectChunkSpans(dp, g_stream)); };
  const double map_ms = ColdMedianMs(run_map, true);
  const double detect_ms = ColdMedianMs(run_detect, true);
  TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  const std::vector<int32_t> count = counts.Download();
  std::printf(
      "\nspan index, one chunk of %lld tokens and one layer (32 heads, d = 128): map %.4f "
      "ms, detection %.4f ms; %d spans, %d index tokens\n",
      static_cast<long long>(c), map_ms, detect_ms, count[0], count[1]);
}

int Main(int argc, char** argv) {
  // --quick: N = 128K only; --profile: N = 1M, 100 SpanSelect calls and nothing else; --tiny:
  // tiny spans (g_tiny); --detect: the prefill detection only (RunDetection); --reps R.
  bool quick = false, profile = false, detect = false;
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    profile |= std::strcmp(argv[i], "--profile") == 0;
    detect |= std::strcmp(argv[i], "--detect") == 0;
    g_tiny |= std::strcmp(argv[i], "--tiny") == 0;
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) kReps = std::atoi(argv[++i]);
  }
  TS_CUDA_CHECK(cudaStreamCreate(&g_stream));
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  DeviceBuffer<char> flush(256u << 20);
  g_flush = &flush;
  double copy_gbps = 0.0;
  {
    const size_t bytes = size_t{1} << 30;
    DeviceBuffer<char> a(bytes), b(bytes);
    a.Zero();
    const double ms = bench::CopyMs(g_stream, b.get(), a.get(), bytes,
                                    {10, /*warmup=*/1, /*sync_each=*/false, g_flush});
    copy_gbps = bench::CopyGBs(bytes, ms);
    std::printf("copy 1 GiB device-to-device: %.4f ms, %.1f GB/s (read + write)\n", ms, copy_gbps);
  }
  std::vector<Row> rows;
  if (detect) {
    RunDetection();
    return 0;
  }
  if (profile) {
    RunSize(int64_t{1} << 20, copy_gbps, true, &rows);
    return 0;
  }
  const std::vector<int64_t> sizes =
      quick ? std::vector<int64_t>{int64_t{1} << 17} : std::vector<int64_t>{int64_t{1} << 17, int64_t{1} << 20};
  for (int64_t n : sizes) RunSize(n, copy_gbps, false, &rows);

  std::printf("\n| N | keys | method | graph ms | stream ms | key MB | key GB/s | %% copy | recall |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    char recall[32] = "-";
    if (r.recall >= 0) std::snprintf(recall, sizeof(recall), "%.4f", r.recall);
    std::printf("| %lld | %s | %s | %.4f | %.4f | %.2f | %.1f | %.1f | %s |\n",
                static_cast<long long>(r.n), r.key_set.c_str(), r.method.c_str(), r.graph_ms,
                r.stream_ms, r.key_bytes / 1e6, r.key_bytes / r.graph_ms / 1e6,
                100.0 * r.key_bytes / r.graph_ms / 1e6 / copy_gbps, recall);
  }
  std::printf("\nexact / span (targets: key traffic >= 4x, time >= 3x):\n");
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    const Row& e = rows[i];
    const Row& s = rows[i + 1];
    if (e.method.rfind("exact", 0) != 0 || s.method.rfind("tokenselect_span", 0) != 0) continue;
    const double traffic = e.key_bytes / s.key_bytes;
    const double t_graph = e.graph_ms / s.graph_ms, t_stream = e.stream_ms / s.stream_ms;
    std::printf("  N=%-8lld %-8s traffic %6.1fx  time %5.2fx (graph) %5.2fx (stream)  recall "
                "%.4f  -> %s\n",
                static_cast<long long>(e.n), e.key_set.c_str(), traffic, t_graph, t_stream,
                s.recall, traffic >= 4.0 && t_graph >= 3.0 ? "meets" : "MISSES");
  }
  std::printf("\nchecks: %s\n", g_ok ? "all OK" : "SOME FAILED");
  return g_ok ? 0 : 1;
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) { return tokenselect::kernels::cuda::Main(argc, argv); }
