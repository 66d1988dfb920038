#include "engine/selection/layer_state.h"

#include <cmath>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/selection/byte_codec.h"

namespace tokenselect::engine {
namespace {

constexpr char kMagic[4] = {'T', 'S', 'L', 'S'};
constexpr uint32_t kVersion = 1;

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("selection layer state: ", what));
}

}  // namespace

void SelectionLayerState::TruncateTo(int64_t num_tokens) {
  if (static_cast<int64_t>(received.size()) > num_tokens) received.resize(num_tokens);
  spans.TruncateTo(num_tokens);
  if (cascade.next_token > num_tokens) cascade.Configure({});
}

std::string SerializeLayerState(const SelectionLayerState& state) {
  using namespace codec;  // NOLINT: the encoders
  std::string out(kMagic, 4);
  PutU32(&out, kVersion);
  PutU64(&out, state.received.size());
  for (float r : state.received) PutU32(&out, FloatBits(r));
  const std::string spans = state.spans.Serialize();
  PutU64(&out, spans.size());
  out += spans;
  const CascadeCache& c = state.cascade;
  PutU64(&out, static_cast<uint64_t>(c.next_token));
  PutU64(&out, static_cast<uint64_t>(c.num_sub_caches()));
  for (int64_t i = 0; i < c.num_sub_caches(); ++i) {
    PutU64(&out, static_cast<uint64_t>(c.capacities()[i]));
    PutU64(&out, static_cast<uint64_t>(c.offers(i)));
    PutU64(&out, c.sub_cache(i).size());
    for (const CascadeCache::Entry& e : c.sub_cache(i)) {
      PutU32(&out, static_cast<uint32_t>(e.token));
      PutU32(&out, FloatBits(e.ema));
    }
  }
  PutU32(&out, Fnv1a(out.data(), out.size()));
  return out;
}

absl::StatusOr<SelectionLayerState> DeserializeLayerState(absl::string_view bytes) {
  if (bytes.size() < 12) return Corrupt("shorter than the header");
  if (codec::GetU32(bytes.data() + bytes.size() - 4) !=
      codec::Fnv1a(bytes.data(), bytes.size() - 4)) {
    return Corrupt("hash mismatch");
  }
  codec::Reader in(bytes.substr(0, bytes.size() - 4));
  absl::string_view magic;
  uint32_t version = 0;
  if (!in.Bytes(4, &magic) || magic != absl::string_view(kMagic, 4)) return Corrupt("bad magic");
  if (!in.U32(&version) || version != kVersion) {
    return Corrupt(absl::StrCat("unknown version ", version));
  }
  SelectionLayerState state;
  uint64_t n = 0;
  if (!in.U64(&n) || n > in.remaining() / 4) return Corrupt("truncated received attention");
  state.received.resize(n);
  for (float& r : state.received) {
    uint32_t bits = 0;
    in.U32(&bits);
    r = codec::BitsFloat(bits);
    if (!std::isfinite(r)) return Corrupt("non-finite received attention");
  }
  absl::string_view span_bytes;
  if (!in.U64(&n) || !in.Bytes(n, &span_bytes)) return Corrupt("truncated span index");
  ASSIGN_OR_RETURN(state.spans, SpanIndex::Deserialize(span_bytes));
  uint64_t next = 0, num_subs = 0;
  if (!in.U64(&next) || !in.U64(&num_subs) || num_subs > 64 ||
      next > static_cast<uint64_t>(kMaxSelectionTokens)) {
    return Corrupt("bad cascade header");
  }
  std::vector<int64_t> caps(num_subs), offers(num_subs);
  std::vector<std::deque<CascadeCache::Entry>> subs(num_subs);
  for (uint64_t i = 0; i < num_subs; ++i) {
    uint64_t cap = 0, off = 0, size = 0;
    if (!in.U64(&cap) || !in.U64(&off) || !in.U64(&size) || size > in.remaining() / 8 ||
        cap > static_cast<uint64_t>(kMaxSelectionTokens) || size > cap ||
        off > static_cast<uint64_t>(kMaxSelectionTokens)) {
      return Corrupt(absl::StrCat("bad cascade sub-cache ", i));
    }
    caps[i] = static_cast<int64_t>(cap);
    offers[i] = static_cast<int64_t>(off);
    for (uint64_t j = 0; j < size; ++j) {
      uint32_t token = 0, ema = 0;
      in.U32(&token);
      in.U32(&ema);
      CascadeCache::Entry e{static_cast<int32_t>(token), codec::BitsFloat(ema)};
      if (e.token < 0 || static_cast<uint64_t>(e.token) >= next || !std::isfinite(e.ema) ||
          (!subs[i].empty() && e.token <= subs[i].back().token)) {
        return Corrupt(absl::StrCat("bad cascade entry in sub-cache ", i));
      }
      subs[i].push_back(e);
    }
  }
  if (in.remaining() != 0) return Corrupt("trailing bytes");
  state.cascade.Restore(caps, std::move(subs), offers, static_cast<int64_t>(next));
  return state;
}

}  // namespace tokenselect::engine
