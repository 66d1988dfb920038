#include "clients/cli/command.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tokenselect::cli {

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::vector<std::string>& parts,
                                                   absl::string_view flag) {
  std::vector<int32_t> ids;
  for (const std::string& part : parts) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace tokenselect::cli
