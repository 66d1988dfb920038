#include "engine/selection/span_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "engine/selection/byte_codec.h"

namespace tokenselect::engine {
namespace {

using codec::BitsFloat;
using codec::FloatBits;
using codec::Fnv1a;
using codec::GetU32;
using codec::GetU64;
using codec::PutU32;
using codec::PutU64;

constexpr char kMagic[4] = {'T', 'S', 'S', 'I'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kSpanBytes = 16;

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("span index: ", what));
}

}  // namespace

void SpanIndex::AppendChunk(int64_t first_token, int64_t c,
                            const std::vector<DetectedSpan>& spans) {
  TS_CHECK(first_token == covered_end_, "chunk at {} but the index covers [0, {})", first_token,
           covered_end_);
  for (const DetectedSpan& d : spans) {
    IndexedSpan s;
    s.begin = static_cast<int32_t>(first_token + d.x);
    s.end = static_cast<int32_t>(first_token + d.y + 1);
    s.score = static_cast<float>(d.score);
    s.num_vectors = static_cast<int32_t>(d.index_tokens.size());
    s.first_vector = static_cast<int64_t>(index_tokens_.size());
    for (int32_t t : d.index_tokens) index_tokens_.push_back(static_cast<int32_t>(first_token + t));
    spans_.push_back(s);
  }
  covered_end_ = first_token + c;
}

void SpanIndex::TruncateTo(int64_t num_tokens) {
  if (num_tokens >= covered_end_) return;
  std::vector<IndexedSpan> spans;
  std::vector<int32_t> tokens;
  for (IndexedSpan s : spans_) {
    if (s.begin >= num_tokens) continue;
    s.end = static_cast<int32_t>(std::min<int64_t>(s.end, num_tokens));
    const int64_t first = static_cast<int64_t>(tokens.size());
    for (int32_t t : vectors(s)) {
      if (t < num_tokens) tokens.push_back(t);
    }
    s.first_vector = first;
    s.num_vectors = static_cast<int32_t>(tokens.size() - first);
    spans.push_back(s);
  }
  spans_ = std::move(spans);
  index_tokens_ = std::move(tokens);
  covered_end_ = std::max<int64_t>(num_tokens, 0);
}

void SpanIndex::Clear() {
  spans_.clear();
  index_tokens_.clear();
  covered_end_ = 0;
}

std::string SpanIndex::Serialize() const {
  std::string out;
  out.reserve(kHeaderBytes + kSpanBytes * spans_.size() + 4 * index_tokens_.size() + 4);
  out.append(kMagic, 4);
  PutU32(&out, kVersion);
  PutU64(&out, static_cast<uint64_t>(covered_end_));
  PutU64(&out, spans_.size());
  PutU64(&out, index_tokens_.size());
  for (const IndexedSpan& s : spans_) {
    PutU32(&out, static_cast<uint32_t>(s.begin));
    PutU32(&out, static_cast<uint32_t>(s.end));
    PutU32(&out, FloatBits(s.score));
    PutU32(&out, static_cast<uint32_t>(s.num_vectors));
  }
  for (int32_t t : index_tokens_) PutU32(&out, static_cast<uint32_t>(t));
  PutU32(&out, Fnv1a(out.data(), out.size()));
  return out;
}

absl::StatusOr<SpanIndex> SpanIndex::Deserialize(absl::string_view bytes) {
  if (bytes.size() < kHeaderBytes + 4) return Corrupt("shorter than the header");
  const char* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) return Corrupt("bad magic");
  if (GetU32(p + 4) != kVersion) return Corrupt(absl::StrCat("unknown version ", GetU32(p + 4)));
  const uint64_t covered = GetU64(p + 8);
  const uint64_t num_spans = GetU64(p + 16);
  const uint64_t num_tokens = GetU64(p + 24);
  const uint64_t limit = bytes.size();
  if (num_spans > limit / kSpanBytes || num_tokens > limit / 4 ||
      kHeaderBytes + kSpanBytes * num_spans + 4 * num_tokens + 4 != limit) {
    return Corrupt(absl::StrCat("size ", limit, " does not match ", num_spans, " spans and ",
                                num_tokens, " index tokens"));
  }
  if (GetU32(p + limit - 4) != Fnv1a(p, limit - 4)) return Corrupt("hash mismatch");
  if (covered > static_cast<uint64_t>(kMaxSelectionTokens)) return Corrupt("covered_end too big");
  SpanIndex index;
  index.covered_end_ = static_cast<int64_t>(covered);
  const char* tokens = p + kHeaderBytes + kSpanBytes * num_spans;
  int64_t next_vector = 0;
  for (uint64_t i = 0; i < num_spans; ++i) {
    const char* q = p + kHeaderBytes + kSpanBytes * i;
    IndexedSpan s;
    s.begin = static_cast<int32_t>(GetU32(q));
    s.end = static_cast<int32_t>(GetU32(q + 4));
    s.score = BitsFloat(GetU32(q + 8));
    s.num_vectors = static_cast<int32_t>(GetU32(q + 12));
    s.first_vector = next_vector;
    if (s.begin < 0 || s.end <= s.begin || s.end > index.covered_end_) {
      return Corrupt(absl::StrCat("span ", i, " [", s.begin, ", ", s.end, ") is invalid"));
    }
    if (i > 0 && s.begin < index.spans_.back().begin) {
      return Corrupt(absl::StrCat("span ", i, " is out of order"));
    }
    if (!std::isfinite(s.score)) return Corrupt(absl::StrCat("span ", i, " has a bad score"));
    if (s.num_vectors < 0 ||
        static_cast<uint64_t>(next_vector) + static_cast<uint64_t>(s.num_vectors) > num_tokens) {
      return Corrupt(absl::StrCat("span ", i, " has a bad vector count"));
    }
    for (int32_t v = 0; v < s.num_vectors; ++v) {
      const int32_t t = static_cast<int32_t>(GetU32(tokens + 4 * (next_vector + v)));
      if (t < s.begin || t >= s.end) {
        return Corrupt(absl::StrCat("index token ", t, " outside span ", i));
      }
      index.index_tokens_.push_back(t);
    }
    next_vector += s.num_vectors;
    index.spans_.push_back(s);
  }
  if (static_cast<uint64_t>(next_vector) != num_tokens) {
    return Corrupt("vector counts do not add up to the index token count");
  }
  return index;
}

bool operator==(const SpanIndex& a, const SpanIndex& b) {
  if (a.covered_end_ != b.covered_end_ || a.index_tokens_ != b.index_tokens_ ||
      a.spans_.size() != b.spans_.size()) {
    return false;
  }
  for (size_t i = 0; i < a.spans_.size(); ++i) {
    const IndexedSpan& x = a.spans_[i];
    const IndexedSpan& y = b.spans_[i];
    if (x.begin != y.begin || x.end != y.end || FloatBits(x.score) != FloatBits(y.score) ||
        x.num_vectors != y.num_vectors || x.first_vector != y.first_vector) {
      return false;
    }
  }
  return true;
}

}  // namespace tokenselect::engine
