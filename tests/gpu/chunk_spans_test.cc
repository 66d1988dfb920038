// Needs a GPU (label gpu): what the GPU computes from a forward step's own attention for the
// stateful policies - the received attention (ChunkReceivedAttention, span_scoring.h), the chunk's
// attention map and the span detection (ChunkAttentionMap, DetectChunkSpans, span_detection.h) -
// against the CPU code (engine/selection/chunk_attention.cc, span_detection.cc) on the same bf16
// queries and keys. GQA groups 1, 4 and 8, head dims 64 and 128, odd chunk sizes, far positions;
// outputs are poisoned before the launch and checked fully written.
//
// The map is fp32 on the GPU (the CPU's probabilities are double), so it is compared with a
// tolerance. Detection is exact: DetectChunkSpans on the GPU's map must return what the CPU's
// DetectSpans returns on the downloaded map - the same spans, the same double scores, the same
// index tokens - on real chunk maps and on planted ones, for several option sets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "engine/selection/chunk_attention.h"
#include "engine/selection/span_detection.h"
#include "gtest/gtest.h"
#include "kernels/cuda/span_detection.h"
#include "kernels/cuda/span_scoring.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct ChunkCase {
  int64_t num_new, num_heads, num_kv_heads, head_dim, first_position;
};

// A chunk of random bf16 queries (rows of a wider buffer, as the model's fused QKV output) and
// keys in a shuffled slot pool, on the host (the CPU's observation) and on the device.
struct Chunk {
  ChunkCase shape;
  int64_t stride = 0, num_slots = 0;
  std::vector<float> q, keys, inv_freq;
  std::vector<int32_t> slots, positions;
  DeviceBuffer<uint16_t> d_q, d_k;
  DeviceBuffer<int32_t> d_slots;
  DeviceBuffer<float> d_inv;

  explicit Chunk(const ChunkCase& c, float key_gain = 1.0f) : shape(c) {
    std::mt19937 rng(static_cast<uint32_t>(c.num_new * 31 + c.head_dim + c.num_heads));
    const int64_t row = c.num_heads * c.head_dim, kv_row = c.num_kv_heads * c.head_dim;
    stride = row + 24;
    num_slots = c.num_new + 77;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q_rows(static_cast<size_t>(c.num_new * stride));
    for (float& x : q_rows) x = normal(rng);
    d_q = DeviceBuffer<uint16_t>(gpu_test::RoundToBf16(&q_rows));
    q.resize(static_cast<size_t>(c.num_new * row));
    for (int64_t i = 0; i < c.num_new; ++i) {
      std::copy(q_rows.begin() + i * stride, q_rows.begin() + i * stride + row,
                q.begin() + i * row);
    }
    keys.resize(static_cast<size_t>(num_slots * kv_row));
    for (float& x : keys) x = key_gain * normal(rng);
    d_k = DeviceBuffer<uint16_t>(gpu_test::RoundToBf16(&keys));
    std::vector<int32_t> perm(static_cast<size_t>(num_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    slots.assign(perm.begin(), perm.begin() + c.num_new);
    d_slots = DeviceBuffer<int32_t>(slots);
    positions.resize(static_cast<size_t>(c.num_new));
    for (int64_t i = 0; i < c.num_new; ++i) {
      positions[i] = static_cast<int32_t>(c.first_position + i);
    }
    RopeParams rope;
    rope.head_dim = c.head_dim;
    inv_freq = RopeInverseFrequencies(rope);
    d_inv = DeviceBuffer<float>(inv_freq);
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(shape.head_dim)); }

  engine::ChunkObservation Observation() const {
    engine::ChunkObservation obs;
    obs.first_token = shape.first_position;
    obs.num_new = shape.num_new;
    obs.q = q.data();
    obs.num_heads = shape.num_heads;
    obs.num_kv_heads = shape.num_kv_heads;
    obs.head_dim = shape.head_dim;
    obs.k_cache = keys.data();
    obs.slots = slots.data();
    obs.num_slots = num_slots;
    obs.positions = positions.data();
    obs.inv_freq = inv_freq.data();
    obs.scale = scale();
    return obs;
  }

  ReceivedAttentionParams Params(float* received, void* workspace) const {
    ReceivedAttentionParams p;
    p.received = received;
    p.workspace = workspace;
    p.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
    p.q_row_stride = stride;
    p.k_cache = d_k.get();
    p.slots = d_slots.get();
    p.first_position = shape.first_position;
    p.num_new = shape.num_new;
    p.num_heads = shape.num_heads;
    p.num_kv_heads = shape.num_kv_heads;
    p.head_dim = shape.head_dim;
    p.inv_freq = d_inv.get();
    p.scale = scale();
    return p;
  }
};

// Worst |gpu - cpu| / (1 + |cpu|) over the first n entries; each must be written (finite).
double WorstRelative(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t n) {
  double worst = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::isfinite(gpu[j])) << "entry " << j << " not written";
    worst = std::max(worst, std::fabs(gpu[j] - cpu[j]) / (1.0 + std::fabs(cpu[j])));
  }
  return worst;
}

void ExpectRefused(const ReceivedAttentionParams& p, int64_t row) {
  ReceivedAttentionParams bad = p;
  bad.head_dim = 96;
  EXPECT_EQ(ChunkReceivedAttention(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.num_kv_heads = p.num_heads + 1;
  EXPECT_EQ(ChunkReceivedAttention(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.q_row_stride = row - 1;
  EXPECT_EQ(ChunkReceivedAttention(bad, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ChunkAttentionMap(p, nullptr, nullptr), cudaErrorInvalidValue);
}

class ChunkAttentionGpuTest : public ::testing::TestWithParam<ChunkCase> {};

// The received attention of a step's new tokens (ChunkReceivedAttention) against the CPU's
// ChunkAttentionMap + ReceivedAttention.
TEST_P(ChunkAttentionGpuTest, ReceivedAttentionMatchesCpu) {
  const ChunkCase c = GetParam();
  const Chunk chunk(c);
  const engine::ChunkObservation obs = chunk.Observation();
  ASSERT_TRUE(engine::ValidateChunkObservation(obs).ok());
  std::vector<float> map, cpu;
  engine::ChunkAttentionMap(obs, &map);
  engine::ReceivedAttention(map, c.num_new, &cpu);

  DeviceBuffer<float> d_received(static_cast<size_t>(c.num_new + 5));  // 5 past the end: NaN
  d_received.Poison();
  DeviceBuffer<char> ws(ReceivedAttentionWorkspaceBytes(c.num_new, c.num_heads));
  ws.Poison();
  const ReceivedAttentionParams p = chunk.Params(d_received.get(), ws.get());
  ASSERT_EQ(ChunkReceivedAttention(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gpu = d_received.Download();
  // Each received value is a sum of up to (c - j) * H probabilities: fp32 against the CPU's
  // double, and RoPE's fp32 angles (fast sincos on the GPU) at large positions.
  const double worst = WorstRelative(gpu, cpu, c.num_new);
  double total = 0.0;
  for (int64_t j = 0; j < c.num_new; ++j) total += gpu[j];
  for (int64_t j = c.num_new; j < c.num_new + 5; ++j) {
    EXPECT_TRUE(std::isnan(gpu[j])) << "wrote past the end";
  }
  std::printf(
      "received attention c %lld h %lld/%lld d %lld at %lld: worst |gpu - cpu| / "
      "(1 + cpu) %.3g\n",
      static_cast<long long>(c.num_new), static_cast<long long>(c.num_heads),
      static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.first_position), worst);
  EXPECT_LT(worst, 1e-4);
  // Every row of every head sums to 1.
  EXPECT_NEAR(total, static_cast<double>(c.num_new * c.num_heads), 1e-4 * c.num_new * c.num_heads);
  if (c.num_new == 1) {
    EXPECT_EQ(gpu[0], static_cast<float>(c.num_heads));  // a decode step
  }
  ExpectRefused(p, c.num_heads * c.head_dim);
}

// The Ltri-LLM span detection on the GPU, given the map, is DetectSpans exactly.
void ExpectDetectionMatchesCpu(const DeviceBuffer<float>& d_map, int64_t c,
                               const engine::SpanOptions& options, double lambda,
                               const char* what) {
  const std::vector<float> map = gpu_test::DownloadFrom(d_map.get(), c * c);
  const std::vector<engine::DetectedSpan> cpu = engine::DetectSpans(map, c, options, lambda);

  SpanDetectOptions o;
  o.threshold_percentile = options.threshold_percentile;
  o.nms_iou = options.nms_iou;
  o.min_vectors = options.min_vectors;
  o.max_vectors = options.max_vectors;
  o.lambda = lambda;
  const int64_t max_spans = SpanDetectMaxSpans(c);
  const int64_t max_tokens = SpanDetectMaxTokens(c, o.max_vectors);
  DeviceBuffer<int32_t> counts(2), x(max_spans), y(max_spans), gap(max_spans),
      indptr(max_spans + 1), tokens(max_tokens);
  DeviceBuffer<double> score(max_spans);
  for (DeviceBuffer<int32_t>* b : {&counts, &x, &y, &gap, &indptr, &tokens}) b->Poison();
  score.Poison();
  DeviceBuffer<char> ws(SpanDetectWorkspaceBytes(c));
  ws.Poison();
  SpanDetectParams p;
  p.out = {counts.get(), x.get(), y.get(), gap.get(), indptr.get(), score.get(), tokens.get()};
  p.map = d_map.get();
  p.c = c;
  p.options = o;
  p.workspace = ws.get();
  ASSERT_EQ(DetectChunkSpans(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> n = counts.Download();
  ASSERT_EQ(n[0], static_cast<int32_t>(cpu.size())) << what << ": span count";
  const std::vector<int32_t> gx = x.Download(), gy = y.Download(), gg = gap.Download(),
                             gi = indptr.Download(), gt = tokens.Download();
  const std::vector<double> gs = score.Download();
  int64_t kept = 0, vectors = 0;
  ASSERT_EQ(gi[0], 0);
  for (size_t s = 0; s < cpu.size(); ++s) {
    const engine::DetectedSpan& e = cpu[s];
    ASSERT_EQ(gx[s], e.x) << what << ": span " << s;
    ASSERT_EQ(gy[s], e.y) << what << ": span " << s;
    ASSERT_EQ(gg[s] != 0, e.gap) << what << ": span " << s;
    ASSERT_EQ(gs[s], e.score) << what << ": span " << s << " [" << e.x << ", " << e.y << "]";
    const std::vector<int32_t> got(gt.begin() + gi[s], gt.begin() + gi[s + 1]);
    ASSERT_EQ(got, e.index_tokens) << what << ": span " << s << " [" << e.x << ", " << e.y << "]";
    kept += e.gap ? 0 : 1;
    vectors += static_cast<int64_t>(e.index_tokens.size());
  }
  EXPECT_EQ(n[1], vectors);
  EXPECT_EQ(gi[cpu.size()], vectors);
  std::printf("%s: c %lld, %lld spans (%lld kept by NMS), %lld index tokens\n", what,
              static_cast<long long>(c), static_cast<long long>(cpu.size()),
              static_cast<long long>(kept), static_cast<long long>(vectors));
}

// The map (ChunkAttentionMap) against the CPU's, and the span detection on it.
TEST_P(ChunkAttentionGpuTest, MapAndSpansMatchCpu) {
  const ChunkCase c = GetParam();
  // Larger keys make peaked attention (local structure for the spans to find).
  const Chunk chunk(c, 3.0f);
  std::vector<float> map, received;
  engine::ChunkAttentionMap(chunk.Observation(), &map);
  engine::ReceivedAttention(map, c.num_new, &received);

  const int64_t cc = c.num_new * c.num_new;
  DeviceBuffer<float> d_map(static_cast<size_t>(cc + 3)), d_received(c.num_new + 3);
  d_map.Poison();
  d_received.Poison();
  DeviceBuffer<char> ws(ChunkAttentionMapWorkspaceBytes(c.num_new, c.num_heads));
  ws.Poison();
  const ReceivedAttentionParams p = chunk.Params(d_received.get(), ws.get());
  ASSERT_EQ(ChunkAttentionMap(p, d_map.get(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gmap = d_map.Download(), grec = d_received.Download();
  const double worst_map = WorstRelative(gmap, map, cc);
  const double worst_received = WorstRelative(grec, received, c.num_new);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isnan(gmap[cc + i])) << "map written past the end";
    EXPECT_TRUE(std::isnan(grec[c.num_new + i])) << "received written past the end";
  }
  for (int64_t i = 0; i < c.num_new; ++i) {
    for (int64_t j = i + 1; j < c.num_new; ++j) ASSERT_EQ(gmap[i * c.num_new + j], 0.0f);
  }
  std::printf("chunk map c %lld h %lld/%lld d %lld: worst map %.3g, received %.3g\n",
              static_cast<long long>(c.num_new), static_cast<long long>(c.num_heads),
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim), worst_map,
              worst_received);
  EXPECT_LT(worst_map, 1e-5);
  EXPECT_LT(worst_received, 1e-4);
  // The received attention is exactly the downloaded map's column sums (the CPU's order).
  std::vector<float> from_gpu_map;
  engine::ReceivedAttention(std::vector<float>(gmap.begin(), gmap.begin() + cc), c.num_new,
                            &from_gpu_map);
  for (int64_t j = 0; j < c.num_new; ++j) ASSERT_EQ(grec[j], from_gpu_map[j]) << j;
  // A workspace sized for longer chunks (a provider's, for its largest step) serves this one,
  // with the same result.
  DeviceBuffer<char> big_ws(ChunkAttentionMapWorkspaceBytes(c.num_new + 1500, c.num_heads));
  big_ws.Poison();
  DeviceBuffer<float> d_map2(static_cast<size_t>(cc)), d_received2(c.num_new);
  ASSERT_EQ(ChunkAttentionMap(chunk.Params(d_received2.get(), big_ws.get()), d_map2.get(), nullptr),
            cudaSuccess);
  EXPECT_TRUE(d_map2.Download() == std::vector<float>(gmap.begin(), gmap.begin() + cc));

  engine::SpanOptions options;
  ExpectDetectionMatchesCpu(d_map, c.num_new, options, 3.0, "chunk map, defaults");
  options.threshold_percentile = 60.0;
  options.nms_iou = 0.3;
  options.min_vectors = 2;
  options.max_vectors = 32;
  ExpectDetectionMatchesCpu(d_map, c.num_new, options, 20.0, "chunk map, p60 iou 0.3 2..32");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ChunkAttentionGpuTest,
    ::testing::Values(ChunkCase{1, 32, 8, 128, 5000},      // a decode step
                      ChunkCase{64, 32, 8, 128, 0},        // Llama-3-8B heads, one chunk
                      ChunkCase{37, 8, 8, 64, 100},        // g = 1, odd chunk
                      ChunkCase{100, 16, 2, 64, 123456},   // g = 8, far positions
                      ChunkCase{45, 12, 3, 128, 7},        // odd kv heads
                      ChunkCase{513, 8, 2, 128, 40000}));  // many tiles

// Planted maps: causal attention rows made of a few local triangles (the structure spans are
// meant to find), uniform rows (every entry of a row tied) and random rows, for option sets
// that keep many or few spans.
TEST(SpanDetectionGpuTest, PlantedMapsMatchCpu) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (const int64_t c : {1, 2, 3, 17, 64, 255, 512}) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> a(static_cast<size_t>(c * c), 0.0f);
      for (int64_t i = 0; i < c; ++i) {
        // Triangles of 7 to 40 tokens: row i attends mostly inside its own triangle.
        const int64_t start = kind == 0 ? (i / (7 + (i / 40) % 34)) * (7 + (i / 40) % 34) : 0;
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          const float v = kind == 1 ? 1.0f : (kind == 0 && j >= start ? 4.0f : 0.05f) * uni(rng);
          a[i * c + j] = v;
          sum += v;
        }
        for (int64_t j = 0; j <= i; ++j) a[i * c + j] = static_cast<float>(a[i * c + j] / sum);
      }
      const DeviceBuffer<float> d_map(a);
      const char* names[] = {"planted triangles", "uniform rows", "random rows"};
      engine::SpanOptions options;
      ExpectDetectionMatchesCpu(d_map, c, options, 3.0, names[kind]);
      options.threshold_percentile = 99.0;
      options.nms_iou = 0.0;
      options.max_vectors = 1;
      ExpectDetectionMatchesCpu(d_map, c, options, 3.0, names[kind]);
      options.threshold_percentile = 30.0;
      options.nms_iou = 0.6;
      options.min_vectors = 3;
      options.max_vectors = 64;
      ExpectDetectionMatchesCpu(d_map, c, options, 20.0, names[kind]);
    }
  }
}

TEST(SpanDetectionGpuTest, RefusesBadParameters) {
  const int64_t c = 16;
  DeviceBuffer<float> d_map(static_cast<size_t>(c * c));
  const int64_t max_spans = SpanDetectMaxSpans(c);
  DeviceBuffer<int32_t> ints(static_cast<size_t>(8 * max_spans + 8 * 16));
  DeviceBuffer<double> score(max_spans);
  DeviceBuffer<char> ws(SpanDetectWorkspaceBytes(c));
  SpanDetectParams p;
  int32_t* base = ints.get();
  p.out = {base,
           base + 8,
           base + 8 + max_spans,
           base + 8 + 2 * max_spans,
           base + 8 + 3 * max_spans,
           score.get(),
           base + 8 + 5 * max_spans};
  p.map = d_map.get();
  p.c = c;
  p.workspace = ws.get();
  SpanDetectParams bad = p;
  bad.c = 0;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.options.threshold_percentile = 101.0;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.options.min_vectors = 0;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.options.lambda = NAN;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.map = nullptr;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.out.index_tokens = nullptr;
  EXPECT_EQ(DetectChunkSpans(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
