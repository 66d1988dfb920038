// The parts of tokenizer_config.json the tokenizer uses: special token names, Llama-2 style
// add_bos_token / add_eos_token, and the Jinja chat_template text (only to detect the family).
#ifndef TOKENSELECT_TOKENIZER_TOKENIZER_CONFIG_H_
#define TOKENSELECT_TOKENIZER_TOKENIZER_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::tokenizer {

struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;  // set only when the file has the key
  std::optional<bool> add_eos_token;
  std::string chat_template;  // the "default" one when the file lists several
};

// Parses tokenizer_config.json text; empty text gives an empty config. Token names may be
// strings or {"content": ...} objects. InvalidArgument ("tokenizer_config.json: bos_token must
// be ...") for malformed JSON or fields of the wrong type.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_TOKENIZER_CONFIG_H_
