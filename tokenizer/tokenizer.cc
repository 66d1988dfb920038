#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

// Reads a whole file; NotFound when it does not exist or cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return buffer.str();
}

const Json& MemberOrNull(const Json& object, absl::string_view key) {
  static const Json* null_json = new Json();
  const Json* value = internal::FindMember(object, key);
  return value == nullptr ? *null_json : *value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(dir + "/tokenizer.json"));
  std::string config_json;
  absl::StatusOr<std::string> config = ReadFile(dir + "/tokenizer_config.json");
  if (config.ok()) {
    config_json = *std::move(config);
  } else if (!absl::IsNotFound(config.status())) {
    return config.status();
  }
  return LoadFromStrings(tokenizer_json, config_json);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromStrings(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  RETURN_IF_ERROR(common::Annotate(tokenizer->Init(tokenizer_json), "tokenizer.json: "));
  ASSIGN_OR_RETURN(TokenizerConfig config, ParseTokenizerConfig(tokenizer_config_json));
  RETURN_IF_ERROR(tokenizer->ApplyConfig(std::move(config)));
  return tokenizer;
}

absl::Status Tokenizer::Init(absl::string_view tokenizer_json) {
  ASSIGN_OR_RETURN(Json json, internal::ParseJson(tokenizer_json));
  RETURN_IF_ERROR(internal::RequireObject(json, ""));
  const Json* model = internal::FindMember(json, "model");
  if (model == nullptr) return internal::FieldError("model", "is missing");
  ASSIGN_OR_RETURN(model_, BpeModel::FromJson(*model, "model"));
  ASSIGN_OR_RETURN(normalizer_,
                   Normalizer::FromJson(MemberOrNull(json, "normalizer"), "normalizer"));
  ASSIGN_OR_RETURN(added_, AddedVocabulary::FromJson(internal::FindMember(json, "added_tokens"),
                                                     "added_tokens", normalizer_));
  ASSIGN_OR_RETURN(pre_tokenizer_,
                   PreTokenizer::FromJson(MemberOrNull(json, "pre_tokenizer"), "pre_tokenizer"));
  ASSIGN_OR_RETURN(affixes_,
                   ParsePostProcessor(MemberOrNull(json, "post_processor"), "post_processor"));
  ASSIGN_OR_RETURN(decoder_, Decoder::FromJson(MemberOrNull(json, "decoder"), "decoder"));

  vocab_size_ = model_->vocab_size();
  for (const AddedToken& token : added_.tokens()) {
    vocab_size_ = std::max(vocab_size_, token.id + 1);
  }
  for (const auto* ids : {&affixes_.prefix, &affixes_.suffix}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= vocab_size_) {
        return internal::FieldError("post_processor",
                                    absl::StrCat("uses id ", id, " outside the vocab"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::ApplyConfig(TokenizerConfig config) {
  config_ = std::move(config);
  auto lookup = [this](const std::optional<std::string>& name,
                       absl::string_view field) -> absl::StatusOr<std::optional<int32_t>> {
    if (!name.has_value()) return std::optional<int32_t>();
    std::optional<int32_t> id = TokenToId(*name);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json: ", field, " '", *name, "' is not in the vocab"));
    }
    return id;
  };
  ASSIGN_OR_RETURN(std::optional<int32_t> bos, lookup(config_.bos_token, "bos_token"));
  ASSIGN_OR_RETURN(std::optional<int32_t> eos, lookup(config_.eos_token, "eos_token"));
  bos_id_ = bos;
  if (!bos_id_.has_value() && affixes_.prefix.size() == 1) bos_id_ = affixes_.prefix[0];

  // Llama-2 style flags override what the post_processor adds (as transformers does).
  if (config_.add_bos_token.has_value()) {
    affixes_.prefix.clear();
    if (*config_.add_bos_token) {
      if (!bos_id_.has_value()) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: add_bos_token is true but there is no bos_token");
      }
      affixes_.prefix.push_back(*bos_id_);
    }
  }
  if (config_.add_eos_token.has_value()) {
    affixes_.suffix.clear();
    if (*config_.add_eos_token) {
      if (!eos.has_value()) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: add_eos_token is true but there is no eos_token");
      }
      affixes_.suffix.push_back(*eos);
    }
  }

  chat_family_ = DetectChatTemplateFamily(
      config_.chat_template, [this](absl::string_view t) { return TokenToId(t).has_value(); });
  chat_options_.default_system_prompt = DetectDefaultSystemPrompt(config_.chat_template);
  if (config_.bos_token.has_value()) {
    chat_options_.bos_token = *config_.bos_token;
  } else if (TokenToId("<|begin_of_text|>").has_value()) {
    chat_options_.bos_token = "<|begin_of_text|>";
  } else if (TokenToId("<s>").has_value()) {
    chat_options_.bos_token = "<s>";
  }
  chat_options_.eos_token = config_.eos_token.value_or(TokenToId("</s>") ? "</s>" : "");

  eos_ids_.clear();
  auto add_eos = [this](std::optional<int32_t> id) {
    if (id.has_value() && std::find(eos_ids_.begin(), eos_ids_.end(), *id) == eos_ids_.end()) {
      eos_ids_.push_back(*id);
    }
  };
  add_eos(eos);
  if (chat_family_ == ChatTemplateFamily::kLlama3) {
    add_eos(TokenToId("<|eot_id|>"));
    add_eos(TokenToId("<|end_of_text|>"));
  } else if (chat_family_ == ChatTemplateFamily::kChatMl) {
    add_eos(TokenToId("<|im_end|>"));
    add_eos(TokenToId("<|endoftext|>"));
  }
  return absl::OkStatus();
}

void Tokenizer::EncodePlain(absl::string_view text, bool at_input_start,
                            std::vector<int32_t>* ids) const {
  std::string normalized = normalizer_.Normalize(text);
  std::vector<TextSegment> segments;
  if (added_.has_normalized_tokens()) {
    added_.Split(normalized, /*normalized_set=*/true, &segments);
  } else if (!normalized.empty()) {
    segments.push_back({0, normalized.size(), -1});
  }
  std::vector<std::string> pre_tokens;
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      ids->push_back(segment.id);
      continue;
    }
    pre_tokens.clear();
    pre_tokenizer_.PreTokenize(
        absl::string_view(normalized).substr(segment.begin, segment.end - segment.begin),
        at_input_start && segment.begin == 0, &pre_tokens);
    for (const std::string& pre_token : pre_tokens) model_->Tokenize(pre_token, ids);
  }
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = affixes_.prefix;
  std::vector<TextSegment> segments;
  added_.Split(text, /*normalized_set=*/false, &segments);
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      EncodePlain(text.substr(segment.begin, segment.end - segment.begin), segment.begin == 0,
                  &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), affixes_.suffix.begin(), affixes_.suffix.end());
  return ids;
}

bool Tokenizer::TokenForDecode(int32_t id, bool skip_special_tokens, std::string* token) const {
  if (const AddedToken* added = added_.FindById(id)) {
    if (skip_special_tokens && added->special) return false;
    *token = added->decoded;
    return true;
  }
  const std::string* piece = model_->IdToToken(id);
  if (piece == nullptr) return false;
  if (skip_special_tokens) {
    // HF filters by content: a vocab entry spelled like a special added token is skipped too.
    const AddedToken* added = added_.FindByContent(*piece);
    if (added != nullptr && added->special) return false;
  }
  *token = *piece;
  return true;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  std::string token;
  for (int32_t id : ids) {
    if (TokenForDecode(id, skip_special_tokens, &token)) tokens.push_back(token);
  }
  return decoder_.DecodeTokens(tokens);
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  if (const AddedToken* added = added_.FindByContent(token)) return added->id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* added = added_.FindById(id)) return added->content;
  if (const std::string* piece = model_->IdToToken(id)) return *piece;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* added = added_.FindById(id);
  return added != nullptr && added->special;
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                         bool add_generation_prompt,
                                                         absl::string_view family_override) const {
  ChatTemplateFamily family = chat_family_;
  if (!family_override.empty()) {
    ASSIGN_OR_RETURN(family, ParseChatTemplateFamily(family_override));
  }
  return RenderChat(family, chat_options_, messages, add_generation_prompt);
}

}  // namespace tokenselect::tokenizer
