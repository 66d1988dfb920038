#include "tokenizer/tokenizer_config.h"

#include "common/status.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

absl::StatusOr<std::optional<std::string>> ReadTokenName(const Json& config,
                                                         absl::string_view key) {
  const Json* value = internal::FindMember(config, key);
  if (value == nullptr || value->is_null()) return std::optional<std::string>();
  if (value->is_string()) return std::optional<std::string>(value->get<std::string>());
  if (value->is_object()) {
    const Json* content = internal::FindMember(*value, "content");
    if (content != nullptr && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return internal::FieldError(key, "must be a string, null or an object with a string 'content'");
}

absl::StatusOr<std::optional<bool>> ReadOptionalBool(const Json& config, absl::string_view key) {
  const Json* value = internal::FindMember(config, key);
  if (value == nullptr || value->is_null()) return std::optional<bool>();
  if (!value->is_boolean()) return internal::FieldError(key, "must be true or false");
  return std::optional<bool>(value->get<bool>());
}

absl::StatusOr<std::string> ReadChatTemplate(const Json& config) {
  const Json* value = internal::FindMember(config, "chat_template");
  if (value == nullptr || value->is_null()) return std::string();
  if (value->is_string()) return value->get<std::string>();
  if (value->is_array()) {
    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    std::string first;
    for (size_t i = 0; i < value->size(); ++i) {
      const Json& entry = (*value)[i];
      std::string path = internal::IndexPath("chat_template", i);
      ASSIGN_OR_RETURN(std::string name, internal::ReadString(entry, path, "name"));
      ASSIGN_OR_RETURN(std::string text, internal::ReadString(entry, path, "template"));
      if (name == "default") return text;
      if (i == 0) first = text;
    }
    return first;
  }
  return internal::FieldError("chat_template", "must be a string or a list of named templates");
}

absl::StatusOr<TokenizerConfig> Parse(absl::string_view text) {
  TokenizerConfig config;
  if (text.empty()) return config;
  ASSIGN_OR_RETURN(Json json, internal::ParseJson(text));
  RETURN_IF_ERROR(internal::RequireObject(json, ""));
  ASSIGN_OR_RETURN(config.bos_token, ReadTokenName(json, "bos_token"));
  ASSIGN_OR_RETURN(config.eos_token, ReadTokenName(json, "eos_token"));
  ASSIGN_OR_RETURN(config.add_bos_token, ReadOptionalBool(json, "add_bos_token"));
  ASSIGN_OR_RETURN(config.add_eos_token, ReadOptionalBool(json, "add_eos_token"));
  ASSIGN_OR_RETURN(config.chat_template, ReadChatTemplate(json));
  return config;
}

}  // namespace

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text) {
  ASSIGN_OR_RETURN(TokenizerConfig config, Parse(text), _.WithPrefix("tokenizer_config.json: "));
  return config;
}

}  // namespace tokenselect::tokenizer
