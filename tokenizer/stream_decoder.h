// Incremental detokenization for token streams: Push returns only text that is final, never
// half a UTF-8 character, and the concatenation of every Push and the Flush equals
// Tokenizer::Decode of all the ids (tests/unit/tokenizer/stream_decoder_test.cc checks this on
// random sequences). Text is held back only while later tokens could still change it:
//   byte-level BPE: the bytes of an unfinished UTF-8 character;
//   SentencePiece: a run of <0xNN> byte-fallback tokens (HF decodes the run as one piece, or as
//   one U+FFFD per byte when the run as a whole is not valid UTF-8), and trailing characters a
//   final Strip may remove. The leading "▁" space of the first piece is dropped as Decode does.
#ifndef TOKENSELECT_TOKENIZER_STREAM_DECODER_H_
#define TOKENSELECT_TOKENIZER_STREAM_DECODER_H_

#include <cstdint>
#include <string>

#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::tokenizer {

class StreamDecoder {
 public:
  // `tokenizer` must outlive this object. Not thread-safe; one per stream.
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Feeds one id; returns the newly completed text (often empty). Unknown ids are skipped.
  std::string Push(int32_t id);

  // Returns whatever is still held back and starts a new stream.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  DecoderState state_;
};

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_STREAM_DECODER_H_
