// Span detection (span_detection.h) against brute-force references: triangle scores, the
// percentile, NMS, planted triangles, the index-vector count mapping and index tokens; and the
// chunk attention map (chunk_attention.h).
#include "engine/selection/span_detection.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/selection/chunk_attention.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

// A c x c causal map: background uniform [0, 1), planted triangles [x, y] at `value`.
std::vector<float> PlantedMap(int64_t c, const std::vector<std::pair<int, int>>& blocks,
                              const std::vector<float>& values, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> a(c * c, 0.0f);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) a[i * c + j] = u(rng);
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (int i = blocks[b].first; i <= blocks[b].second; ++i) {
      for (int j = blocks[b].first; j <= i; ++j) a[i * c + j] = values[b];
    }
  }
  return a;
}

TEST(SpanDetectionTest, TriangleScoresEqualDirectSums) {
  const int64_t c = 24;
  const std::vector<float> a = PlantedMap(c, {{3, 9}}, {2.0f}, 1);
  const float tau = 0.37f;
  const TriangleScorer scorer(a, c, tau);
  for (int64_t x = 0; x < c; ++x) {
    for (int64_t y = x; y < c; ++y) {
      double direct = 0.0;
      for (int64_t r = x; r <= y; ++r) {
        for (int64_t col = x; col <= r; ++col) direct += static_cast<double>(a[r * c + col]) - tau;
      }
      ASSERT_NEAR(scorer.Score(x, y), direct, 1e-9 * (1 + std::abs(direct))) << x << " " << y;
    }
  }
}

TEST(SpanDetectionTest, PercentileIsNearestRankOfCausalEntries) {
  const int64_t c = 17;
  const std::vector<float> a = PlantedMap(c, {}, {}, 2);
  std::vector<float> causal;
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) causal.push_back(a[i * c + j]);
  }
  std::sort(causal.begin(), causal.end());
  for (double p : {0.0, 10.0, 50.0, 90.0, 99.5, 100.0}) {
    const size_t rank = static_cast<size_t>(std::floor(p / 100.0 * (causal.size() - 1)));
    EXPECT_EQ(CausalPercentile(a, c, p), causal[rank]) << p;
  }
}

// Reference NMS: repeatedly take the best remaining candidate by an explicit comparison and
// test its overlap token by token against every kept span.
std::vector<SpanCandidate> ReferenceNms(std::vector<SpanCandidate> rest, double threshold) {
  std::vector<SpanCandidate> kept;
  while (!rest.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < rest.size(); ++i) {
      const SpanCandidate& a = rest[i];
      const SpanCandidate& b = rest[best];
      if (a.score > b.score || (a.score == b.score && (a.x < b.x || (a.x == b.x && a.y < b.y)))) {
        best = i;
      }
    }
    const SpanCandidate s = rest[best];
    rest.erase(rest.begin() + best);
    bool ok = true;
    for (const SpanCandidate& k : kept) {
      int inter = 0;
      for (int t = s.x; t <= s.y; ++t) inter += (t >= k.x && t <= k.y);
      const int uni = (s.y - s.x + 1) + (k.y - k.x + 1) - inter;
      if (static_cast<double>(inter) / uni > threshold) ok = false;
    }
    if (ok) kept.push_back(s);
  }
  return kept;
}

TEST(SpanDetectionTest, NmsEqualsBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<SpanCandidate> candidates;
    std::uniform_int_distribution<int> pos(0, 63);
    std::uniform_int_distribution<int> score(0, 9);  // many exact ties
    for (int i = 0; i < 150; ++i) {
      int x = pos(rng), y = pos(rng);
      if (x > y) std::swap(x, y);
      candidates.push_back({x, y, static_cast<double>(score(rng))});
    }
    for (double thr : {0.0, 0.1, 0.5}) {
      const std::vector<SpanCandidate> got = NonMaxSuppression(candidates, thr);
      const std::vector<SpanCandidate> want = ReferenceNms(candidates, thr);
      ASSERT_EQ(got.size(), want.size()) << trial << " " << thr;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].x, want[i].x);
        EXPECT_EQ(got[i].y, want[i].y);
        EXPECT_EQ(got[i].score, want[i].score);
      }
    }
  }
}

TEST(SpanDetectionTest, PlantedTrianglesAreRecovered) {
  const int64_t c = 128;
  const std::vector<std::pair<int, int>> blocks = {{10, 25}, {40, 59}, {80, 95}};
  for (uint32_t seed : {3u, 4u, 5u}) {
    const std::vector<float> a = PlantedMap(c, blocks, {1.5f, 1.5f, 1.5f}, seed);
    SpanOptions options;  // 90th percentile, IoU 0.1
    const std::vector<DetectedSpan> spans = DetectSpans(a, c, options, 3.0);
    // The three best kept spans are exactly the planted triangles.
    std::vector<DetectedSpan> kept;
    for (const DetectedSpan& s : spans) {
      if (!s.gap) kept.push_back(s);
    }
    std::sort(kept.begin(), kept.end(),
              [](const DetectedSpan& l, const DetectedSpan& r) { return l.score > r.score; });
    ASSERT_GE(kept.size(), 3u);
    std::vector<std::pair<int, int>> top;
    for (int i = 0; i < 3; ++i) top.emplace_back(kept[i].x, kept[i].y);
    std::sort(top.begin(), top.end());
    EXPECT_EQ(top, blocks) << "seed " << seed;
    // The spans cover the chunk, in position order.
    std::vector<int> cover(c, 0);
    for (size_t i = 0; i < spans.size(); ++i) {
      if (i > 0) {
        EXPECT_GE(spans[i].x, spans[i - 1].x);
      }
      for (int t = spans[i].x; t <= spans[i].y; ++t) ++cover[t];
      for (int32_t v : spans[i].index_tokens) {
        EXPECT_GE(v, spans[i].x);
        EXPECT_LE(v, spans[i].y);
      }
    }
    for (int t = 0; t < c; ++t) EXPECT_GE(cover[t], 1) << t;
  }
}

TEST(SpanDetectionTest, IndexVectorCountMapping) {
  // count = min + round((max - min) * exp(-lambda (1 - clamp(score / neighbour, 0, 1)))).
  EXPECT_EQ(IndexVectorCount(5.0, 0.0, false, 3.0, 1, 8, 100), 8);  // no neighbour: r_a = 1
  EXPECT_EQ(IndexVectorCount(5.0, 5.0, true, 3.0, 1, 8, 100), 8);   // r_a = 1
  EXPECT_EQ(IndexVectorCount(9.0, 3.0, true, 3.0, 1, 8, 100), 8);   // clamped to 1
  EXPECT_EQ(IndexVectorCount(2.5, 5.0, true, 3.0, 1, 8, 100),
            1 + std::llround(7 * std::exp(-1.5)));  // 3
  EXPECT_EQ(IndexVectorCount(2.5, 5.0, true, 3.0, 1, 8, 100), 3);
  EXPECT_EQ(IndexVectorCount(0.5, 5.0, true, 3.0, 2, 8, 100),
            2 + std::llround(6 * std::exp(-2.7)));                  // 2
  EXPECT_EQ(IndexVectorCount(2.5, 5.0, true, 20.0, 1, 8, 100), 1);  // early layers: lambda 20
  EXPECT_EQ(IndexVectorCount(5.0, 5.0, true, 20.0, 1, 8, 100), 8);
  EXPECT_EQ(IndexVectorCount(5.0, 5.0, true, 3.0, 1, 8, 3), 3);  // at most the span length
  EXPECT_EQ(SpanLambda(SpanOptions{}, 0), 20.0);
  EXPECT_EQ(SpanLambda(SpanOptions{}, 3), 20.0);
  EXPECT_EQ(SpanLambda(SpanOptions{}, 4), 3.0);
}

TEST(SpanDetectionTest, CountsUseTheMeanOfAdjacentKeptSpansAndIndexTokensTheTriangleColumns) {
  const int64_t c = 128;
  const std::vector<std::pair<int, int>> blocks = {{10, 25}, {40, 59}, {80, 95}};
  const std::vector<float> a = PlantedMap(c, blocks, {1.5f, 1.2f, 1.5f}, 11);
  SpanOptions options;
  options.nms_iou = 0.0;
  const double lambda = 3.0;
  const std::vector<DetectedSpan> spans = DetectSpans(a, c, options, lambda);
  std::vector<DetectedSpan> kept;
  for (const DetectedSpan& s : spans) {
    if (!s.gap) kept.push_back(s);
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    double n = 0;
    int count = 0;
    if (i > 0) n += kept[i - 1].score, ++count;
    if (i + 1 < kept.size()) n += kept[i + 1].score, ++count;
    const double ra = count == 0 ? 1.0 : std::clamp(kept[i].score / (n / count), 0.0, 1.0);
    const int64_t want = std::min<int64_t>(kept[i].y - kept[i].x + 1,
                                           1 + std::llround(7 * std::exp(-lambda * (1 - ra))));
    EXPECT_EQ(static_cast<int64_t>(kept[i].index_tokens.size()), want) << i;
    // Index tokens: the best column sums within the triangle.
    std::vector<std::pair<double, int>> cols;
    for (int j = kept[i].x; j <= kept[i].y; ++j) {
      double s = 0;
      for (int r = j; r <= kept[i].y; ++r) s += a[r * c + j];
      cols.emplace_back(-s, j);
    }
    std::sort(cols.begin(), cols.end());
    std::vector<int32_t> best;
    for (int64_t t = 0; t < want; ++t) best.push_back(cols[t].second);
    std::sort(best.begin(), best.end());
    EXPECT_EQ(kept[i].index_tokens, best) << i;
  }
  for (const DetectedSpan& s : spans) {
    if (s.gap) {
      EXPECT_EQ(s.index_tokens.size(), 1u);
    }
  }
}

TEST(ChunkAttentionTest, MapIsTheCausalSoftmaxSummedOverHeads) {
  // inv_freq = 0 makes RoPE the identity, so the map is a plain causal softmax.
  const int64_t c = 9, h = 4, h_kv = 2, d = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> q(c * h * d), k((c + 3) * h_kv * d), inv_freq(d / 2, 0.0f);
  for (float& x : q) x = n(rng);
  for (float& x : k) x = n(rng);
  std::vector<int32_t> slots(c), positions(c);
  for (int64_t i = 0; i < c; ++i)
    slots[i] = static_cast<int32_t>((i * 5) % (c + 3)), positions[i] = 100 + i;
  ChunkObservation obs;
  obs.num_new = c;
  obs.q = q.data();
  obs.num_heads = h;
  obs.num_kv_heads = h_kv;
  obs.head_dim = d;
  obs.k_cache = k.data();
  obs.slots = slots.data();
  obs.num_slots = c + 3;
  obs.positions = positions.data();
  obs.inv_freq = inv_freq.data();
  obs.scale = 0.5f;
  ASSERT_TRUE(ValidateChunkObservation(obs).ok());
  std::vector<float> a;
  ChunkAttentionMap(obs, &a);
  for (int64_t i = 0; i < c; ++i) {
    std::vector<double> want(c, 0.0);
    for (int64_t hh = 0; hh < h; ++hh) {
      std::vector<double> s(i + 1);
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) {
          dot += q[(i * h + hh) * d + e] * k[(slots[j] * h_kv + hh / 2) * d + e];
        }
        s[j] = std::exp(0.5 * dot);
        z += s[j];
      }
      for (int64_t j = 0; j <= i; ++j) want[j] += s[j] / z;
    }
    for (int64_t j = 0; j < c; ++j) EXPECT_NEAR(a[i * c + j], want[j], 1e-5) << i << " " << j;
  }
  std::vector<float> received;
  ReceivedAttention(a, c, &received);
  double total = 0;
  for (float r : received) total += r;
  EXPECT_NEAR(total, c * h, 1e-3);
  obs.slots = nullptr;
  EXPECT_FALSE(ValidateChunkObservation(obs).ok());
}

}  // namespace
}  // namespace tokenselect::engine
