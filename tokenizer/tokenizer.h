// A Hugging Face tokenizer.json tokenizer (+ optional tokenizer_config.json) for the families
// the engine serves: byte-level BPE (GPT-2, Llama-3, Qwen2) and SentencePiece-style BPE with
// byte fallback (Llama-2, Mistral, Yi). Encode runs HF's pipeline: split out added tokens,
// normalize, split out normalized added tokens, pre-tokenize, BPE, post-process. Decode runs
// the decoder chain. tests/unit/tokenizer/hf_parity_test.cc checks both against HF tokenizers.
//
// A loaded Tokenizer is immutable and safe to use from many threads.
#ifndef TOKENSELECT_TOKENIZER_TOKENIZER_H_
#define TOKENSELECT_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace tokenselect::tokenizer {

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json. NotFound when
  // tokenizer.json is missing; InvalidArgument naming the file and JSON field for malformed or
  // unsupported content ("tokenizer.json: model.type 'Unigram' is not supported").
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromDirectory(const std::string& dir);

  // As LoadFromDirectory, from the files' contents; `tokenizer_config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromStrings(
      absl::string_view tokenizer_json, absl::string_view tokenizer_config_json = "");

  // Token ids of `text` (any bytes; invalid UTF-8 is tokenized byte by byte). With
  // `add_special_tokens`, adds what the post_processor adds (e.g. Llama-3's <|begin_of_text|>),
  // or, when tokenizer_config.json sets add_bos_token / add_eos_token, BOS / EOS accordingly.
  std::vector<int32_t> Encode(absl::string_view text, bool add_special_tokens) const;

  // Text of `ids`. Ids that are neither in the vocab nor added tokens are skipped (as HF does);
  // with `skip_special_tokens`, so are special added tokens.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  // Added tokens first, then the model vocab (HF order).
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;

  // One past the largest id of the model vocab and the added tokens (the embedding rows a
  // model needs at least).
  int32_t vocab_size() const { return vocab_size_; }
  // From tokenizer_config.json's bos_token, else the single token the post_processor puts in
  // front; nullopt when neither exists.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  // tokenizer_config.json's eos_token, then the chat family's end-of-turn tokens present in
  // the vocab (<|eot_id|>, <|end_of_text|>; <|im_end|>, <|endoftext|>); no duplicates.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // True for added tokens marked special.
  bool IsSpecial(int32_t id) const;

  // The chat family detected at load (kNone if none).
  ChatTemplateFamily chat_template_family() const { return chat_family_; }
  // Renders a conversation with the detected family, or with `family_override` ("llama3",
  // "chatml", "mistral", "llama2") when not empty. Errors as RenderChat and
  // ParseChatTemplateFamily. Encode the result with add_special_tokens = false.
  absl::StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt,
                                                absl::string_view family_override = "") const;

  const TokenizerConfig& config() const { return config_; }

 private:
  friend class StreamDecoder;
  Tokenizer() = default;
  absl::Status Init(absl::string_view tokenizer_json);
  absl::Status ApplyConfig(TokenizerConfig config);
  // The string the decoder sees for `id`; false when the id is unknown or skipped.
  bool TokenForDecode(int32_t id, bool skip_special_tokens, std::string* token) const;
  // Appends the ids of plain (non-added-token) text.
  void EncodePlain(absl::string_view text, bool at_input_start, std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  AddedVocabulary added_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  SpecialTokenAffixes affixes_;
  TokenizerConfig config_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  ChatTemplateFamily chat_family_ = ChatTemplateFamily::kNone;
  ChatTemplateOptions chat_options_;
};

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_TOKENIZER_H_
