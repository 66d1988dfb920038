// The GPT-2 byte-to-unicode mapping used by byte-level BPE (GPT-2, Llama-3, Qwen2): every byte
// maps to one printable character, so any byte string becomes a string of visible characters.
// Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to the same code point; the other 68 bytes map,
// in increasing order, to U+0100, U+0101, ... (space 0x20 -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
#ifndef TOKENSELECT_TOKENIZER_BYTE_LEVEL_H_
#define TOKENSELECT_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tokenselect::tokenizer {

// The code point that byte `b` maps to.
char32_t ByteToUnicode(uint8_t b);

// The byte that code point `cp` stands for, or nullopt if `cp` is not in the alphabet.
std::optional<uint8_t> UnicodeToByte(char32_t cp);

// Maps every byte of `bytes` to its character and returns the UTF-8 result.
std::string BytesToByteLevel(absl::string_view bytes);

// Inverse of BytesToByteLevel for one token: when every character of `token` is in the
// alphabet, appends the bytes it stands for and returns true; otherwise appends nothing and
// returns false (HF then uses the token's own UTF-8 bytes, e.g. for added tokens).
bool ByteLevelToBytes(absl::string_view token, std::string* out);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_BYTE_LEVEL_H_
