// NFC normalization (Unicode Standard Annex #15): full canonical decomposition, canonical
// ordering of combining marks, then canonical composition. Hangul syllables are decomposed and
// composed algorithmically; everything else comes from the generated kDecompositions table.
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"

namespace tokenselect::tokenizer {
namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28;
constexpr int kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

const internal::Decomposition* FindDecomposition(char32_t cp) {
  const auto* begin = internal::kDecompositions;
  const auto* end = begin + internal::kDecompositionsSize;
  const auto* it = std::lower_bound(
      begin, end, cp,
      [](const internal::Decomposition& d, char32_t value) { return d.code_point < value; });
  return (it != end && it->code_point == cp) ? it : nullptr;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const internal::Decomposition* d = cp < 0xC0 ? nullptr : FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  Decompose(d->first, out);
  if (d->second != 0) Decompose(d->second, out);
}

uint64_t PairKey(char32_t a, char32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

const std::unordered_map<uint64_t, char32_t>& CompositionMap() {
  static const auto* map = [] {
    auto* m = new std::unordered_map<uint64_t, char32_t>();
    for (size_t i = 0; i < internal::kDecompositionsSize; ++i) {
      const internal::Decomposition& d = internal::kDecompositions[i];
      if (d.composes) (*m)[PairKey(d.first, d.second)] = d.code_point;
    }
    return m;
  }();
  return *map;
}

// Returns the primary composite of a + b, or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& map = CompositionMap();
  auto it = map.find(PairKey(a, b));
  return it == map.end() ? 0 : it->second;
}

// Normalizes a run of valid code points and appends it to `out`.
void NormalizeRun(const std::vector<char32_t>& run, std::string* out) {
  std::vector<char32_t> buf;
  buf.reserve(run.size() + 8);
  for (char32_t cp : run) Decompose(cp, &buf);
  // Canonical ordering: stable sort each maximal run of non-starters by combining class.
  for (size_t i = 0; i < buf.size();) {
    if (CombiningClass(buf[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < buf.size() && CombiningClass(buf[j]) != 0) ++j;
    std::stable_sort(buf.begin() + i, buf.begin() + j,
                     [](char32_t x, char32_t y) { return CombiningClass(x) < CombiningClass(y); });
    i = j;
  }
  // Canonical composition.
  if (!buf.empty()) {
    size_t starter_pos = 0;
    char32_t starter = buf[0];
    int last_class = CombiningClass(starter) == 0 ? 0 : 256;
    size_t write = 1;
    for (size_t read = 1; read < buf.size(); ++read) {
      char32_t ch = buf[read];
      int ch_class = CombiningClass(ch);
      char32_t composite = last_class == 256 ? 0 : Compose(starter, ch);
      if (composite != 0 && (last_class < ch_class || last_class == 0)) {
        buf[starter_pos] = composite;
        starter = composite;
        continue;
      }
      if (ch_class == 0) {
        starter_pos = write;
        starter = ch;
      }
      last_class = ch_class;
      buf[write++] = ch;
    }
    buf.resize(write);
  }
  for (char32_t cp : buf) AppendUtf8(cp, out);
}

}  // namespace

std::string NormalizeNfc(absl::string_view text) {
  bool ascii = std::all_of(text.begin(), text.end(),
                           [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) return std::string(text);
  std::string out;
  out.reserve(text.size());
  std::vector<char32_t> run;
  for (size_t pos = 0; pos < text.size();) {
    Utf8Char c = DecodeUtf8At(text, pos);
    if (c.cp == kInvalidCodepoint) {
      NormalizeRun(run, &out);
      run.clear();
      out.push_back(text[pos]);
    } else {
      run.push_back(c.cp);
    }
    pos += c.length;
  }
  NormalizeRun(run, &out);
  return out;
}

}  // namespace tokenselect::tokenizer
