// The `tokenselect` command-line tool is a set of subcommands sharing one absl flag namespace.
// Each subcommand lives in its own *_command.cc, defines its flags there and registers a
// Command in main.cc's table.
#ifndef TOKENSELECT_CLIENTS_CLI_COMMAND_H_
#define TOKENSELECT_CLIENTS_CLI_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::cli {

struct Command {
  const char* name;
  const char* summary;  // one line for the usage text
  // Runs the command with the positional arguments that follow its name. Errors are printed by
  // main() and turned into exit status 1.
  absl::Status (*run)(const std::vector<std::string>& args);
};

absl::Status RunMakeModel(const std::vector<std::string>& args);
absl::Status RunGenerate(const std::vector<std::string>& args);
// remote_commands.cc: `generate --server` (called from RunGenerate), `health`, `info`.
absl::Status RunRemoteGenerate(const std::vector<std::string>& args);
absl::Status RunHealth(const std::vector<std::string>& args);
absl::Status RunInfo(const std::vector<std::string>& args);
// serve_command.cc: `serve --all-in-one` (built when the router and both workers are).
absl::Status RunServe(const std::vector<std::string>& args);

// Token ids from a list flag's parts (--prompt_ids, --stop_token_ids); InvalidArgument naming
// --`flag` and the part that is not an int32 (command.cc).
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::vector<std::string>& parts,
                                                   absl::string_view flag);

// generate's prompt as token ids when --prompt_ids or --prompt_ids_file gives it, nullopt when
// --prompt does (text, for the caller to encode or send); InvalidArgument unless exactly one of
// the three is set, NotFound for an unreadable file (generate_command.cc).
absl::StatusOr<std::optional<std::vector<int32_t>>> PromptIdsFromFlags();

}  // namespace tokenselect::cli

#endif  // TOKENSELECT_CLIENTS_CLI_COMMAND_H_
