#include "tokenizer/normalizer.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {

using internal::Json;

std::string ReplaceAll(absl::string_view text, absl::string_view pattern,
                       absl::string_view content) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(pattern, pos);
    if (hit == absl::string_view::npos) break;
    out.append(text.data() + pos, hit - pos);
    out.append(content.data(), content.size());
    pos = hit + pattern.size();
  }
  out.append(text.data() + pos, text.size() - pos);
  return out;
}

absl::StatusOr<Normalizer> Normalizer::FromJson(const Json& value, absl::string_view path) {
  Normalizer normalizer;
  if (value.is_null()) return normalizer;
  RETURN_IF_ERROR(Parse(value, path, &normalizer.steps_));
  return normalizer;
}

absl::Status Normalizer::Parse(const Json& value, absl::string_view path,
                               std::vector<Step>* steps) {
  ASSIGN_OR_RETURN(std::string type, internal::ReadType(value, path));
  if (type == "Sequence") {
    std::string list_path = internal::JoinPath(path, "normalizers");
    const Json* list = internal::FindMember(value, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return internal::FieldError(list_path, "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Parse((*list)[i], internal::IndexPath(list_path, i), steps));
    }
  } else if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prepend, internal::ReadString(value, path, "prepend"));
    steps->push_back({Step::Kind::kPrepend, "", std::move(prepend)});
  } else if (type == "Replace") {
    bool is_regex = false;
    ASSIGN_OR_RETURN(std::string pattern, internal::ReadPattern(value, path, "pattern", &is_regex));
    if (is_regex) {
      return internal::FieldError(internal::JoinPath(path, "pattern"),
                                  "Regex patterns are not supported (only String)");
    }
    if (pattern.empty()) {
      return internal::FieldError(internal::JoinPath(path, "pattern.String"), "must not be empty");
    }
    ASSIGN_OR_RETURN(std::string content, internal::ReadString(value, path, "content"));
    steps->push_back({Step::Kind::kReplace, std::move(pattern), std::move(content)});
  } else if (type == "NFC") {
    steps->push_back({Step::Kind::kNfc, "", ""});
  } else {
    return internal::UnsupportedType(path, type);
  }
  return absl::OkStatus();
}

std::string Normalizer::Normalize(absl::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kPrepend:
        if (!current.empty()) current = absl::StrCat(step.content, current);
        break;
      case Step::Kind::kReplace:
        current = ReplaceAll(current, step.pattern, step.content);
        break;
      case Step::Kind::kNfc:
        current = NormalizeNfc(current);
        break;
    }
  }
  return current;
}

}  // namespace tokenselect::tokenizer
