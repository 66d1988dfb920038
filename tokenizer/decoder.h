// The tokenizer.json "decoder": turns token strings back into text. Supported types and
// the orders real files use:
//   ByteLevel                        (GPT-2, Llama-3, Qwen2: alphabet -> bytes -> UTF-8, lossy)
//   Sequence[Replace("▁"," "), ByteFallback, Fuse, Strip(" ", 1, 0)]  (Llama-2, Mistral, Yi)
//   Metaspace, ByteFallback, Replace (String pattern), Fuse, Strip in any order, except that
//   only Strip may follow Fuse and ByteLevel must stand alone
//   null                             (tokens joined with spaces, as HF does)
// Two implementations share one parsed chain: DecodeTokens mirrors HF's decode_chain step by
// step over the whole token list; DecoderState does the same work incrementally for streams and
// is tested to give the same text for every token sequence.
#ifndef TOKENSELECT_TOKENIZER_DECODER_H_
#define TOKENSELECT_TOKENIZER_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

class Decoder {
 public:
  // The null decoder: tokens joined with single spaces.
  Decoder() = default;

  // Builds from the JSON value at `path` (null gives the null decoder). InvalidArgument naming
  // the field for unsupported types or orders ("decoder.decoders[2]: Replace after Fuse is not
  // supported").
  static absl::StatusOr<Decoder> FromJson(const internal::Json& value, absl::string_view path);

  // Decodes a whole token list at once (HF semantics).
  std::string DecodeTokens(const std::vector<std::string>& tokens) const;

 private:
  friend class DecoderState;
  enum class Mode { kJoinWithSpaces, kByteLevel, kPieces };
  struct Step {
    enum class Kind { kReplace, kByteFallback, kMetaspace, kStrip, kFuse };
    Kind kind;
    std::string pattern;      // kReplace: text to find; kMetaspace/kStrip: the character
    std::string content;      // kReplace: replacement
    bool strip_first = true;  // kMetaspace: prepend_scheme != never
    int start = 0;            // kStrip
    int stop = 0;             // kStrip
  };
  absl::Status Parse(const internal::Json& value, absl::string_view path);

  Mode mode_ = Mode::kJoinWithSpaces;
  std::vector<Step> steps_;  // kPieces only
  // Index in steps_ of the first Fuse (steps_.size() if none); only Strip steps follow it.
  size_t fuse_index_ = 0;
};

// Incremental decoding: Push the token strings one at a time; each call appends the text that
// is final (will not change whatever tokens follow) to `out`; Finish appends the rest.
// Concatenating all output equals Decoder::DecodeTokens of all the tokens.
class DecoderState {
 public:
  explicit DecoderState(const Decoder* decoder);

  void Push(absl::string_view token, std::string* out);
  void Finish(std::string* out);

 private:
  // Runs `element` through steps [stage, fuse) and then into the fused output.
  void Feed(size_t stage, std::string element, std::string* out);
  // Emits the byte run buffered by the ByteFallback step at `stage`.
  void FlushBytes(size_t stage, std::string* out);
  // Appends fused text, applying the Strip steps after Fuse.
  void EmitFused(absl::string_view text, std::string* out);

  const Decoder* decoder_;
  size_t tokens_seen_ = 0;
  std::string pending_bytes_;           // kByteLevel: incomplete UTF-8 suffix
  std::vector<std::string> byte_runs_;  // per step: ByteFallback's buffered bytes
  std::vector<int64_t> elements_seen_;  // per step: elements that reached it
  // Strip after Fuse, folded into one: leading characters still to strip, and trailing
  // content characters held back because a final Strip may remove them.
  std::string fused_strip_char_;
  int leading_to_strip_ = 0;
  int trailing_limit_ = 0;
  int held_count_ = 0;
};

// True (and *byte set) for a token of the form <0xNN> as ByteFallback reads it.
bool ParseByteToken(absl::string_view token, uint8_t* byte);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_DECODER_H_
