// CUDA kernel benchmark: checks first, then times (CUDA events, warm-up, median of many reps,
// inputs rotated so that each rep reads HBM, not L2). Shape: Llama-3-8B attention (H = 32,
// H_kv = 8, d = 128), bf16 KV, batch 1, one layer.
//   copy      cudaMemcpyAsync device-to-device, 1 GiB: a measured ceiling (read + write bytes)
//   read      a pure read kernel over 1 GiB (16 B streaming loads): the read ceiling
//   select    ScoreKeys + VoteFromLogits + TopK(2048) at N = 32K, 128K, 512K, 1M candidates;
//             napkin: N * 2 KiB of keys (+ N * 260 B of logits/votes), GB/s counts the key bytes
//   sparse    DecodeAttention over 128 + 2048 + 512 = 2688 random slots of a 1M-slot cache
//   dense     DecodeAttention over N = 128K / 512K / 1M paged slots, true positions
//   step      one layer's decode step at N = 1M: SelectionCacheCheck + ScoreKeys + VoteFromLogits
//             + TopK (skipping on the check's flag) + sparse DecodeAttention over 2688 slots;
//             "miss" (theta > 1: full selection) and "hit" (cached query equal: selection skipped)
// Checks: selection votes against an fp64 CPU soft vote at 32K (and the top-k tolerance rule of
// tests/gpu/selection_test.cc); decode against cpu::GatherAttention on the sparse list.
// The last table's rows are what bench/torch_peers.py --ours compares against its PyTorch peers.
// Power state: on an H200 SXM at its 700 W limit the SM clock drops to 1.1-1.6 GHz within ~1.5 s
// of sustained load (nineteenth session), so rows late in a run may be timed at a lower clock
// than a short peer process. --sustain=S runs each dense decode case, and the decode step's miss
// case, on its own for S seconds before timing it (its sustained state, as
// bench/torch_peers.py --sustain=S does for SDPA);
// --dense-only skips the selection rows. --step-only times the 1M decode step alone (miss and
// hit, after its check), for a fresh short process like bench/torch_peers.py --step-only: the
// two then run in the same power state (with --sustain=S, the miss step after S seconds of it).
// --step-parts adds the decode step's chains cut short
// (check + score, + vote, + top-k; the step without the check; for the bound-vote chain check +
// selection and selection + sparse attention), to see what each kernel adds, and A/B rows: the
// selection and the step with the top-k's own first histogram, sparse decode at other split
// counts.
// --crossover adds selection sizes 256K, 320K and 384K (around where the engine switches to the
// bound-vote chain, kBoundVoteMinCandidates = 320K) and 768K (between 512K and 1M).
// --selection-only=K[,K...] times the selection rows alone at these sizes (in K tokens, 1024 at
// most): no decode step, no decode rows; the fp64 check runs only when the first size is at
// most 128K (the bound chain's check against the plain chain runs at every size). For quick A/B
// runs of the selection kernels.
// Usage: bench_kernels_cuda [--quick | --variants] [--sustain=S] [--dense-only | --step-only |
//                           --selection-only=K,...] [--step-parts] [--crossover]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/selection.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;
using bench::PagedSlots;

constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kRowBytes = kKvHeads * kDim * 2;  // one token's keys (or values), bf16
constexpr int64_t kCacheSlots = int64_t{1} << 20;

// Pure read: every 16 B of `in` once (8 loads in flight per thread), folded into one word that
// is stored only if it matches an impossible value (keeps the loads alive).
__global__ void __launch_bounds__(256) ReadKernel(const uint4* __restrict__ in, int64_t n,
                                                  uint32_t* out) {
  constexpr int kUnroll = 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i0 < n;
       i0 += stride * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(in + min(i0 + u * stride, n - 1));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *out = acc;
}

cudaStream_t g_stream = nullptr;  // every launch of this benchmark goes here

// Median time in ms of `reps` runs of fn(rep) after `warmup` runs, each bracketed by events.
double MedianMs(const std::function<void(int)>& fn, int reps, int warmup = 5) {
  return bench::MedianMs(g_stream, fn, {reps, warmup});
}

// Median time in ms per call of fn(rep) when `inner` calls (rep = 0 .. inner - 1, so inputs
// rotate) are captured in one CUDA graph and the graph is replayed: launch overhead stays out,
// which matters for the few-microsecond kernels (sparse decode, top-k).
double GraphMedianMs(const std::function<void(int)>& fn, int reps, int inner = 16) {
  return bench::GraphMedianMs(g_stream, fn, inner, {reps, 3});
}

struct Row {
  std::string what;
  double ms;
  double gbps;  // 0: no bytes counted
  std::string note;
};

// The decode attention of one request (batch 1) at this shape over `indptr`'s list; the caller
// sets indices and kv_positions.
DecodeAttentionParams DecodeParams(const uint16_t* q, uint16_t* out, const int32_t* q_pos,
                                   const __nv_bfloat16* kc, const __nv_bfloat16* vc,
                                   const int32_t* indptr, const float* inv_freq, void* workspace,
                                   int splits, float scale) {
  DecodeAttentionParams p;
  p.out = reinterpret_cast<__nv_bfloat16*>(out);
  p.q = reinterpret_cast<const __nv_bfloat16*>(q);
  p.q_positions = q_pos;
  p.k_cache = kc;
  p.v_cache = vc;
  p.indptr = indptr;
  p.inv_freq = inv_freq;
  p.workspace = workspace;
  p.batch = 1;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kDim;
  p.num_splits = splits;
  p.scale = scale;
  return p;
}

// Variants under study at 1M tokens (one launch each after warm-up, so that ncu can profile
// them): score kernel over paged vs contiguous slots, dense decode at several split counts.
int Variants(const __nv_bfloat16* kc, const __nv_bfloat16* vc, int num_sms) {
  std::mt19937 rng(7);
  const int64_t n = kCacheSlots;
  std::vector<int32_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  DeviceBuffer<int32_t> paged(PagedSlots(n, 0, &rng)), contiguous(identity);
  std::vector<float> query(static_cast<size_t>(kHeads * kDim), 0.01f);
  DeviceBuffer<float> d_query(query);
  bench::ExactSelection sel(n, 2048, kHeads, kKvHeads, kDim);
  sel.score.query = d_query.get();
  sel.score.k_cache = kc;
  for (auto* slots : {&paged, &contiguous}) {
    sel.score.slots = slots->get();
    const double ms = MedianMs([&](int) { TS_CUDA_CHECK(ScoreKeys(sel.score, g_stream)); }, 5, 2);
    std::printf("variant score 1M %s: %.4f ms, %.1f GB/s of keys\n",
                slots == &paged ? "paged" : "contiguous", ms, n * kRowBytes / ms / 1e6);
  }
  {
    const double t_vote =
        GraphMedianMs([&](int) { TS_CUDA_CHECK(VoteFromLogits(sel.soft_vote, g_stream)); }, 10);
    const double t_topk = GraphMedianMs([&](int) { TS_CUDA_CHECK(TopK(sel.top_k, g_stream)); }, 10);
    std::printf("variant 1M: vote %.4f ms, top-2048 %.4f ms (graph-timed)\n", t_vote, t_topk);
  }
  RopeParams rope;
  rope.head_dim = kDim;
  const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  DeviceBuffer<uint16_t> d_q(static_cast<size_t>(kHeads * kDim)), d_out(kHeads * kDim);
  d_q.Zero();
  const std::vector<int32_t> indptr = {0, static_cast<int32_t>(n)};
  const std::vector<int32_t> q_pos = {static_cast<int32_t>(n)};
  DeviceBuffer<int32_t> d_indptr(indptr), d_q_pos(q_pos);
  const int planned = PlanDecodeSplits(1, kKvHeads, n, num_sms);
  for (int config = 0; config < 6; ++config) {
    const int splits = config == 0 || config == 5 ? planned : 33 * config;
    const bool tensor_cores = config != 5;
    DeviceBuffer<char> dws(DecodeAttentionWorkspaceBytes(1, kHeads, kDim, splits));
    DecodeAttentionParams p =
        DecodeParams(d_q.get(), d_out.get(), d_q_pos.get(), kc, vc, d_indptr.get(),
                     d_inv_freq.get(), dws.get(), splits, 0.088f);
    p.indices = paged.get();
    p.kv_positions = contiguous.get();
    p.use_tensor_cores = tensor_cores;
    const double ms = MedianMs([&](int) { TS_CUDA_CHECK(DecodeAttention(p, g_stream)); }, 5, 2);
    std::printf("variant dense decode 1M, %d splits, %s: %.4f ms, %.1f GB/s of K+V\n", splits,
                tensor_cores ? "tensor cores" : "CUDA cores", ms, 2.0 * n * kRowBytes / ms / 1e6);
  }
  // Sparse decode: 2688 random slots drawn from windows of several sizes (TLB reach), and split
  // counts around the plan.
  const int64_t sparse_n = 2688;
  const std::vector<int32_t> sparse_indptr = {0, static_cast<int32_t>(sparse_n)};
  DeviceBuffer<int32_t> d_sparse_indptr(sparse_indptr);
  const int sparse_planned = PlanDecodeSplits(1, kKvHeads, sparse_n, num_sms);
  for (int64_t window : {int64_t{16} << 10, int64_t{128} << 10, kCacheSlots}) {
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> sets;
    std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(window - 1));
    for (int r = 0; r < 16; ++r) {
      std::vector<int32_t> idx(static_cast<size_t>(sparse_n));
      for (auto& x : idx) x = any(rng);
      sets.push_back(std::make_unique<DeviceBuffer<int32_t>>(idx));
    }
    for (int config = 0; config < 4; ++config) {
      const int splits = config == 3 ? 42 : config == 0 ? sparse_planned : 10 * config;
      const bool tensor_cores = config != 3;
      DeviceBuffer<char> dws(DecodeAttentionWorkspaceBytes(1, kHeads, kDim, splits));
      DecodeAttentionParams p =
          DecodeParams(d_q.get(), d_out.get(), d_q_pos.get(), kc, vc, d_sparse_indptr.get(),
                       d_inv_freq.get(), dws.get(), splits, 0.088f);
      p.kv_positions = contiguous.get();
      p.use_tensor_cores = tensor_cores;
      const double ms = GraphMedianMs([&](int r) {
        p.indices = sets[r % 16]->get();
        TS_CUDA_CHECK(DecodeAttention(p, g_stream));
      }, 20);
      std::printf("variant sparse decode 2688 of %lldK slots, %d splits, %s: %.2f us\n",
                  static_cast<long long>(window >> 10), splits,
                  tensor_cores ? "tensor cores" : "CUDA cores", ms * 1e3);
    }
  }
  return 0;
}

// The last table (bench/torch_peers.py --ours parses it); returns 0.
int PrintRows(const std::vector<Row>& rows, double copy_gbps, double read_gbps) {
  std::printf("\n%-44s %10s %10s %8s %8s  %s\n", "case (Llama-3-8B shape, bf16)", "ms", "GB/s",
              "%copy", "%read", "note");
  for (const Row& r : rows) {
    if (r.gbps > 0.0) {
      std::printf("%-44s %10.4f %10.1f %7.1f%% %7.1f%%  %s\n", r.what.c_str(), r.ms, r.gbps,
                  100.0 * r.gbps / copy_gbps, 100.0 * r.gbps / read_gbps, r.note.c_str());
    } else {
      std::printf("%-44s %10.4f %10s %8s %8s  %s\n", r.what.c_str(), r.ms, "-", "-", "-",
                  r.note.c_str());
    }
  }
  std::printf("GB/s: selection counts key bytes (N * 2 KiB); decode counts K + V bytes; copy "
              "counts read + write; %%read is against the read-only kernel.\n");
  return 0;
}

int Main(int argc, char** argv) {
  TS_CUDA_CHECK(cudaStreamCreate(&g_stream));  // blocking: orders after cudaMemset poisoning
  bool quick = false, variants = false, dense_only = false, step_only = false, step_parts = false,
       crossover = false;
  double sustain_s = 0.0;
  std::vector<int64_t> only_sizes;  // --selection-only
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--variants") == 0) {
      variants = true;
    } else if (std::strcmp(argv[i], "--dense-only") == 0) {
      dense_only = true;
    } else if (std::strcmp(argv[i], "--step-only") == 0) {
      step_only = true;
    } else if (std::strcmp(argv[i], "--crossover") == 0) {
      crossover = true;
    } else if (std::strcmp(argv[i], "--step-parts") == 0) {
      step_parts = true;
    } else if (std::strncmp(argv[i], "--sustain=", 10) == 0) {
      sustain_s = std::atof(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--selection-only=", 17) == 0) {
      for (const char* at = argv[i] + 17; *at != '\0';) {
        char* next = nullptr;
        const long kilo = std::strtol(at, &next, 10);
        if (next == at || kilo < 1 || kilo > (kCacheSlots >> 10) || (*next != ',' && *next)) {
          std::fprintf(stderr, "--selection-only: sizes in K tokens, 1 to %lld, comma-separated\n",
                       static_cast<long long>(kCacheSlots >> 10));
          return 2;
        }
        only_sizes.push_back(static_cast<int64_t>(kilo) << 10);
        at = *next == ',' ? next + 1 : next;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\nusage: bench_kernels_cuda [--quick | --variants] "
                   "[--sustain=S] [--dense-only | --step-only | --selection-only=K,...] "
                   "[--step-parts] [--crossover]\n",
                   argv[i]);
      return 2;
    }
  }
  if (step_only) step_parts = false;  // the step alone: no parts, no A/B rows
  const int reps = quick ? 10 : 50;
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1048576.0);
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Row> rows;

  // ---- Copy bandwidth. ----
  const size_t copy_bytes = size_t{1} << 30;
  double copy_gbps = 0.0, read_gbps = 0.0;
  {
    DeviceBuffer<char> a(copy_bytes), b(copy_bytes);
    a.Zero();
    const double ms = bench::CopyMs(g_stream, b.get(), a.get(), copy_bytes, {reps, 5});
    copy_gbps = bench::CopyGBs(copy_bytes, ms);
    rows.push_back({"copy 1 GiB d2d (read+write)", ms, copy_gbps, "ceiling"});
    DeviceBuffer<uint32_t> sink(1);
    const int blocks = prop.multiProcessorCount * 8;
    const double read_ms = MedianMs([&](int rep) {
      // Alternate the two buffers, so that no rep reads what the previous one left in L2.
      const auto* src = reinterpret_cast<const uint4*>((rep % 2 ? b : a).get());
      ReadKernel<<<blocks, 256, 0, g_stream>>>(src, copy_bytes / 16, sink.get());
      TS_CUDA_CHECK(cudaGetLastError());
    }, reps);
    read_gbps = copy_bytes / read_ms / 1e6;
    rows.push_back({"read 1 GiB (read only)", read_ms, read_gbps, "ceiling"});
  }

  // ---- KV cache shared by all cases: 1M slots of keys and values, random bf16. ----
  std::printf("filling a %lld-slot KV cache (%.1f GiB)...\n", static_cast<long long>(kCacheSlots),
              2.0 * kCacheSlots * kRowBytes / 1073741824.0);
  DeviceBuffer<uint16_t> k_cache(static_cast<size_t>(kCacheSlots * kKvHeads * kDim));
  DeviceBuffer<uint16_t> v_cache(k_cache.size());
  bench::FillRandomBf16(k_cache.get(), static_cast<int64_t>(k_cache.size()), 1u, nullptr);
  bench::FillRandomBf16(v_cache.get(), static_cast<int64_t>(v_cache.size()), 2u, nullptr);
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  const auto* kc = reinterpret_cast<const __nv_bfloat16*>(k_cache.get());
  const auto* vc = reinterpret_cast<const __nv_bfloat16*>(v_cache.get());

  if (variants) return Variants(kc, vc, prop.multiProcessorCount);

  // ---- Decode inputs: the decode cases and the decode-step rows. ----
  RopeParams rope;
  rope.head_dim = kDim;
  rope.theta = 500000.0;
  const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  std::vector<float> q(static_cast<size_t>(kHeads * kDim));
  for (float& x : q) x = normal(rng);
  const auto q_bits = gpu_test::RoundToBf16(&q);
  DeviceBuffer<uint16_t> d_q(q_bits), d_out(q.size());
  // The decode step's sparse attention: 16 lists of 128 + 2048 + 512 random slots (standing in
  // for the selection's picks mapped to slots), compact positions.
  const int64_t step_n = 2688;
  std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> step_lists;
  {
    std::uniform_int_distribution<int32_t> any_slot(0, static_cast<int32_t>(kCacheSlots - 1));
    std::vector<int32_t> list(static_cast<size_t>(step_n));
    for (int s = 0; s < 16; ++s) {
      for (auto& x : list) x = any_slot(rng);
      step_lists.push_back(std::make_unique<DeviceBuffer<int32_t>>(list));
    }
  }
  std::vector<int32_t> step_positions(static_cast<size_t>(step_n));
  std::iota(step_positions.begin(), step_positions.end(), 0);
  const std::vector<int32_t> step_indptr = {0, static_cast<int32_t>(step_n)};
  const std::vector<int32_t> step_q_pos = {static_cast<int32_t>(step_n)};
  DeviceBuffer<int32_t> d_step_pos(step_positions), d_step_indptr(step_indptr);
  DeviceBuffer<int32_t> d_step_q_pos(step_q_pos);
  const int step_splits = PlanDecodeSplits(1, kKvHeads, step_n, prop.multiProcessorCount);
  DeviceBuffer<char> step_ws(DecodeAttentionWorkspaceBytes(1, kHeads, kDim, step_splits));
  DecodeAttentionParams step_dp =
      DecodeParams(d_q.get(), d_out.get(), d_step_q_pos.get(), kc, vc, d_step_indptr.get(),
                   d_inv_freq.get(), step_ws.get(), step_splits, 1.0f / std::sqrt(float(kDim)));
  step_dp.kv_positions = d_step_pos.get();

  // ---- Selection. ----
  std::vector<float> query(static_cast<size_t>(kHeads * kDim));
  for (float& x : query) x = normal(rng) * (3.0f / std::sqrt(float(kDim)));
  DeviceBuffer<float> d_query(query);
  const int64_t k = 2048;
  std::vector<int64_t> sizes = {32 << 10, 128 << 10, 512 << 10, 1 << 20};
  if (crossover) {
    sizes = {32 << 10, 128 << 10, 256 << 10, 320 << 10, 384 << 10, 512 << 10, 768 << 10, 1 << 20};
  }
  const bool selection_only = !only_sizes.empty();
  if (selection_only) sizes = only_sizes;
  for (int64_t n : sizes) {
    if (dense_only) break;
    if (step_only && n != kCacheSlots) continue;
    // Rotate among disjoint slot windows so that the keys of a rep are not in L2.
    const int sets = static_cast<int>(std::min<int64_t>(8, kCacheSlots / n));
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> slot_sets;
    std::vector<int32_t> first_slots;
    for (int s = 0; s < sets; ++s) {
      first_slots = PagedSlots(n, s * n, &rng);
      slot_sets.push_back(std::make_unique<DeviceBuffer<int32_t>>(first_slots));
    }
    bench::ExactSelection sel(n, k, kHeads, kKvHeads, kDim);
    sel.score.query = d_query.get();
    sel.score.k_cache = kc;
    KeyScoreParams& sp = sel.score;
    VoteParams& vp = sel.soft_vote;
    TopKParams& tp = sel.top_k;
    auto score = [&](int rep) {
      sp.slots = slot_sets[rep % sets]->get();
      TS_CUDA_CHECK(ScoreKeys(sp, g_stream));
    };
    // The vote and the top-k as the engine runs them on one GPU: the vote builds the top-k's
    // first histogram (vote_histogram; the "vote only" and "top2048 only" rows run without).
    bool vote_histogram = true;
    auto vote_top = [&] { TS_CUDA_CHECK(sel.VoteAndTopK(g_stream, vote_histogram)); };
    auto all = [&](int rep) {
      score(rep);
      vote_top();
    };
    if (n == sizes[0] && !step_only && n <= (128 << 10)) {
      // Check: fp64 CPU soft vote over the last slot set, then the top-k tolerance rule.
      sel.logits.Poison();
      sel.vote.Poison();
      sel.top.Poison();
      all(sets - 1);
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      // The last set's slots lie in [(sets - 1) n, sets n): copy that window.
      const int64_t window_first = (sets - 1) * n;
      std::vector<uint16_t> window(static_cast<size_t>(n * kKvHeads * kDim));
      TS_CUDA_CHECK(cudaMemcpy(window.data(), k_cache.get() + window_first * kKvHeads * kDim,
                               window.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<double> s(static_cast<size_t>(kHeads * n));
      std::vector<double> mx(kHeads, -1e300), z(kHeads, 0.0), ref(static_cast<size_t>(n), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const uint16_t* row =
            window.data() + (first_slots[j] - window_first) * kKvHeads * kDim;
        for (int64_t h = 0; h < kHeads; ++h) {
          const uint16_t* key = row + (h / (kHeads / kKvHeads)) * kDim;
          double acc = 0.0;
          for (int64_t e = 0; e < kDim; ++e) acc += double(query[h * kDim + e]) * gpu_test::Bf16BitsToFloat(key[e]);
          s[h * n + j] = acc;
          mx[h] = std::max(mx[h], acc);
        }
      }
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t j = 0; j < n; ++j) z[h] += std::exp(s[h * n + j] - mx[h]);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t h = 0; h < kHeads; ++h) ref[j] += std::exp(s[h * n + j] - mx[h]) / z[h];
      const std::vector<float> got = sel.vote.Download();
      double max_rel = 0.0;
      for (int64_t j = 0; j < n; ++j) max_rel = std::max(max_rel, std::fabs(got[j] - ref[j]) / ref[j]);
      std::vector<double> sorted(ref);
      std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
      const double t = sorted[k - 1];
      const std::vector<int32_t> picked = sel.top.Download();
      int outside = 0, bad = 0;
      for (int32_t i : picked) {
        if (i < 0 || i >= n) { ++bad; continue; }
        if (ref[i] < t) ++outside;
        if (ref[i] < t * (1 - 2e-4)) ++bad;
      }
      const bool sorted_ok = std::is_sorted(picked.begin(), picked.end()) &&
                             std::adjacent_find(picked.begin(), picked.end()) == picked.end();
      std::printf("check select N=%lld: vote max rel err %.2e (fp64 ref), top-%lld: %d near-tie "
                  "swaps, %d violations, ascending %s -> %s\n",
                  static_cast<long long>(n), max_rel, static_cast<long long>(k), outside, bad,
                  sorted_ok ? "yes" : "NO",
                  (max_rel < 1e-4 && bad == 0 && sorted_ok) ? "OK" : "FAILED");
      if (!(max_rel < 1e-4 && bad == 0 && sorted_ok)) return 1;
    }
    const double key_bytes = double(n) * kRowBytes;
    const long long nk = static_cast<long long>(n >> 10);
    char what[96], note[64];
    double t_plain_chain = 0.0;  // score+vote+top2048 (not in a step-only run)
    if (!step_only) {
      const double t_score = GraphMedianMs(score, reps);
      const double t_vote = GraphMedianMs(
          [&](int) { TS_CUDA_CHECK(VoteFromLogits(vp, g_stream)); }, reps);
      const double t_topk = GraphMedianMs([&](int) { TS_CUDA_CHECK(TopK(tp, g_stream)); }, reps);
      const double t_all = GraphMedianMs(all, reps);
      t_plain_chain = t_all;
      std::snprintf(what, sizeof(what), "select N=%lldK score only", nk);
      rows.push_back({what, t_score, key_bytes / t_score / 1e6, ""});
      std::snprintf(what, sizeof(what), "select N=%lldK vote only", nk);
      std::snprintf(note, sizeof(note), "GB/s: logits read + vote written");
      rows.push_back({what, t_vote, n * (kHeads * 4.0 + 4.0) / t_vote / 1e6, note});
      std::snprintf(what, sizeof(what), "select N=%lldK top2048 only", nk);
      rows.push_back({what, t_topk, 0.0, ""});
      std::snprintf(what, sizeof(what), "select N=%lldK score+vote+top2048", nk);
      rows.push_back({what, t_all, key_bytes / t_all / 1e6, ""});
    }
    if (step_parts) {
      vote_histogram = false;
      const double t_plain = GraphMedianMs(all, reps);
      vote_histogram = true;
      std::snprintf(what, sizeof(what), "select N=%lldK score+vote+top2048, top-k's own histogram",
                    nk);
      rows.push_back({what, t_plain, key_bytes / t_plain / 1e6, ""});
    }

    // The bound-vote selection (BoundSelection): its picks against the exact chain's, then its
    // launches' times. The "bound score" row (the scoring alone) repeats stores of the bounds
    // that stay in L2 from rep to rep (evict_last, no screen to discard them): it does not count
    // their write-back, which in the chain never happens either.
    bench::BoundSelection bsel(sel, k);
    bool use_bound = false;
    {
      all(0);
      TS_CUDA_CHECK(bsel.Run(g_stream, 2, /*list_candidates=*/true));
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int32_t> want = sel.top.Download(), got = bsel.top.Download();
      const int64_t heads = sel.score.num_heads;
      const int32_t cands = gpu_test::DownloadFrom(bsel.view.count, 1)[0];
      const std::vector<float> sm = gpu_test::DownloadFrom(bsel.view.sample_max, heads);
      const std::vector<float> si = gpu_test::DownloadFrom(bsel.view.sample_inv_sum, heads);
      const std::vector<float> hm = sel.head_max.Download(), hi = sel.head_inv_sum.Download();
      double lo = 1e30, hi_d = -1e30;
      for (size_t h = 0; h < hm.size(); ++h) {
        const double d = (hm[h] - std::log(double(hi[h]))) - (sm[h] - std::log(double(si[h])));
        lo = std::min(lo, d);
        hi_d = std::max(hi_d, d);
      }
      // Against the exact chain: the candidates' votes (fp32 dots against the tensor-core
      // logits), and the picks, which may differ only where the exact votes nearly tie.
      const std::vector<float> exact_vote = sel.vote.Download();
      const std::vector<float> cand_vote = gpu_test::DownloadFrom(bsel.view.cand_vote, cands);
      const std::vector<int32_t> cand_index = gpu_test::DownloadFrom(bsel.view.cand_index, cands);
      double vote_err = 0.0;
      for (int32_t i = 0; i < cands; ++i) {
        const double e = exact_vote[static_cast<size_t>(cand_index[i])];
        vote_err = std::max(vote_err, std::fabs(cand_vote[i] - e) / e);
      }
      const bench::PickComparison picks = bench::ComparePicks(want, got, exact_vote);
      const bool ok = picks.ok && vote_err < 1e-5;
      std::printf("check bound select N=%lld: %d candidates (%.2fx k), bound ratio %.5f, "
                  "candidate votes max rel diff %.2e, picks: %zu differ from the exact chain's, "
                  "%d beyond a near-tie -> %s\n",
                  static_cast<long long>(n), cands, double(cands) / double(k),
                  std::exp(hi_d - lo), vote_err, picks.differ, picks.beyond_near_tie,
                  ok ? "OK" : "FAILED");
      if (!ok) return 1;
      for (int launches = 1; launches <= 2; ++launches) {
        if (step_only) break;
        const double t = GraphMedianMs([&](int rep) {
          sp.slots = slot_sets[rep % sets]->get();
          TS_CUDA_CHECK(bsel.Run(g_stream, launches));
        }, reps);
        const char* parts[] = {"", "bound score", "+screen+votes+top2048"};
        std::snprintf(what, sizeof(what), "select N=%lldK bound: %s", nk, parts[launches]);
        rows.push_back({what, t, key_bytes / t / 1e6, ""});
        if (launches < 2) continue;
        // The chain the engine runs at this length (CudaSelectionAttention: the bound-vote
        // selection from kBoundVoteMinCandidates candidates on one GPU).
        const bool bound_chain = n >= kBoundVoteMinCandidates;
        const double t_engine = bound_chain ? t : t_plain_chain;
        std::snprintf(what, sizeof(what), "select N=%lldK engine selection", nk);
        rows.push_back({what, t_engine, key_bytes / t_engine / 1e6,
                        bound_chain ? "the bound-vote chain" : "the plain chain"});
      }
    }

    if (n == kCacheSlots && !selection_only) {
      // One layer's decode step at 1M: the cache check decides, score/vote/top-k skip on its
      // flag, then sparse attention over the step's list (rotated like the keys).
      DeviceBuffer<float> cached(query.size());
      DeviceBuffer<int32_t> valid(1), hit(1);
      valid.Zero();
      CacheCheckParams cp;
      cp.hit = hit.get();
      cp.cached_query = cached.get();
      cp.cached_valid = valid.get();
      cp.query = d_query.get();
      cp.dim = kHeads * kDim;
      // The step's kernels up to `parts` (1 check, 2 score, 3 vote, 4 top-k, 5 sparse
      // attention); with_check false leaves the check out (the scoring kernel then follows the
      // previous step's attention). Part 3's vote is the plain one (no top-k would clear its
      // histogram), with 4 waves of blocks where the step's vote has one: parts 4 - 3 is not the
      // step's top-k; the "vote only" and "top2048 only" rows time the two apart.
      auto step_upto = [&](int rep, int parts, bool with_check) {
        if (with_check) TS_CUDA_CHECK(SelectionCacheCheck(cp, g_stream));
        sp.skip = vp.skip = tp.skip = with_check ? hit.get() : nullptr;
        if (use_bound && parts >= 2) {
          sp.slots = slot_sets[rep % sets]->get();
          TS_CUDA_CHECK(bsel.Run(g_stream));
        } else {
          if (parts >= 2) score(rep);
          if (parts == 3) TS_CUDA_CHECK(VoteFromLogits(vp, g_stream));
          if (parts >= 4) vote_top();
        }
        sp.skip = vp.skip = tp.skip = nullptr;
        step_dp.indices = step_lists[rep % step_lists.size()]->get();
        if (parts >= 5) TS_CUDA_CHECK(DecodeAttention(step_dp, g_stream));
      };
      auto step = [&](int rep) { step_upto(rep, 5, true); };
      cp.theta = 2.0f;  // never hits: the full selection every step
      if (sustain_s > 0.0) bench::Sustain(g_stream, step, sustain_s);
      const double t_miss = GraphMedianMs(step, reps);
      use_bound = true;
      const double t_miss_bound = GraphMedianMs(step, reps);
      use_bound = false;
      if (step_parts) {
        const char* names[] = {"", "check", "check+score", "check+score+vote",
                               "check+score+vote+topk"};
        for (int parts = 2; parts <= 4; ++parts) {
          char what[96];
          std::snprintf(what, sizeof(what), "step part N=1M miss: %s", names[parts]);
          rows.push_back({what, GraphMedianMs([&](int r) { step_upto(r, parts, true); }, reps),
                          0.0, ""});
        }
        rows.push_back({"step part N=1M: score+vote+topk+sparse (no check)",
                        GraphMedianMs([&](int r) { step_upto(r, 5, false); }, reps), 0.0, ""});
        rows.push_back({"step N=1M miss (again, after the parts)", GraphMedianMs(step, reps), 0.0,
                        ""});
        vote_histogram = false;
        rows.push_back({"step N=1M miss, top-k's own histogram", GraphMedianMs(step, reps), 0.0,
                        ""});
        vote_histogram = true;
        // The bound-vote chain's step in the same cuts: what the check and the sparse attention
        // add to its selection.
        use_bound = true;
        rows.push_back({"step part N=1M miss, bound chain: check+select",
                        GraphMedianMs([&](int r) { step_upto(r, 4, true); }, reps), 0.0, ""});
        rows.push_back({"step part N=1M, bound chain: select+sparse (no check)",
                        GraphMedianMs([&](int r) { step_upto(r, 5, false); }, reps), 0.0, ""});
        rows.push_back({"step N=1M miss, bound chain (again, after the parts)",
                        GraphMedianMs(step, reps), 0.0, ""});
        use_bound = false;
      }
      const int32_t miss_flag = hit.Download()[0];
      TS_CUDA_CHECK(cudaMemcpy(cached.get(), d_query.get(), query.size() * sizeof(float),
                               cudaMemcpyDeviceToDevice));
      const std::vector<int32_t> one = {1};
      valid.Upload(one);
      cp.theta = 0.9f;  // the cached query equals the query: every step hits
      const double t_hit = GraphMedianMs(step, reps);
      const int32_t hit_flag = hit.Download()[0];
      std::printf("check decode step: cache flag %d on the miss path, %d on the hit path -> %s\n",
                  miss_flag, hit_flag, miss_flag == 0 && hit_flag == 1 ? "OK" : "FAILED");
      if (!(miss_flag == 0 && hit_flag == 1)) return 1;
      const double step_bytes = key_bytes + 2.0 * step_n * kRowBytes;
      if (sustain_s > 0.0) {
        std::snprintf(note, sizeof(note), "keys + sparse K/V, after %.0f s of it", sustain_s);
      } else {
        std::snprintf(note, sizeof(note), "keys + sparse K/V");
      }
      // The step as the engine runs it: its selection chain at this length (above).
      const bool bound_step = n >= kBoundVoteMinCandidates;
      const double t_engine_step = bound_step ? t_miss_bound : t_miss;
      char engine_note[96];
      std::snprintf(engine_note, sizeof(engine_note), "%s; %s", note,
                    bound_step ? "the bound-vote chain" : "the plain chain");
      rows.push_back({"decode step N=1M miss (check+select+sparse)", t_engine_step,
                      step_bytes / t_engine_step / 1e6, engine_note});
      rows.push_back({"decode step N=1M miss, plain chain", t_miss, step_bytes / t_miss / 1e6,
                      note});
      rows.push_back({"decode step N=1M miss, bound-vote chain", t_miss_bound,
                      step_bytes / t_miss_bound / 1e6, note});
      rows.push_back({"decode step N=1M hit (check+skip+sparse)", t_hit, 0.0, ""});
      if (step_only) continue;
      // Contiguous slots instead of shuffled 16-slot pages.
      std::vector<int32_t> ident(static_cast<size_t>(n));
      std::iota(ident.begin(), ident.end(), 0);
      DeviceBuffer<int32_t> d_ident(ident);
      KeyScoreParams cont = sp;
      cont.slots = d_ident.get();
      const double t_cont =
          GraphMedianMs([&](int) { TS_CUDA_CHECK(ScoreKeys(cont, g_stream)); }, reps);
      rows.push_back(
          {"select N=1024K score only, contiguous slots", t_cont, key_bytes / t_cont / 1e6, ""});
    }
  }

  // ---- Decode attention (inputs set up before the selection). ----
  // contiguous: slots s n .. s n + n - 1 in order (as SDPA's contiguous K/V) instead of pages;
  // splits: 0 for PlanDecodeSplits.
  auto decode_case = [&](const char* name, int64_t n, bool sparse, bool contiguous = false,
                         int split_count = 0) {
    const int sets = sparse ? 16 : static_cast<int>(std::min<int64_t>(8, kCacheSlots / n));
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> idx_sets, pos_sets;
    std::vector<int32_t> indices(static_cast<size_t>(n)), positions(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> any_slot(0, static_cast<int32_t>(kCacheSlots - 1));
    for (int s = 0; s < sets; ++s) {
      if (sparse) {
        for (auto& x : indices) x = any_slot(rng);
      } else {
        indices = PagedSlots(n, s * n, &rng);
        if (contiguous) std::iota(indices.begin(), indices.end(), static_cast<int32_t>(s * n));
      }
      std::iota(positions.begin(), positions.end(), 0);
      idx_sets.push_back(std::make_unique<DeviceBuffer<int32_t>>(indices));
      pos_sets.push_back(std::make_unique<DeviceBuffer<int32_t>>(positions));
    }
    const std::vector<int32_t> indptr = {0, static_cast<int32_t>(n)};
    const std::vector<int32_t> q_pos = {static_cast<int32_t>(n)};
    DeviceBuffer<int32_t> d_indptr(indptr), d_q_pos(q_pos);
    const int splits = split_count > 0 ? split_count
                                       : PlanDecodeSplits(1, kKvHeads, n, prop.multiProcessorCount);
    DeviceBuffer<char> ws(DecodeAttentionWorkspaceBytes(1, kHeads, kDim, splits));
    DecodeAttentionParams p =
        DecodeParams(d_q.get(), d_out.get(), d_q_pos.get(), kc, vc, d_indptr.get(),
                     d_inv_freq.get(), ws.get(), splits, 1.0f / std::sqrt(float(kDim)));
    auto run = [&](int rep) {
      p.indices = idx_sets[rep % sets]->get();
      p.kv_positions = pos_sets[rep % sets]->get();
      TS_CUDA_CHECK(DecodeAttention(p, g_stream));
    };
    if (sparse) {  // check against cpu::GatherAttention on the last list
      d_out.Poison();
      run(sets - 1);
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> kf(static_cast<size_t>(n * kKvHeads * kDim)), vf(kf.size());
      std::vector<uint16_t> row(static_cast<size_t>(kKvHeads * kDim));
      std::vector<int32_t> local(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        local[j] = static_cast<int32_t>(j);
        for (int which = 0; which < 2; ++which) {
          TS_CUDA_CHECK(cudaMemcpy(row.data(), (which ? v_cache : k_cache).get() + int64_t(indices[j]) * kKvHeads * kDim,
                                   row.size() * 2, cudaMemcpyDeviceToHost));
          for (size_t e = 0; e < row.size(); ++e) {
            (which ? vf : kf)[j * kKvHeads * kDim + e] = gpu_test::Bf16BitsToFloat(row[e]);
          }
        }
      }
      std::vector<float> ref(q.size());
      GatherAttentionParams gp;
      gp.out = ref.data();
      gp.q = q.data();
      gp.q_positions = q_pos.data();
      gp.k_cache = kf.data();
      gp.v_cache = vf.data();
      gp.kv_slots = local.data();
      gp.kv_positions = positions.data();
      gp.inv_freq = inv_freq.data();
      gp.num_queries = 1;
      gp.kv_len = n;
      gp.num_heads = kHeads;
      gp.num_kv_heads = kKvHeads;
      gp.head_dim = kDim;
      gp.scale = p.scale;
      cpu::GatherAttention(gp);
      gpu_test::Bf16Error err;
      err.Add(d_out.Download().data(), ref.data(), 0, static_cast<int64_t>(ref.size()));
      const double rel = err.first_nan >= 0 ? INFINITY : err.relative_l2();
      std::printf("check sparse decode (%lld tokens, %d splits): rel L2 err %.2e vs "
                  "cpu::GatherAttention -> %s\n", static_cast<long long>(n), splits, rel,
                  rel < 5e-3 ? "OK" : "FAILED");
      if (!(rel < 5e-3)) return false;
    }
    if (!sparse && sustain_s > 0.0) bench::Sustain(g_stream, run, sustain_s);
    const double ms = GraphMedianMs(run, reps);
    char note[64];
    if (sustain_s > 0.0 && !sparse) {
      std::snprintf(note, sizeof(note), "%d splits, after %.0f s of it", splits, sustain_s);
    } else {
      std::snprintf(note, sizeof(note), "%d splits", splits);
    }
    rows.push_back({name, ms, 2.0 * n * kRowBytes / ms / 1e6, note});
    return true;
  };
  if (step_only || selection_only) return PrintRows(rows, copy_gbps, read_gbps);
  if (!decode_case("sparse decode 128+2048+512", 2688, true)) return 1;
  if (!decode_case("dense decode N=128K", 128 << 10, false)) return 1;
  if (!decode_case("dense decode N=512K", 512 << 10, false)) return 1;
  if (!decode_case("dense decode N=1M", 1 << 20, false)) return 1;
  // Contiguous slots (as SDPA's K/V) instead of shuffled 16-slot pages; split counts off the plan.
  if (!decode_case("dense decode N=1M contiguous slots", 1 << 20, false, true)) return 1;
  for (int splits : {66, 132}) {
    char name[64];
    std::snprintf(name, sizeof(name), "dense decode N=1M, %d splits", splits);
    if (!decode_case(name, 1 << 20, false, false, splits)) return 1;
  }
  // Sparse decode off the plan's 21 splits (H200, twenty-second session: 11.6 us at 21, 12.3 at
  // 26, 12.5 at 33, 15.7 at 42).
  if (step_parts) {
    for (int splits : {26, 33, 42}) {
      char name[64];
      std::snprintf(name, sizeof(name), "sparse decode 128+2048+512, %d splits", splits);
      if (!decode_case(name, 2688, true, false, splits)) return 1;
    }
  }

  return PrintRows(rows, copy_gbps, read_gbps);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) { return tokenselect::kernels::cuda::Main(argc, argv); }
