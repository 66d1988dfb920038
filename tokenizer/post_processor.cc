#include "tokenizer/post_processor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

absl::Status ParseInto(const Json& value, absl::string_view path, SpecialTokenAffixes* out);

// BertProcessing / RobertaProcessing: {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}.
absl::StatusOr<int32_t> ReadTokenPairId(const Json& value, absl::string_view path,
                                        absl::string_view key) {
  const Json* pair = internal::FindMember(value, key);
  std::string field = internal::JoinPath(path, key);
  if (pair == nullptr || !pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string() ||
      !(*pair)[1].is_number_integer()) {
    return internal::FieldError(field, "must be [token, id]");
  }
  return (*pair)[1].get<int32_t>();
}

absl::Status ParseTemplate(const Json& value, absl::string_view path, SpecialTokenAffixes* out) {
  std::string single_path = internal::JoinPath(path, "single");
  const Json* single = internal::FindMember(value, "single");
  if (single == nullptr || !single->is_array()) {
    return internal::FieldError(single_path, "must be an array");
  }
  const Json* specials = internal::FindMember(value, "special_tokens");
  std::string specials_path = internal::JoinPath(path, "special_tokens");
  if (specials != nullptr && !specials->is_object()) {
    return internal::FieldError(specials_path, "must be an object");
  }
  int sequences = 0;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    std::string piece_path = internal::IndexPath(single_path, i);
    if (const Json* seq = internal::FindMember(piece, "Sequence")) {
      ASSIGN_OR_RETURN(std::string id, internal::ReadString(*seq, piece_path + ".Sequence", "id"));
      if (id != "A") {
        return internal::FieldError(piece_path + ".Sequence.id",
                                    absl::StrCat("'", id, "' must be A in a single template"));
      }
      ++sequences;
    } else if (const Json* special = internal::FindMember(piece, "SpecialToken")) {
      ASSIGN_OR_RETURN(std::string name,
                       internal::ReadString(*special, piece_path + ".SpecialToken", "id"));
      const Json* entry = specials == nullptr ? nullptr : internal::FindMember(*specials, name);
      std::string entry_path = absl::StrCat(specials_path, "[\"", name, "\"]");
      if (entry == nullptr) return internal::FieldError(entry_path, "is missing");
      const Json* ids = internal::FindMember(*entry, "ids");
      if (ids == nullptr || !ids->is_array()) {
        return internal::FieldError(entry_path + ".ids", "must be an array");
      }
      auto& target = sequences == 0 ? out->prefix : out->suffix;
      for (const Json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return internal::FieldError(entry_path + ".ids", "must hold non-negative integers");
        }
        target.push_back(id.get<int32_t>());
      }
    } else {
      return internal::FieldError(piece_path,
                                  "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (sequences != 1) return internal::FieldError(single_path, "must contain $A exactly once");
  return absl::OkStatus();
}

absl::Status ParseInto(const Json& value, absl::string_view path, SpecialTokenAffixes* out) {
  ASSIGN_OR_RETURN(std::string type, internal::ReadType(value, path));
  if (type == "Sequence") {
    std::string list_path = internal::JoinPath(path, "processors");
    const Json* list = internal::FindMember(value, "processors");
    if (list == nullptr || !list->is_array()) {
      return internal::FieldError(list_path, "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      // Each processor wraps the output of the previous one.
      SpecialTokenAffixes inner;
      RETURN_IF_ERROR(ParseInto((*list)[i], internal::IndexPath(list_path, i), &inner));
      out->prefix.insert(out->prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      out->suffix.insert(out->suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // only trims offsets
  if (type == "TemplateProcessing") return ParseTemplate(value, path, out);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    ASSIGN_OR_RETURN(int32_t cls, ReadTokenPairId(value, path, "cls"));
    ASSIGN_OR_RETURN(int32_t sep, ReadTokenPairId(value, path, "sep"));
    out->prefix.push_back(cls);
    out->suffix.push_back(sep);
    return absl::OkStatus();
  }
  return internal::UnsupportedType(path, type);
}

}  // namespace

absl::StatusOr<SpecialTokenAffixes> ParsePostProcessor(const Json& value, absl::string_view path) {
  SpecialTokenAffixes affixes;
  if (value.is_null()) return affixes;
  RETURN_IF_ERROR(ParseInto(value, path, &affixes));
  return affixes;
}

}  // namespace tokenselect::tokenizer
