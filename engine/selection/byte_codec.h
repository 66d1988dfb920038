// Little-endian byte encoding and the FNV-1a hash shared by the selection state's binary layouts
// (span_index.h, layer_state.h). Readers take a cursor and fail instead of reading past the end.
#ifndef TOKENSELECT_ENGINE_SELECTION_BYTE_CODEC_H_
#define TOKENSELECT_ENGINE_SELECTION_BYTE_CODEC_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace tokenselect::engine::codec {

inline uint32_t Fnv1a(const char* data, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(data[i]);
    h *= 16777619u;
  }
  return h;
}

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Sequential reader over bytes; every Read fails (returns false) past the end.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  bool U32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = GetU32(bytes_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (remaining() < 8) return false;
    *v = GetU64(bytes_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool Bytes(size_t n, absl::string_view* v) {
    if (remaining() < n) return false;
    *v = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace tokenselect::engine::codec

#endif  // TOKENSELECT_ENGINE_SELECTION_BYTE_CODEC_H_
