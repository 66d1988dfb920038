#include "engine/selection/span_detection.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace tokenselect::engine {
namespace {

// Index tokens of [x, y]: the `count` best column sums of A within the triangle.
std::vector<int32_t> IndexTokens(const std::vector<float>& a, int64_t c, int64_t x, int64_t y,
                                 int64_t count) {
  std::vector<std::pair<double, int32_t>> scored;
  for (int64_t j = x; j <= y; ++j) {
    double sum = 0.0;
    for (int64_t r = j; r <= y; ++r) sum += a[r * c + j];
    scored.emplace_back(sum, static_cast<int32_t>(j));
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& l, const auto& r) { return l.first > r.first; });
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(scored.size()); ++i) {
    out.push_back(scored[i].second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

float CausalPercentile(const std::vector<float>& a, int64_t c, double percentile) {
  TS_CHECK(c >= 1 && static_cast<int64_t>(a.size()) == c * c, "map {} for c = {}", a.size(), c);
  std::vector<float> values;
  values.reserve(static_cast<size_t>(c * (c + 1) / 2));
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) values.push_back(a[i * c + j]);
  }
  const double p = std::clamp(percentile, 0.0, 100.0);
  const size_t rank =
      static_cast<size_t>(std::floor(p / 100.0 * static_cast<double>(values.size() - 1)));
  std::nth_element(values.begin(), values.begin() + rank, values.end());
  return values[rank];
}

TriangleScorer::TriangleScorer(const std::vector<float>& a, int64_t c, float threshold)
    : c_(c), prefix_(static_cast<size_t>((c + 1) * (c + 1)), 0.0) {
  const int64_t w = c + 1;
  for (int64_t r = 0; r < c; ++r) {
    double row = 0.0;
    for (int64_t col = 0; col < c; ++col) {
      if (col <= r) row += static_cast<double>(a[r * c + col]) - threshold;
      prefix_[(r + 1) * w + col + 1] = prefix_[r * w + col + 1] + row;
    }
  }
}

double TriangleScorer::Score(int64_t x, int64_t y) const {
  const int64_t w = c_ + 1;
  return prefix_[(y + 1) * w + y + 1] - prefix_[x * w + y + 1] - prefix_[(y + 1) * w + x] +
         prefix_[x * w + x];
}

double IntervalIoU(int64_t x1, int64_t y1, int64_t x2, int64_t y2) {
  const int64_t inter = std::min(y1, y2) - std::max(x1, x2) + 1;
  if (inter <= 0) return 0.0;
  const int64_t uni = (y1 - x1 + 1) + (y2 - x2 + 1) - inter;
  return static_cast<double>(inter) / static_cast<double>(uni);
}

std::vector<SpanCandidate> NonMaxSuppression(std::vector<SpanCandidate> candidates,
                                             double iou_threshold) {
  std::sort(candidates.begin(), candidates.end(),
            [](const SpanCandidate& l, const SpanCandidate& r) {
              if (l.score != r.score) return l.score > r.score;
              if (l.x != r.x) return l.x < r.x;
              return l.y < r.y;
            });
  std::vector<SpanCandidate> kept;
  for (const SpanCandidate& s : candidates) {
    bool keep = true;
    for (const SpanCandidate& k : kept) {
      if (IntervalIoU(s.x, s.y, k.x, k.y) > iou_threshold) {
        keep = false;
        break;
      }
    }
    if (keep) kept.push_back(s);
  }
  return kept;
}

int64_t IndexVectorCount(double score, double neighbour, bool has_neighbour, double lambda,
                         int64_t min_vectors, int64_t max_vectors, int64_t length) {
  double ra = 1.0;
  if (has_neighbour && neighbour > 0.0) ra = std::clamp(score / neighbour, 0.0, 1.0);
  const double rv = std::exp(-lambda * (1.0 - ra));
  const int64_t upper = std::max<int64_t>(1, std::min(max_vectors, length));
  const int64_t count =
      min_vectors +
      static_cast<int64_t>(std::llround(static_cast<double>(max_vectors - min_vectors) * rv));
  return std::clamp<int64_t>(count, std::min(min_vectors, upper), upper);
}

double SpanLambda(const SpanOptions& options, int64_t layer) {
  return layer < options.early_layers ? options.lambda_early : options.lambda;
}

std::vector<DetectedSpan> DetectSpans(const std::vector<float>& a, int64_t c,
                                      const SpanOptions& options, double lambda) {
  const float tau = CausalPercentile(a, c, options.threshold_percentile);
  const TriangleScorer scorer(a, c, tau);
  std::vector<SpanCandidate> candidates;
  for (int64_t x = 0; x < c; ++x) {
    for (int64_t y = x; y < c; ++y) {
      const double s = scorer.Score(x, y);
      if (s > 0.0) {
        candidates.push_back({static_cast<int32_t>(x), static_cast<int32_t>(y), s});
      }
    }
  }
  std::vector<SpanCandidate> kept = NonMaxSuppression(std::move(candidates), options.nms_iou);
  std::sort(kept.begin(), kept.end(), [](const SpanCandidate& l, const SpanCandidate& r) {
    return l.x != r.x ? l.x < r.x : l.y < r.y;
  });

  std::vector<DetectedSpan> spans;
  std::vector<char> covered(static_cast<size_t>(c), 0);
  for (size_t i = 0; i < kept.size(); ++i) {
    const SpanCandidate& s = kept[i];
    double neighbour = 0.0;
    int n = 0;
    if (i > 0) neighbour += kept[i - 1].score, ++n;
    if (i + 1 < kept.size()) neighbour += kept[i + 1].score, ++n;
    if (n > 0) neighbour /= n;
    const int64_t length = s.y - s.x + 1;
    const int64_t count = IndexVectorCount(s.score, neighbour, n > 0, lambda, options.min_vectors,
                                           options.max_vectors, length);
    DetectedSpan d;
    d.x = s.x;
    d.y = s.y;
    d.score = s.score;
    d.index_tokens = IndexTokens(a, c, s.x, s.y, count);
    spans.push_back(std::move(d));
    for (int64_t t = s.x; t <= s.y; ++t) covered[t] = 1;
  }
  for (int64_t t = 0; t < c;) {
    if (covered[t]) {
      ++t;
      continue;
    }
    int64_t end = t;
    while (end + 1 < c && !covered[end + 1]) ++end;
    DetectedSpan d;
    d.x = static_cast<int32_t>(t);
    d.y = static_cast<int32_t>(end);
    d.score = scorer.Score(t, end);
    d.gap = true;
    d.index_tokens = IndexTokens(a, c, t, end, std::min<int64_t>(options.min_vectors, end - t + 1));
    spans.push_back(std::move(d));
    t = end + 1;
  }
  std::sort(spans.begin(), spans.end(), [](const DetectedSpan& l, const DetectedSpan& r) {
    return l.x != r.x ? l.x < r.x : l.y < r.y;
  });
  return spans;
}

}  // namespace tokenselect::engine
