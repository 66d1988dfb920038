// Logging through spdlog: one process-wide logger writing to stderr.
//   TS_LOG(INFO, "loaded {} tensors from {}", n, path);   // fmt-style formatting
//   TS_CHECK(ptr != nullptr, "page {} has no owner", id);  // internal invariant: logs and aborts
// TS_CHECK is for programming errors only; anything a user or peer can cause returns a Status.
#ifndef TOKENSELECT_COMMON_LOGGING_H_
#define TOKENSELECT_COMMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace tokenselect::common {

// Sets the level from a name: trace, debug, info, warn, error, off. InvalidArgument otherwise.
absl::Status SetLogLevel(absl::string_view level);

// Logs `message` at critical level with its source location, then aborts. Never returns.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace tokenselect::common

#define TS_LOG_LEVEL_TRACE spdlog::level::trace
#define TS_LOG_LEVEL_DEBUG spdlog::level::debug
#define TS_LOG_LEVEL_INFO spdlog::level::info
#define TS_LOG_LEVEL_WARN spdlog::level::warn
#define TS_LOG_LEVEL_ERROR spdlog::level::err

#define TS_LOG(level, ...) spdlog::log(TS_LOG_LEVEL_##level, __VA_ARGS__)

#define TS_CHECK(cond, ...)                                                                \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      ::tokenselect::common::CheckFailed(__FILE__, __LINE__, #cond,                        \
                                         fmt::format("" __VA_ARGS__));                     \
    }                                                                                      \
  } while (0)

#endif  // TOKENSELECT_COMMON_LOGGING_H_
