// CPU kernel benchmarks (kernels/ops.h, cpu namespace): Linear and GatherAttention at Llama-3-8B
// shapes (hidden 4096, H = 32, H_kv = 8, head_dim 128), with the napkin math as counters:
//   bytes_per_second  bytes that must be read (weights for Linear; the visible K and V rows for
//                     attention), to compare with BM_CopyCeiling (read + write of a 512 MiB
//                     buffer by all threads, the machine's practical streaming ceiling). Working
//                     sets that fit in the last-level cache can beat it;
//   FLOP/s            2 m n k for Linear; 4 h d per visible (query head, key) pair for attention
//                     (q.k and p.v), the RoPE and softmax work not counted.
// Run: build-*/bin/bench_kernels_cpu [--benchmark_filter=...]. Threads: OMP_NUM_THREADS (our
// parallel loops), OPENBLAS_NUM_THREADS (Linear's sgemm).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/gather_attention.h"
#include "kernels/ops.h"

namespace tokenselect::kernels {
namespace {

// Uniform values in [-1, 1) from xorshift32: fast enough for GiB-sized caches.
std::vector<float> Random(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 1u;
  for (float& x : v) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    x = static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return v;
}

void SetRates(benchmark::State& state, double bytes, double flops) {
  state.counters["bytes_per_second"] = benchmark::Counter(
      bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

// The streaming ceiling: all threads copying 512 MiB (beyond any L3) in 1 MiB blocks; counts
// read + write bytes.
void BM_CopyCeiling(benchmark::State& state) {
  const int64_t n = int64_t{128} << 20;  // floats
  const int64_t block = int64_t{256} << 10;
  std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n), 0.0f);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n / block; ++b) {
      std::memcpy(dst.data() + b * block, src.data() + b * block, block * sizeof(float));
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, 2.0 * static_cast<double>(n) * sizeof(float), 0.0);
}
BENCHMARK(BM_CopyCeiling)->Unit(benchmark::kMillisecond)->UseRealTime();

// Linear: args m, k, n.
void BM_Linear(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const std::vector<float> x = Random(static_cast<size_t>(m * k), 1);
  const std::vector<float> w = Random(static_cast<size_t>(n * k), 2);
  std::vector<float> y(static_cast<size_t>(m * n));
  for (auto _ : state) {
    cpu::Linear(y.data(), x.data(), w.data(), nullptr, m, k, n);
    benchmark::DoNotOptimize(y.data());
  }
  SetRates(state, 4.0 * static_cast<double>(n * k), 2.0 * static_cast<double>(m * n * k));
}
BENCHMARK(BM_Linear)
    ->Args({1, 4096, 4096})    // decode q/o projection: streams 64 MiB of weights
    ->Args({1, 4096, 14336})   // decode MLP up/gate
    ->Args({512, 4096, 4096})  // prefill chunk
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A Llama-3-8B attention layer over a paged cache: the list visits 64-token pages in random
// order. Prefill: the last num_queries entries are the chunk itself, causally masked.
struct AttentionSetup {
  int64_t num_queries, kv_len, num_heads = 32, num_kv_heads = 8, head_dim = 128;
  std::vector<float> q, k_cache, v_cache, inv_freq, out;
  std::vector<int32_t> q_positions, kv_slots, kv_positions, visible;

  AttentionSetup(int64_t nq, int64_t kv) : num_queries(nq), kv_len(kv) {
    q = Random(static_cast<size_t>(nq * num_heads * head_dim), 3);
    k_cache = Random(static_cast<size_t>(kv * num_kv_heads * head_dim), 4);
    v_cache = Random(k_cache.size(), 5);
    out.resize(q.size());
    RopeParams rope;
    rope.theta = 500000.0;
    inv_freq = RopeInverseFrequencies(rope);
    const int64_t page = 64, pages = (kv + page - 1) / page;
    std::vector<int64_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(6));
    for (int64_t j = 0; j < kv; ++j) {
      const int64_t slot = order[static_cast<size_t>(j / page)] * page + j % page;
      kv_slots.push_back(static_cast<int32_t>(std::min(slot, kv - 1)));
      kv_positions.push_back(static_cast<int32_t>(j));  // compact positions
    }
    for (int64_t i = 0; i < nq; ++i) {
      q_positions.push_back(static_cast<int32_t>(kv - nq + i));
      visible.push_back(static_cast<int32_t>(kv - nq + i + 1));
    }
  }

  GatherAttentionParams Params() {
    GatherAttentionParams p;
    p.out = out.data();
    p.q = q.data();
    p.q_positions = q_positions.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.kv_slots = kv_slots.data();
    p.kv_positions = kv_positions.data();
    p.visible = num_queries > 1 ? visible.data() : nullptr;
    p.inv_freq = inv_freq.data();
    p.num_queries = num_queries;
    p.kv_len = kv_len;
    p.num_heads = num_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    return p;
  }

  // Visible (query, key) pairs, summed over queries.
  double VisiblePairs() const {
    double pairs = 0.0;
    for (int64_t i = 0; i < num_queries; ++i) {
      pairs += static_cast<double>(num_queries > 1 ? visible[static_cast<size_t>(i)] : kv_len);
    }
    return pairs;
  }
};

enum Schedule : int64_t { kPublic = 0, kSplitKeys = 1, kTiled = 2 };

// GatherAttention: args num_queries, kv_len, schedule.
void BM_GatherAttention(benchmark::State& state) {
  AttentionSetup setup(state.range(0), state.range(1));
  const GatherAttentionParams params = setup.Params();
  for (auto _ : state) {
    switch (state.range(2)) {
      case kSplitKeys:
        cpu::internal::GatherAttentionSplitKeys(params, {});
        break;
      case kTiled:
        cpu::internal::GatherAttentionTiled(params, {});
        break;
      default:
        cpu::GatherAttention(params);
    }
    benchmark::DoNotOptimize(setup.out.data());
  }
  const double kv_bytes =
      2.0 * 4.0 * static_cast<double>(setup.kv_len * setup.num_kv_heads * setup.head_dim);
  const double flops =
      4.0 * static_cast<double>(setup.num_heads * setup.head_dim) * setup.VisiblePairs();
  SetRates(state, kv_bytes, flops);
}
BENCHMARK(BM_GatherAttention)
    ->ArgNames({"queries", "kv_len", "schedule"})
    ->Args({1, 8192, kPublic})    // decode over 8K keys
    ->Args({1, 32768, kPublic})   // decode over 32K keys
    ->Args({1, 32768, kTiled})    // the other schedule, for comparison
    ->Args({512, 8192, kPublic})  // a 512-query prefill chunk over 8K keys (causal tail)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Variants under study: one schedule with explicit options. Args: num_queries, kv_len,
// schedule, tile_keys, rows_per_item (tiled) or num_splits (split keys).
void BM_GatherAttentionTuning(benchmark::State& state) {
  AttentionSetup setup(state.range(0), state.range(1));
  const GatherAttentionParams params = setup.Params();
  cpu::internal::GatherAttentionOptions options;
  options.tile_keys = state.range(3);
  if (state.range(2) == kTiled) {
    options.rows_per_item = state.range(4);
  } else {
    options.num_splits = state.range(4);
  }
  for (auto _ : state) {
    if (state.range(2) == kTiled) {
      cpu::internal::GatherAttentionTiled(params, options);
    } else {
      cpu::internal::GatherAttentionSplitKeys(params, options);
    }
    benchmark::DoNotOptimize(setup.out.data());
  }
  const double kv_bytes =
      2.0 * 4.0 * static_cast<double>(setup.kv_len * setup.num_kv_heads * setup.head_dim);
  SetRates(state, kv_bytes,
           4.0 * static_cast<double>(setup.num_heads * setup.head_dim) * setup.VisiblePairs());
}
BENCHMARK(BM_GatherAttentionTuning)
    ->ArgNames({"queries", "kv_len", "schedule", "tile", "rows_or_splits"})
    ->Args({512, 8192, kTiled, 256, 16})
    ->Args({512, 8192, kTiled, 1024, 16})
    ->Args({512, 8192, kTiled, 512, 8})
    ->Args({512, 8192, kTiled, 512, 32})
    ->Args({512, 8192, kTiled, 512, 64})
    ->Args({1, 32768, kSplitKeys, 64, 0})
    ->Args({1, 32768, kSplitKeys, 128, 0})
    ->Args({1, 32768, kSplitKeys, 256, 16})
    ->Args({1, 32768, kSplitKeys, 256, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tokenselect::kernels

BENCHMARK_MAIN();
