#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {
namespace {

struct ByteTables {
  std::array<char32_t, 256> byte_to_cp;
  std::array<std::string, 256> byte_to_utf8;
  // Code points of the alphabet are all below 0x144.
  std::array<int16_t, 0x144> cp_to_byte;
};

bool MapsToItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables();
    t->cp_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = MapsToItself(b) ? static_cast<char32_t>(b) : 0x100 + next++;
      t->byte_to_cp[b] = cp;
      AppendUtf8(cp, &t->byte_to_utf8[b]);
      t->cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

char32_t ByteToUnicode(uint8_t b) { return Tables().byte_to_cp[b]; }

std::optional<uint8_t> UnicodeToByte(char32_t cp) {
  if (cp >= Tables().cp_to_byte.size() || Tables().cp_to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(Tables().cp_to_byte[cp]);
}

std::string BytesToByteLevel(absl::string_view bytes) {
  const ByteTables& t = Tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

bool ByteLevelToBytes(absl::string_view token, std::string* out) {
  size_t start = out->size();
  for (size_t pos = 0; pos < token.size();) {
    Utf8Char c = DecodeUtf8At(token, pos);
    std::optional<uint8_t> b = UnicodeToByte(c.cp);
    if (c.cp == kInvalidCodepoint || !b.has_value()) {
      out->resize(start);
      return false;
    }
    out->push_back(static_cast<char>(*b));
    pos += c.length;
  }
  return true;
}

}  // namespace tokenselect::tokenizer
