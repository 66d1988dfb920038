// tokenselect: command-line entry point. `tokenselect --help` lists the commands' flags;
// `tokenselect COMMAND [flags]` runs one.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/command.h"
#include "common/flags.h"

namespace tokenselect::cli {
namespace {

constexpr Command kCommands[] = {
    {"make-model", "write a small deterministic Hugging Face checkpoint and tokenizer",
     RunMakeModel},
    {"generate",
     "generate text offline from a local checkpoint directory, or with --server from a router",
     RunGenerate},
    {"health", "check a server's grpc.health.v1 status (--server HOST:PORT)", RunHealth},
    {"info", "describe the model a server serves (--server HOST:PORT)", RunInfo},
#ifdef TS_HAVE_SERVE
    {"serve", "serve --all-in-one: router + prefill + decode worker in one process", RunServe},
#endif
};

std::string Usage() {
  std::string usage = "tokenselect COMMAND [flags]\n\ncommands:\n";
  for (const Command& c : kCommands) absl::StrAppend(&usage, "  ", c.name, "\t", c.summary, "\n");
  absl::StrAppend(&usage, "\n`tokenselect --help` lists every flag.");
  return usage;
}

int Main(int argc, char** argv) {
  absl::FlagsUsageConfig config;
  // --help shows our flags (clients/cli, common, and the workers' selection defaults that serve
  // takes), not abseil's own.
  config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "clients/cli/") || absl::StrContains(file, "common/flags") ||
           absl::StrContains(file, "wire/selection_flags");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  const std::string usage = Usage();
  absl::StatusOr<std::vector<std::string>> positional = common::ParseFlags(argc, argv, usage);
  if (!positional.ok()) {
    std::fprintf(stderr, "tokenselect: %s\n", std::string(positional.status().message()).c_str());
    return 2;
  }
  if (positional->empty()) {
    std::fprintf(stderr, "%s\n", usage.c_str());
    return 2;
  }
  const std::string name = positional->front();
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    const std::vector<std::string> args(positional->begin() + 1, positional->end());
    const absl::Status status = c.run(args);
    if (!status.ok()) {
      std::fprintf(stderr, "tokenselect %s: %s\n", c.name, status.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "tokenselect: unknown command '%s'\n\n%s\n", name.c_str(), usage.c_str());
  return 2;
}

}  // namespace
}  // namespace tokenselect::cli

int main(int argc, char** argv) { return tokenselect::cli::Main(argc, argv); }
