// Checked access to parsed JSON for the tokenizer loaders. Every error is InvalidArgument and
// names the JSON path of the offending field ("model.merges[3]"), so a caller only adds the
// file name. Nothing here throws.
#ifndef TOKENSELECT_TOKENIZER_JSON_UTIL_H_
#define TOKENSELECT_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tokenselect::tokenizer::internal {

using Json = nlohmann::json;

// Parses `text`; a syntax error (also an empty or truncated file) names the byte offset.
absl::StatusOr<Json> ParseJson(absl::string_view text);

// "a.b" from ("a", "b"); just "b" when `path` is empty.
std::string JoinPath(absl::string_view path, absl::string_view key);
// "a[3]".
std::string IndexPath(absl::string_view path, size_t index);

// InvalidArgument("<path> <problem>").
absl::Status FieldError(absl::string_view path, absl::string_view problem);

// Requires `value` to be an object.
absl::Status RequireObject(const Json& value, absl::string_view path);

// A member of an object; nullptr when absent. `object` must be an object.
const Json* FindMember(const Json& object, absl::string_view key);

// Required string member.
absl::StatusOr<std::string> ReadString(const Json& object, absl::string_view path,
                                       absl::string_view key);
// Optional string member: absent or null gives nullopt.
absl::StatusOr<std::optional<std::string>> ReadOptionalString(const Json& object,
                                                              absl::string_view path,
                                                              absl::string_view key);
// Optional bool member with a default for absent or null.
absl::StatusOr<bool> ReadBool(const Json& object, absl::string_view path, absl::string_view key,
                              bool default_value);
// Optional integer member with a default for absent or null.
absl::StatusOr<int64_t> ReadInt(const Json& object, absl::string_view path, absl::string_view key,
                                int64_t default_value);

// The "type" member of a component object, e.g. "BPE" at "model.type".
absl::StatusOr<std::string> ReadType(const Json& object, absl::string_view path);

// InvalidArgument("<path>.type '<type>' is not supported").
absl::Status UnsupportedType(absl::string_view path, absl::string_view type);

// Reads a pattern object {"String": s} (returns s) or {"Regex": r} (returns r, *is_regex set).
absl::StatusOr<std::string> ReadPattern(const Json& object, absl::string_view path,
                                        absl::string_view key, bool* is_regex);

// Reads a member that must hold exactly one Unicode character (Metaspace replacement, Strip
// content), returned as UTF-8.
absl::StatusOr<std::string> ReadChar(const Json& object, absl::string_view path,
                                     absl::string_view key, std::optional<std::string> fallback);

}  // namespace tokenselect::tokenizer::internal

#endif  // TOKENSELECT_TOKENIZER_JSON_UTIL_H_
