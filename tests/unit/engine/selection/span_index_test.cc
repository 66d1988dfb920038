// SpanIndex (span_index.h): appending chunks, truncation, and the binary layout: round trip and
// corrupted input.
#include "engine/selection/span_index.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

DetectedSpan Span(int x, int y, double score, std::vector<int32_t> vectors, bool gap = false) {
  DetectedSpan s;
  s.x = x;
  s.y = y;
  s.score = score;
  s.gap = gap;
  s.index_tokens = std::move(vectors);
  return s;
}

SpanIndex TwoChunks() {
  SpanIndex index;
  index.AppendChunk(
      0, 10, {Span(0, 3, 2.5, {1, 2}), Span(4, 4, -0.5, {4}, true), Span(5, 9, 7.25, {5, 7, 9})});
  index.AppendChunk(10, 6, {Span(0, 5, 1.0, {3})});
  return index;
}

TEST(SpanIndexTest, AppendsChunksAtAbsolutePositions) {
  const SpanIndex index = TwoChunks();
  EXPECT_EQ(index.covered_end(), 16);
  ASSERT_EQ(index.spans().size(), 4u);
  EXPECT_EQ(index.spans()[3].begin, 10);
  EXPECT_EQ(index.spans()[3].end, 16);
  EXPECT_EQ(std::vector<int32_t>(index.vectors(index.spans()[2]).begin(),
                                 index.vectors(index.spans()[2]).end()),
            (std::vector<int32_t>{5, 7, 9}));
  EXPECT_EQ(index.vectors(index.spans()[3])[0], 13);
  EXPECT_EQ(index.num_index_tokens(), 7);
}

TEST(SpanIndexTest, SerialisationRoundTrips) {
  const SpanIndex index = TwoChunks();
  const std::string bytes = index.Serialize();
  EXPECT_EQ(bytes.size(), 36u + 16u * 4 + 4u * 7);
  EXPECT_EQ(bytes.substr(0, 4), "TSSI");
  auto back = SpanIndex::Deserialize(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == index);
  auto empty = SpanIndex::Deserialize(SpanIndex().Serialize());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->covered_end(), 0);
}

TEST(SpanIndexTest, EveryCorruptedByteAndEveryTruncationIsRejected) {
  const std::string bytes = TwoChunks().Serialize();
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    auto r = SpanIndex::Deserialize(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(SpanIndex::Deserialize(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(SpanIndex::Deserialize(bytes + "x").ok());
}

// Re-hashes a modified body so that the structural checks, not the hash, must catch it.
std::string Rehash(std::string bytes) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i + 4 < bytes.size(); ++i) {
    h ^= static_cast<uint8_t>(bytes[i]);
    h *= 16777619u;
  }
  for (int i = 0; i < 4; ++i)
    bytes[bytes.size() - 4 + i] = static_cast<char>((h >> (8 * i)) & 0xff);
  return bytes;
}

TEST(SpanIndexTest, StructurallyInvalidContentIsRejectedWithAValidHash) {
  const std::string bytes = TwoChunks().Serialize();
  auto expect_bad = [](const std::string& b, const std::string& what) {
    auto r = SpanIndex::Deserialize(Rehash(b));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
  };
  std::string b = bytes;
  b[4] = 2;  // version
  expect_bad(b, "version");
  b = bytes;
  b[32] = 5, b[33] = 0;  // span 0 begin 5 > end 4
  expect_bad(b, "span 0");
  b = bytes;
  b[32 + 16 * 4] = 9;  // first index token 9 is outside span 0 [0, 4)
  expect_bad(b, "outside span 0");
  b = bytes;
  b[32 + 12] = 3;  // span 0 claims 3 vectors: counts no longer line up with the spans
  EXPECT_FALSE(SpanIndex::Deserialize(Rehash(b)).ok());
  b = bytes;
  b[32 + 8 + 3] = 0x7f, b[32 + 8 + 2] = static_cast<char>(0xc0);  // score NaN
  expect_bad(b, "score");
  b = bytes;
  b[32 + 32] = 3;  // span 2 begins at 3, before span 1 (at 4)
  expect_bad(b, "order");
}

TEST(SpanIndexTest, TruncateDropsAndClipsSpans) {
  SpanIndex index = TwoChunks();
  index.TruncateTo(8);
  EXPECT_EQ(index.covered_end(), 8);
  ASSERT_EQ(index.spans().size(), 3u);
  EXPECT_EQ(index.spans()[2].end, 8);
  EXPECT_EQ(index.spans()[2].num_vectors, 2);  // 5, 7 (9 dropped)
  auto back = SpanIndex::Deserialize(index.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == index);
}

}  // namespace
}  // namespace tokenselect::engine
