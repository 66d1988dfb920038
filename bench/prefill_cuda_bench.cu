// Chunked-prefill benchmark at the Llama-3-8B attention shape (H = 32, H_kv = 8, d = 128), bf16
// KV, batch 1, one layer, chunk c = 512. Check first, then CUDA-event timings (median of reps).
//   (a) PrefillAttention alone
//       sparse  the TokenSelect chunk list: 128 + 2048 + 512 selected tokens (random slots of a
//               1M-slot cache, in order) + the 512-token chunk, compact positions, causal chunk
//       dense   the chunk over N = 32K, 128K, 512K, 1M cached tokens at true positions + the
//               causal chunk (visible = N + i + 1)
//       napkin: FLOPs = 4 d H sum_i visible_i; GB/s counts the list's K + V bytes once
//   (b) the full TokenSelect chunk step at N = 32K .. 1M: selection query (BuildSelectionQuery,
//       mean of the chunk's rotated queries at n_local + i), the soft vote's top 2048 over the
//       candidates [128, N - 512) by the chain the engine runs at that length (ScoreKeys +
//       VoteFromLogits + TopK; BoundVoteSelect from kBoundVoteMinCandidates candidates: the 1M
//       row), the list build (init + selected + local
//       + chunk, compact positions, visible = 2688 + i + 1), PrefillAttention; each part and the
//       whole step replayed as CUDA graphs.
// Check: the tuned kernel against SimplePrefillAttention (CUDA cores, fp32) on the sparse list.
// Inputs rotate over disjoint slot windows between reps where they fit (so reps read HBM).
// Usage: bench_prefill_cuda [--quick] [--csv PATH] [--splits N]
//   --csv: rows case,N,ms for bench/torch_prefill_peers.py; --splits: override PlanPrefillSplits.
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
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/selection.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;

constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kChunk = 512, kInit = 128, kTopK = 2048, kLocal = 512;
constexpr int64_t kSelected = kInit + kTopK + kLocal;  // 2688
constexpr int64_t kList = kSelected + kChunk;          // 3200
constexpr int64_t kMaxN = int64_t{1} << 20;
constexpr int64_t kCacheSlots = kMaxN + kChunk;        // cached tokens + the chunk's own slots
constexpr int64_t kRowBytes = kKvHeads * kDim * 2;     // one token's keys (or values), bf16
constexpr int64_t kQStride = (kHeads + 2 * kKvHeads) * kDim;  // fused qkv row

// The TokenSelect list of one chunk: [0, init) + candidate_slots[topk] + [N - local, N) (all
// shifted by `base`, the request's first slot) + the chunk's slots; compact positions; the
// chunk's visible prefixes and query positions.
__global__ void BuildTokenSelectList(int32_t* slots, int32_t* positions, int32_t* visible,
                                     int32_t* q_positions, const int32_t* topk,
                                     const int32_t* candidate_slots, int32_t base, int32_t n,
                                     int32_t chunk_first_slot) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < kList) {
    int32_t s;
    if (j < kInit) {
      s = base + j;
    } else if (j < kInit + kTopK) {
      s = candidate_slots[topk[j - kInit]];
    } else if (j < kSelected) {
      s = base + n - static_cast<int32_t>(kSelected) + j;
    } else {
      s = chunk_first_slot + j - static_cast<int32_t>(kSelected);
    }
    slots[j] = s;
    positions[j] = j;
  }
  if (j < kChunk) {
    visible[j] = static_cast<int32_t>(kSelected) + j + 1;
    q_positions[j] = static_cast<int32_t>(kSelected) + j;
  }
}

cudaStream_t g_stream = nullptr;
int g_splits = 0;  // --splits N: override PlanPrefillSplits (0: planned)

int Splits(int64_t list_len, int num_sms) {
  return g_splits > 0 ? g_splits
                      : PlanPrefillSplits(1, kHeads, kKvHeads, kChunk, list_len, num_sms);
}

double MedianMs(const std::function<void(int)>& fn, int reps, int warmup = 3) {
  return bench::MedianMs(g_stream, fn, {reps, warmup});
}

// `inner` calls of fn(rep) captured in one CUDA graph, replayed: ms per call.
double GraphMedianMs(const std::function<void(int)>& fn, int reps, int inner = 16) {
  return bench::GraphMedianMs(g_stream, fn, inner, {reps, 2});
}

struct Csv {
  FILE* f = nullptr;
  void Add(const char* what, int64_t n, double ms) {
    if (f != nullptr) std::fprintf(f, "%s,%lld,%.6f\n", what, static_cast<long long>(n), ms);
  }
};

// The device lists of one attention problem (batch 1, chunk 512 queries), not owned.
struct Lists {
  const int32_t *q_indptr, *kv_indptr, *slots, *positions, *visible, *q_positions;
  int64_t list_len;
};

// Device buffers of one attention problem.
struct Problem {
  std::unique_ptr<DeviceBuffer<int32_t>> q_indptr, kv_indptr, slots, positions, visible,
      q_positions;
  double visible_sum = 0.0;  // sum_i visible_i
  int64_t list_len = 0;

  Lists lists() const {
    return {q_indptr->get(), kv_indptr->get(),   slots->get(), positions->get(),
            visible->get(),  q_positions->get(), list_len};
  }
};

std::unique_ptr<DeviceBuffer<int32_t>> Upload(const std::vector<int32_t>& host) {
  return std::make_unique<DeviceBuffer<int32_t>>(host);
}

std::unique_ptr<Problem> MakeProblem(const std::vector<int32_t>& slots,
                                     const std::vector<int32_t>& positions, int64_t prefix,
                                     int32_t q_pos0) {
  auto pr = std::make_unique<Problem>();
  const int64_t len = static_cast<int64_t>(slots.size());
  std::vector<int32_t> visible(kChunk), q_positions(kChunk);
  for (int64_t i = 0; i < kChunk; ++i) {
    visible[i] = static_cast<int32_t>(prefix + i + 1);
    q_positions[i] = q_pos0 + static_cast<int32_t>(i);
    pr->visible_sum += visible[i];
  }
  pr->q_indptr = Upload({0, static_cast<int32_t>(kChunk)});
  pr->kv_indptr = Upload({0, static_cast<int32_t>(len)});
  pr->slots = Upload(slots);
  pr->positions = Upload(positions);
  pr->visible = Upload(visible);
  pr->q_positions = Upload(q_positions);
  pr->list_len = len;
  return pr;
}

int Main(int argc, char** argv) {
  bool quick = false;
  Csv csv;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--quick") == 0) quick = true;
    if (std::strcmp(argv[a], "--csv") == 0 && a + 1 < argc) csv.f = std::fopen(argv[++a], "w");
    if (std::strcmp(argv[a], "--splits") == 0 && a + 1 < argc) g_splits = std::atoi(argv[++a]);
  }
  TS_CUDA_CHECK(cudaStreamCreate(&g_stream));
  const int reps = quick ? 5 : 20;
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int num_sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, L2 %.0f MiB\n", prop.name, num_sms,
              prop.l2CacheSize / 1048576.0);
  std::mt19937 rng(12345);

  // KV cache: 1M cached slots + the chunk's 512, random bf16 in [-2, 2); fused-qkv query rows.
  DeviceBuffer<uint16_t> k_cache(static_cast<size_t>(kCacheSlots * kKvHeads * kDim));
  DeviceBuffer<uint16_t> v_cache(k_cache.size());
  DeviceBuffer<uint16_t> q(static_cast<size_t>(kChunk * kQStride));
  bench::FillRandomBf16(k_cache.get(), static_cast<int64_t>(k_cache.size()), 1u, g_stream);
  bench::FillRandomBf16(v_cache.get(), static_cast<int64_t>(v_cache.size()), 2u, g_stream);
  bench::FillRandomBf16(q.get(), static_cast<int64_t>(q.size()), 3u, g_stream);
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  const auto* kc = reinterpret_cast<const __nv_bfloat16*>(k_cache.get());
  const auto* vc = reinterpret_cast<const __nv_bfloat16*>(v_cache.get());
  const auto* qp = reinterpret_cast<const __nv_bfloat16*>(q.get());
  RopeParams rope;
  rope.head_dim = kDim;
  rope.theta = 500000.0;
  DeviceBuffer<float> inv_freq(RopeInverseFrequencies(rope));
  DeviceBuffer<uint16_t> out(static_cast<size_t>(kChunk * kHeads * kDim));
  DeviceBuffer<uint16_t> out_ref(out.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));

  auto params_for = [&](const Lists& pr, int splits, void* ws, uint16_t* dst) {
    PrefillAttentionParams p;
    p.out = reinterpret_cast<__nv_bfloat16*>(dst);
    p.q = qp;
    p.q_row_stride = kQStride;
    p.q_positions = pr.q_positions;
    p.q_indptr = pr.q_indptr;
    p.visible = pr.visible;
    p.k_cache = kc;
    p.v_cache = vc;
    p.kv_indptr = pr.kv_indptr;
    p.kv_indices = pr.slots;
    p.kv_positions = pr.positions;
    p.inv_freq = inv_freq.get();
    p.workspace = ws;
    p.batch = 1;
    p.total_q = kChunk;
    p.num_heads = kHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kDim;
    p.max_q_len = kChunk;
    p.max_kv_len = pr.list_len;
    p.num_splits = splits;
    p.scale = scale;
    return p;
  };
  std::printf("\n(a) PrefillAttention alone, chunk %lld queries\n", static_cast<long long>(kChunk));
  std::printf("%-52s %10s %9s %9s  %s\n", "case", "ms", "TFLOP/s", "KV GB/s", "note");

  // ---- Sparse TokenSelect chunk list: 8 random selections rotated between reps; the whole
  // model's heads on a bf16 cache, and one tensor-parallel rank's half (16 / 4 heads) on an FP8
  // cache (the TP=2 FP8 1M configuration), each with the list read from the cache by the
  // attention kernel and gathered first (PrefillGather). ----
  {
    std::vector<std::unique_ptr<Problem>> sets;
    std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(kMaxN - 1));
    std::vector<int32_t> positions(kList);
    std::iota(positions.begin(), positions.end(), 0);
    for (int s = 0; s < 8; ++s) {
      std::vector<int32_t> slots(kSelected);
      for (auto& x : slots) x = any(rng);
      std::sort(slots.begin(), slots.end());
      for (int64_t i = 0; i < kChunk; ++i) slots.push_back(static_cast<int32_t>(kMaxN + i));
      sets.push_back(MakeProblem(slots, positions, kSelected, static_cast<int32_t>(kSelected)));
    }
    // The FP8 cache of the 4-head rank: kCacheSlots slots x 4 heads x d bytes, scales of 1/16.
    constexpr int64_t kRankKv = kKvHeads / 2;
    DeviceBuffer<uint8_t> k8(static_cast<size_t>(kCacheSlots * kRankKv * kDim)), v8(k8.size());
    bench::FillRandomFp8(k8.get(), static_cast<int64_t>(k8.size()), 4u, g_stream);
    bench::FillRandomFp8(v8.get(), static_cast<int64_t>(v8.size()), 5u, g_stream);
    DeviceBuffer<float> scales(std::vector<float>(kKvHeads, 1.0f / 16.0f));
    struct Shape {
      const char* name;
      int64_t heads, kv_heads;
      bool fp8;
    };
    for (const Shape& sh : {Shape{"32/8 heads, bf16", kHeads, kKvHeads, false},
                            Shape{"16/4 heads (TP=2 rank), FP8", kHeads / 2, kRankKv, true}}) {
      const int splits = g_splits > 0 ? g_splits
                                      : PlanPrefillSplits(1, sh.heads, sh.kv_heads, kChunk,
                                                          kList, num_sms);
      auto shape_params = [&](const Lists& l, PrefillGather gather, uint16_t* dst) {
        PrefillAttentionParams p = params_for(l, splits, nullptr, dst);
        p.num_heads = sh.heads;
        p.num_kv_heads = sh.kv_heads;
        p.gather = gather;
        if (sh.fp8) {
          p.kv_type = KvCacheType::kFp8E4M3;
          p.k_cache = k8.get();
          p.v_cache = v8.get();
          p.k_scale = scales.get();
          p.v_scale = scales.get();
        }
        return p;
      };
      const PrefillAttentionParams shape = shape_params(sets[0]->lists(), PrefillGather::kOn, 0);
      DeviceBuffer<char> ws(std::max<size_t>(1, PrefillAttentionWorkspaceBytes(shape)));
      const int64_t out_elems = kChunk * sh.heads * kDim;
      // Check: cache-reading and gathered tuned runs against the CUDA-core fallback, and the two
      // tuned runs the same bits.
      std::vector<uint16_t> tuned[2];
      for (int g = 0; g < 2; ++g) {
        out.Poison();
        PrefillAttentionParams p = shape_params(
            sets[0]->lists(), g ? PrefillGather::kOn : PrefillGather::kOff, out.get());
        p.workspace = ws.get();
        TS_CUDA_CHECK(PrefillAttention(p, g_stream));
        TS_CUDA_CHECK(cudaDeviceSynchronize());
        tuned[g] = out.Download();
        tuned[g].resize(static_cast<size_t>(out_elems));
      }
      out_ref.Poison();
      TS_CUDA_CHECK(SimplePrefillAttention(
          shape_params(sets[0]->lists(), PrefillGather::kOff, out_ref.get()), g_stream));
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      auto want = out_ref.Download();
      want.resize(static_cast<size_t>(out_elems));
      double err2 = 0.0, ref2 = 0.0;
      bool nan = false;
      for (size_t i = 0; i < want.size(); ++i) {
        const double a = gpu_test::Bf16BitsToFloat(tuned[0][i]);
        const double b = gpu_test::Bf16BitsToFloat(want[i]);
        nan |= std::isnan(a) || std::isnan(b);
        err2 += (a - b) * (a - b);
        ref2 += b * b;
      }
      const double rel = std::sqrt(err2 / ref2);
      const bool same = tuned[0] == tuned[1];
      const bool ok = !nan && rel < 1e-2 && same;
      std::printf("check: sparse list (%lld entries), %s: tuned vs SimplePrefillAttention rel L2 "
                  "%.2e, gathered %s -> %s\n", static_cast<long long>(kList), sh.name, rel,
                  same ? "same bits" : "DIFFERS", ok ? "OK" : "FAILED");
      if (!ok) return 1;
      const double flops = 4.0 * kDim * sh.heads * sets[0]->visible_sum;
      for (int g = 0; g < 2; ++g) {
        const double ms = GraphMedianMs(
            [&](int r) {
              PrefillAttentionParams p = shape_params(
                  sets[r % 8]->lists(), g ? PrefillGather::kOn : PrefillGather::kOff, out.get());
              p.workspace = ws.get();
              TS_CUDA_CHECK(PrefillAttention(p, g_stream));
            },
            reps * 2);
        char what[96], note[64];
        std::snprintf(what, sizeof(what), "sparse 3200, %s%s", sh.name, g ? ", gathered" : "");
        std::snprintf(note, sizeof(note), "%d split(s), graph", splits);
        const double kv_bytes = 2.0 * kList * sh.kv_heads * kDim * (sh.fp8 ? 1 : 2);
        std::printf("%-52s %10.4f %9.1f %9.1f  %s\n", what, ms, flops / ms / 1e9,
                    kv_bytes / ms / 1e6, note);
        if (!sh.fp8) csv.Add(g ? "ours_sparse_attention" : "ours_sparse_attention_ungathered", 0,
                             ms);
      }
    }
  }

  // ---- Dense chunk over N cached tokens. ----
  const int64_t sizes[] = {32 << 10, 128 << 10, 512 << 10, 1 << 20};
  std::vector<double> dense_ms;
  for (int64_t n : sizes) {
    std::vector<int32_t> slots(static_cast<size_t>(n + kChunk)), positions(slots.size());
    std::iota(slots.begin(), slots.begin() + n, 0);
    std::iota(positions.begin(), positions.end(), 0);
    for (int64_t i = 0; i < kChunk; ++i) slots[n + i] = static_cast<int32_t>(kMaxN + i);
    auto pr = MakeProblem(slots, positions, n, static_cast<int32_t>(n));
    const int splits = Splits(n + kChunk, num_sms);
    auto p = params_for(pr->lists(), splits, nullptr, out.get());
    DeviceBuffer<char> ws(std::max<size_t>(1, PrefillAttentionWorkspaceBytes(p)));
    p.workspace = ws.get();
    const int r = n >= (512 << 10) ? (quick ? 3 : 5) : reps;
    const double ms = MedianMs([&](int) { TS_CUDA_CHECK(PrefillAttention(p, g_stream)); }, r, 1);
    const double flops = 4.0 * kDim * kHeads * pr->visible_sum;
    char what[64], note[64];
    std::snprintf(what, sizeof(what), "dense N=%lldK + 512 chunk", static_cast<long long>(n >> 10));
    std::snprintf(note, sizeof(note), "%d split(s)", splits);
    std::printf("%-52s %10.4f %9.1f %9.1f  %s\n", what, ms, flops / ms / 1e9,
                2.0 * (n + kChunk) * kRowBytes / ms / 1e6, note);
    csv.Add("ours_dense_attention", n, ms);
    dense_ms.push_back(ms);
  }

  // ---- (b) The full TokenSelect chunk step. ----
  std::printf("\n(b) TokenSelect chunk step (selection query, score + soft vote + top-%lld over "
              "[%lld, N - %lld), list, attention over %lld entries)\n",
              static_cast<long long>(kTopK), static_cast<long long>(kInit),
              static_cast<long long>(kLocal), static_cast<long long>(kList));
  std::printf("%-10s %9s %9s %9s %9s %9s %10s %12s\n", "N", "selq ms", "select", "list",
              "attn", "sum", "step ms", "dense/step");
  DeviceBuffer<float> sel_q(static_cast<size_t>(kHeads * kDim));
  DeviceBuffer<int32_t> list_slots(kList), list_pos(kList), vis(kChunk), qpos(kChunk);
  const std::vector<int32_t> q_indptr = {0, static_cast<int32_t>(kChunk)};
  const std::vector<int32_t> kv_indptr = {0, static_cast<int32_t>(kList)};
  DeviceBuffer<int32_t> d_q_indptr(q_indptr), d_kv_indptr(kv_indptr);
  const int step_splits = Splits(kList, num_sms);
  DeviceBuffer<char> attn_ws(std::max<size_t>(
      1, PrefillAttentionWorkspaceBytes(params_for(
             {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, kList}, step_splits, nullptr,
             nullptr))));
  for (size_t si = 0; si < 4; ++si) {
    const int64_t n = sizes[si];
    const int64_t cands = n - kInit - kLocal;
    // Disjoint slot windows of n tokens (a request per window) rotated between reps.
    const int sets = static_cast<int>(std::min<int64_t>(8, kMaxN / n));
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> cand_slots;
    for (int s = 0; s < sets; ++s) {
      std::vector<int32_t> c(static_cast<size_t>(cands));
      std::iota(c.begin(), c.end(), static_cast<int32_t>(s * n + kInit));
      cand_slots.push_back(std::make_unique<DeviceBuffer<int32_t>>(c));
    }
    bench::ExactSelection sel(cands, kTopK, kHeads, kKvHeads, kDim);
    sel.score.query = sel_q.get();
    sel.score.k_cache = kc;
    // The engine's chain at this length (CudaSelectionAttention).
    std::unique_ptr<bench::BoundSelection> bound_sel;
    if (cands >= kBoundVoteMinCandidates) {
      bound_sel = std::make_unique<bench::BoundSelection>(sel, kTopK);
    }
    const int32_t* picks = bound_sel ? bound_sel->top.get() : sel.top.get();
    auto selq = [&](int) {
      TS_CUDA_CHECK(BuildSelectionQuery(sel_q.get(), qp, kQStride, kChunk, kHeads, kDim, kLocal,
                                        inv_freq.get(), g_stream));
    };
    auto select = [&](int r) {
      sel.score.slots = cand_slots[r % sets]->get();
      TS_CUDA_CHECK(bound_sel ? bound_sel->Run(g_stream) : sel.Run(g_stream));
    };
    auto build = [&](int r) {
      BuildTokenSelectList<<<(kList + 255) / 256, 256, 0, g_stream>>>(
          list_slots.get(), list_pos.get(), vis.get(), qpos.get(), picks,
          cand_slots[r % sets]->get(), static_cast<int32_t>((r % sets) * n),
          static_cast<int32_t>(n), static_cast<int32_t>(kMaxN));
      TS_CUDA_CHECK(cudaGetLastError());
    };
    const Lists step_lists = {d_q_indptr.get(),
                              d_kv_indptr.get(),
                              list_slots.get(),
                              list_pos.get(),
                              vis.get(),
                              qpos.get(),
                              kList};
    auto attend = [&](int) {
      TS_CUDA_CHECK(PrefillAttention(params_for(step_lists, step_splits, attn_ws.get(), out.get()),
                                     g_stream));
    };
    auto step = [&](int r) {
      selq(r);
      select(r);
      build(r);
      attend(r);
    };
    // Sanity: the step's list is ascending within the selected part and in range.
    out.Poison();
    step(0);
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto ls = list_slots.Download();
    bool list_ok = std::is_sorted(ls.begin(), ls.begin() + kSelected) &&
                   std::adjacent_find(ls.begin(), ls.begin() + kSelected) == ls.begin() + kSelected &&
                   ls[0] == 0 && ls[kSelected - 1] == n - 1;
    const auto o = out.Download();
    for (uint16_t bits : o) list_ok &= !std::isnan(gpu_test::Bf16BitsToFloat(bits));
    if (!list_ok) {
      std::printf("check: TokenSelect step at N=%lld FAILED (list or output)\n",
                  static_cast<long long>(n));
      return 1;
    }
    const int gr = quick ? 5 : 10;
    const double t_selq = GraphMedianMs(selq, gr);
    const double t_select = GraphMedianMs(select, gr);
    const double t_build = GraphMedianMs(build, gr);
    const double t_attn = GraphMedianMs(attend, gr);
    const double t_step = GraphMedianMs(step, gr);
    std::printf("%-10s %9.4f %9.4f %9.4f %9.4f %9.4f %10.4f %11.1fx\n",
                (std::to_string(n >> 10) + "K").c_str(), t_selq, t_select, t_build, t_attn,
                t_selq + t_select + t_build + t_attn, t_step, dense_ms[si] / t_step);
    csv.Add("ours_step", n, t_step);
    csv.Add("ours_step_select", n, t_select);
    csv.Add("ours_step_attention", n, t_attn);
  }
  std::printf("dense/step: our dense chunk-512 PrefillAttention over N (a) / our TokenSelect step "
              "(b), same binary\n");
  if (csv.f != nullptr) std::fclose(csv.f);
  return 0;
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) { return tokenselect::kernels::cuda::Main(argc, argv); }
