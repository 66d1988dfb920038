#include "common/flags.h"

#include <algorithm>

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
  // Accept --load-format as well as --load_format (vLLM spells flags with dashes): flag names
  // are normalised to underscores before absl sees them. Values are left alone.
  std::vector<std::string> normalised(argv, argv + argc);
  for (size_t i = 1; i < normalised.size(); ++i) {
    std::string& arg = normalised[i];
    if (arg == "--") break;  // everything after is positional
    if (arg.size() < 3 || arg[0] != '-' || arg[1] != '-') continue;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
  }
  std::vector<char*> normalised_argv;
  for (std::string& arg : normalised) normalised_argv.push_back(arg.data());
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(normalised_argv.size()), normalised_argv.data());
  RETURN_IF_ERROR(SetLogLevel(absl::GetFlag(FLAGS_log_level)));
  std::vector<std::string> positional;
  for (size_t i = 1; i < rest.size(); ++i) positional.emplace_back(rest[i]);
  return positional;
}

}  // namespace tokenselect::common
