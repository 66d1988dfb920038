// Span detection for the span index (Ltri-LLM; docs/DESIGN.md section 4, docs/selection.md):
// from one chunk's causal attention map A (chunk_attention.h, c x c, summed over heads) to the
// chunk's spans and their index tokens.
//
//   1. Threshold tau = the p-th percentile of A's causal entries (j <= i), nearest-rank on the
//      ascending order: element floor(p / 100 * (m - 1)) of the m = c (c + 1) / 2 sorted values.
//   2. B = A - tau on causal entries, 0 above the diagonal. The score of span [x, y] (chunk
//      offsets, inclusive) is the sum of B over its triangle: rows x..y, columns x..row. Since B
//      is 0 above the diagonal this is the square rows x..y, columns x..y of B, read from 2-D
//      prefix sums in O(1); all c (c + 1) / 2 spans cost O(c^2).
//   3. NMS: spans with a score > 0, best first (higher score, then lower x, then lower y); a span
//      is kept when its 1-D IoU |intersection| / |union| (in tokens) with every kept span is
//      <= the IoU threshold.
//   4. Gaps: every maximal run of tokens that no kept span covers becomes a "gap span" (its
//      score is its triangle score, usually <= 0), so the spans cover the whole chunk.
//   5. Index-vector counts (row mode): for a kept span with score s, the neighbour score n is the
//      mean score of the kept spans next to it in position order (the previous and the next
//      kept span; gap spans are not neighbours). r_a = clamp(s / n, 0, 1) (1 when it has no
//      neighbour), r_v = exp(-lambda (1 - r_a)), and the count is
//      min_vectors + round((max_vectors - min_vectors) * r_v), at most the span's length. Gap
//      spans get min_vectors. Why adjacent kept spans: they are the competing semantic units
//      around the span; suppressed overlapping spans share most of its mass, so their ratio is
//      always about 1 and says nothing.
//   6. Index tokens: the count highest-scoring tokens of the span, token score = the column sum
//      of A within the span's triangle, sum_{r = j..y} A[r, j] (ties: lower index). Their
//      un-rotated keys in the layer's K cache are the span's index vectors.
#ifndef TOKENSELECT_ENGINE_SELECTION_SPAN_DETECTION_H_
#define TOKENSELECT_ENGINE_SELECTION_SPAN_DETECTION_H_

#include <cstdint>
#include <vector>

#include "engine/selection/selection_options.h"

namespace tokenselect::engine {

// A span of chunk offsets [x, y] (inclusive) and its triangle score.
struct SpanCandidate {
  int32_t x = 0;
  int32_t y = 0;
  double score = 0.0;
};

// One detected span, chunk-relative.
struct DetectedSpan {
  int32_t x = 0;  // inclusive
  int32_t y = 0;  // inclusive
  double score = 0.0;
  bool gap = false;
  std::vector<int32_t> index_tokens;  // chunk offsets, ascending
};

// Step 1. a: [c, c]; percentile in [0, 100]; c >= 1.
float CausalPercentile(const std::vector<float>& a, int64_t c, double percentile);

// Step 2: 2-D prefix sums of B = A - tau (causal part), in double.
class TriangleScorer {
 public:
  TriangleScorer(const std::vector<float>& a, int64_t c, float threshold);
  // Sum of B over the triangle of [x, y], 0 <= x <= y < c.
  double Score(int64_t x, int64_t y) const;
  int64_t c() const { return c_; }

 private:
  int64_t c_;
  std::vector<double> prefix_;  // [(c + 1) * (c + 1)]: sum of B[r][col], r < R, col < C
};

// 1-D IoU of inclusive intervals [x1, y1], [x2, y2] in tokens.
double IntervalIoU(int64_t x1, int64_t y1, int64_t x2, int64_t y2);

// Step 3 over the given candidates (every one is considered, whatever its score); returns the
// kept spans in the order they were kept (best first).
std::vector<SpanCandidate> NonMaxSuppression(std::vector<SpanCandidate> candidates,
                                             double iou_threshold);

// Step 5's count for a span with `score` and neighbour score `neighbour` (has_neighbour false:
// r_a = 1), clamped to [min_vectors, min(max_vectors, length)] (length >= 1).
int64_t IndexVectorCount(double score, double neighbour, bool has_neighbour, double lambda,
                         int64_t min_vectors, int64_t max_vectors, int64_t length);

// The lambda of `layer`: options.lambda_early below options.early_layers, else options.lambda.
double SpanLambda(const SpanOptions& options, int64_t layer);

// Steps 1 to 6: the chunk's spans in position order (by x), covering [0, c).
std::vector<DetectedSpan> DetectSpans(const std::vector<float>& a, int64_t c,
                                      const SpanOptions& options, double lambda);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SPAN_DETECTION_H_
