// API keys on the public API: clients send `authorization: Bearer KEY` metadata; a request
// without a listed key is rejected with UNAUTHENTICATED. Keys come from a file (--api_keys_file):
// one key per line, blank lines and lines starting with '#' ignored.
#ifndef TOKENSELECT_RPC_API_KEYS_H_
#define TOKENSELECT_RPC_API_KEYS_H_

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::rpc {

class ApiKeys {
 public:
  // No keys: every request is allowed.
  ApiKeys() = default;

  // NotFound when the file cannot be read; InvalidArgument when it lists no key.
  static absl::StatusOr<ApiKeys> LoadFile(const std::string& path);
  static ApiKeys FromText(absl::string_view text);

  bool enabled() const { return !keys_.empty(); }

  // OK when disabled or `authorization` is "Bearer K" with K listed; Unauthenticated otherwise
  // (the message never echoes the key).
  absl::Status Check(absl::string_view authorization) const;

 private:
  absl::flat_hash_set<std::string> keys_;
};

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_API_KEYS_H_
