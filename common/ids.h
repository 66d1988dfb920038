// Identifiers that must be unique across the processes of one deployment (request ids, lease ids).
#ifndef TOKENSELECT_COMMON_IDS_H_
#define TOKENSELECT_COMMON_IDS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tokenselect::common {

// Returns "<prefix>-<16 hex digits>": 64 bits from a per-process random seed mixed with a
// process-wide counter, so ids never repeat within a process and collide across processes with
// negligible probability. Thread-safe.
std::string NewId(absl::string_view prefix);

}  // namespace tokenselect::common

#endif  // TOKENSELECT_COMMON_IDS_H_
