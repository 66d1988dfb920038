#include "rpc/api_keys.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tokenselect::rpc {

ApiKeys ApiKeys::FromText(absl::string_view text) {
  ApiKeys keys;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    keys.keys_.insert(std::string(line));
  }
  return keys;
}

absl::StatusOr<ApiKeys> ApiKeys::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read API keys file '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  ApiKeys keys = FromText(text.str());
  if (!keys.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat("API keys file '", path, "' lists no key"));
  }
  return keys;
}

absl::Status ApiKeys::Check(absl::string_view authorization) const {
  if (!enabled()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <key>' metadata");
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <key>'");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  if (!keys_.contains(key)) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

}  // namespace tokenselect::rpc
