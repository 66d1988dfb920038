#include "common/logging.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tokenselect::common {
namespace {

// Logs go to stderr (stdout is for program output such as generated text). Installed during
// static initialisation so that every binary linking ts_common logs the same way.
const bool kStderrLoggerInstalled = [] {
  spdlog::set_default_logger(spdlog::stderr_color_mt("tokenselect"));
  return true;
}();

}  // namespace

absl::Status SetLogLevel(absl::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for names it does not know; accept "off" only when asked for.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level '", level, "' is not one of trace, debug, info, warn, error, off"));
  }
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  // Straight to stderr as well: the default logger may have been replaced or turned off.
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, condition,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tokenselect::common
