// Command-line flags are absl flags (ABSL_FLAG in the binary that owns them). This wraps parsing
// with the conventions every tokenselect binary shares: a usage line, --help from absl, and the
// common --log_level flag applied right after parsing.
#ifndef TOKENSELECT_COMMON_FLAGS_H_
#define TOKENSELECT_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::common {

// Parses argv (absl flags; dashes in flag names count as underscores, so --log-level is
// --log_level; --help prints every flag and exits, as absl does before start-up),
// applies --log_level, and returns the positional arguments without argv[0].
// InvalidArgument when --log_level names no level.
absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv,
                                                    absl::string_view usage);

}  // namespace tokenselect::common

#endif  // TOKENSELECT_COMMON_FLAGS_H_
