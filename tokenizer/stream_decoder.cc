#include "tokenizer/stream_decoder.h"

namespace tokenselect::tokenizer {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer),
      skip_special_tokens_(skip_special_tokens),
      state_(&tokenizer.decoder_) {}

std::string StreamDecoder::Push(int32_t id) {
  std::string out;
  std::string token;
  if (tokenizer_->TokenForDecode(id, skip_special_tokens_, &token)) state_.Push(token, &out);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  state_.Finish(&out);
  state_ = DecoderState(&tokenizer_->decoder_);
  return out;
}

}  // namespace tokenselect::tokenizer
