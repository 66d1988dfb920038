#include "common/flags.h"

#include "absl/base/call_once.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "common/status.h"

ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error, off.");

namespace tokenselect::common {

absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv,
                                                    absl::string_view usage) {
  // absl allows one usage message per process; a second ParseFlags call keeps the first.
  static absl::once_flag usage_once;
  absl::call_once(usage_once, [usage] { absl::SetProgramUsageMessage(usage); });
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  RETURN_IF_ERROR(SetLogLevel(absl::GetFlag(FLAGS_log_level)));
  std::vector<std::string> positional;
  for (size_t i = 1; i < rest.size(); ++i) positional.emplace_back(rest[i]);
  return positional;
}

}  // namespace tokenselect::common
