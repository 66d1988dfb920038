#include "tokenizer/json_util.h"

#include "absl/strings/str_cat.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer::internal {

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
}

std::string JoinPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string IndexPath(absl::string_view path, size_t index) {
  return absl::StrCat(path, "[", index, "]");
}

absl::Status FieldError(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, " ", problem));
}

absl::Status RequireObject(const Json& value, absl::string_view path) {
  if (!value.is_object()) {
    return FieldError(path.empty() ? "top level" : path, "must be a JSON object");
  }
  return absl::OkStatus();
}

const Json* FindMember(const Json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

absl::StatusOr<std::string> ReadString(const Json& object, absl::string_view path,
                                       absl::string_view key) {
  const Json* value = FindMember(object, key);
  if (value == nullptr) return FieldError(JoinPath(path, key), "is missing");
  if (!value->is_string()) return FieldError(JoinPath(path, key), "must be a string");
  return value->get_ref<const std::string&>();
}

absl::StatusOr<std::optional<std::string>> ReadOptionalString(const Json& object,
                                                              absl::string_view path,
                                                              absl::string_view key) {
  const Json* value = FindMember(object, key);
  if (value == nullptr || value->is_null()) return std::optional<std::string>();
  if (!value->is_string()) return FieldError(JoinPath(path, key), "must be a string or null");
  return std::optional<std::string>(value->get_ref<const std::string&>());
}

absl::StatusOr<bool> ReadBool(const Json& object, absl::string_view path, absl::string_view key,
                              bool default_value) {
  const Json* value = FindMember(object, key);
  if (value == nullptr || value->is_null()) return default_value;
  if (!value->is_boolean()) return FieldError(JoinPath(path, key), "must be true or false");
  return value->get<bool>();
}

absl::StatusOr<int64_t> ReadInt(const Json& object, absl::string_view path, absl::string_view key,
                                int64_t default_value) {
  const Json* value = FindMember(object, key);
  if (value == nullptr || value->is_null()) return default_value;
  if (!value->is_number_integer()) return FieldError(JoinPath(path, key), "must be an integer");
  return value->get<int64_t>();
}

absl::StatusOr<std::string> ReadType(const Json& object, absl::string_view path) {
  if (!object.is_object()) return FieldError(path, "must be a JSON object or null");
  return ReadString(object, path, "type");
}

absl::Status UnsupportedType(absl::string_view path, absl::string_view type) {
  return absl::InvalidArgumentError(
      absl::StrCat(JoinPath(path, "type"), " '", type, "' is not supported"));
}

absl::StatusOr<std::string> ReadPattern(const Json& object, absl::string_view path,
                                        absl::string_view key, bool* is_regex) {
  std::string field = JoinPath(path, key);
  const Json* value = FindMember(object, key);
  if (value == nullptr) return FieldError(field, "is missing");
  if (!value->is_object() || value->size() != 1) {
    return FieldError(field, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
  *is_regex = value->begin().key() == "Regex";
  if (!*is_regex && value->begin().key() != "String") {
    return FieldError(field, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (!value->begin()->is_string()) {
    return FieldError(JoinPath(field, value->begin().key()), "must be a string");
  }
  return value->begin()->get<std::string>();
}

absl::StatusOr<std::string> ReadChar(const Json& object, absl::string_view path,
                                     absl::string_view key, std::optional<std::string> fallback) {
  const Json* value = FindMember(object, key);
  if ((value == nullptr || value->is_null()) && fallback.has_value()) return *fallback;
  if (value == nullptr) return FieldError(JoinPath(path, key), "is missing");
  if (!value->is_string()) return FieldError(JoinPath(path, key), "must be a string");
  const std::string& s = value->get_ref<const std::string&>();
  if (s.empty() || DecodeUtf8At(s, 0).length != s.size()) {
    return FieldError(JoinPath(path, key), "must be exactly one character");
  }
  return s;
}

}  // namespace tokenselect::tokenizer::internal
