// SpanIndex: one request's span index for one layer (Ltri-LLM; docs/DESIGN.md section 4). Built
// in prefill, one Append per forward step from the chunk's spans (span_detection.h), and freed
// with the request (it lives in the provider's per-layer state, layer_state.h). Decode uses it
// as a coarse filter (span_policy.h).
//
// Spans are half-open token ranges [begin, end) in ascending begin order (NMS may leave kept
// spans overlapping by an IoU up to its threshold; gap spans fill the rest), so every token in
// [0, covered_end) belongs to at least one span. Each span owns num_vectors index tokens
// (ascending, inside the span): its index vectors are those tokens' un-rotated keys in the
// layer's K cache, which the index does not copy (the keys travel with the KV anyway).
//
// Binary layout (Serialize / Deserialize), all integers little-endian:
//   offset 0   4 bytes  magic "TSSI"
//          4   u32      version = 1
//          8   i64      covered_end
//         16   u64      S = number of spans
//         24   u64      V = number of index tokens
//         32   S x 16   spans: i32 begin, i32 end, f32 score (IEEE-754 bits), i32 num_vectors
//              V x 4    index tokens (i32), span after span
//         end  u32      FNV-1a 32-bit hash of every preceding byte
// Total 36 + 16 S + 4 V bytes.
#ifndef TOKENSELECT_ENGINE_SELECTION_SPAN_INDEX_H_
#define TOKENSELECT_ENGINE_SELECTION_SPAN_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/selection/span_detection.h"

namespace tokenselect::engine {

struct IndexedSpan {
  int32_t begin = 0;  // first token
  int32_t end = 0;    // one past the last token
  float score = 0.0f;
  int32_t num_vectors = 0;
  int64_t first_vector = 0;  // offset into index_tokens()
};

class SpanIndex {
 public:
  // Appends the spans of the chunk [first_token, first_token + c) (chunk-relative, covering the
  // chunk; DetectSpans). covered_end becomes first_token + c. Checked: first_token ==
  // covered_end() (chunks arrive in order).
  void AppendChunk(int64_t first_token, int64_t c, const std::vector<DetectedSpan>& spans);

  // Drops spans that begin at or after num_tokens and clips the rest (after a rollback);
  // index tokens at or after num_tokens are dropped (a span keeps at least none).
  void TruncateTo(int64_t num_tokens);
  void Clear();

  const std::vector<IndexedSpan>& spans() const { return spans_; }
  absl::Span<const int32_t> vectors(const IndexedSpan& span) const {
    return absl::MakeConstSpan(index_tokens_.data() + span.first_vector, span.num_vectors);
  }
  int64_t covered_end() const { return covered_end_; }
  int64_t num_index_tokens() const { return static_cast<int64_t>(index_tokens_.size()); }

  std::string Serialize() const;
  // DataLoss when the bytes are not a valid serialised index: wrong size, magic, version or
  // hash; spans not ascending, empty, or beyond covered_end; vector counts that do not add up
  // to V; index tokens outside their span; a non-finite score.
  static absl::StatusOr<SpanIndex> Deserialize(absl::string_view bytes);

  friend bool operator==(const SpanIndex& a, const SpanIndex& b);

 private:
  std::vector<IndexedSpan> spans_;
  std::vector<int32_t> index_tokens_;
  int64_t covered_end_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SPAN_INDEX_H_
