// Commands that talk to a running server over gRPC (clients/client.h):
//   tokenselect generate --server HOST:PORT --prompt TEXT [sampling flags of `generate`]
//   tokenselect health --server HOST:PORT [--service NAME]
//   tokenselect info --server HOST:PORT
// Connection flags (--tls_ca, --tls_cert, --tls_key, --api_key, --timeout_s) are shared by all
// three; `serve` uses the TLS flags for its own ports.
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cli/command.h"
#include "clients/client.h"
#include "common/status.h"

ABSL_FLAG(std::string, server, "",
          "generate/health/info: router address HOST:PORT (generate runs remotely when set).");
ABSL_FLAG(std::string, tls_ca, "",
          "generate/health/info: PEM CA that verifies the server (enables TLS); serve: CA that "
          "must have signed every caller's certificate (mutual TLS on the public port; needs "
          "--tls_cert and --tls_key).");
ABSL_FLAG(std::string, tls_cert, "",
          "generate/health/info: PEM client certificate (mTLS); serve: server certificate.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "generate/health/info: name checked against the server certificate.");
ABSL_FLAG(std::string, api_key, "",
          "generate/info: API key sent as 'authorization: Bearer KEY' (health needs none).");
ABSL_FLAG(double, timeout_s, 0,
          "generate/health/info: deadline of the call in seconds; 0: none (health: 5 s).");
ABSL_FLAG(std::string, service, "", "health: the service to check ('' is the whole server).");

ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(bool, chat);
ABSL_DECLARE_FLAG(std::string, system);
ABSL_DECLARE_FLAG(int32_t, max_new_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(double, min_p);
ABSL_DECLARE_FLAG(double, repetition_penalty);
ABSL_DECLARE_FLAG(double, frequency_penalty);
ABSL_DECLARE_FLAG(double, presence_penalty);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_token_ids);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(bool, logprobs);
ABSL_DECLARE_FLAG(bool, print_ids);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(int64_t, k);
ABSL_DECLARE_FLAG(int64_t, n_init);
ABSL_DECLARE_FLAG(int64_t, n_local);
ABSL_DECLARE_FLAG(double, theta);
ABSL_DECLARE_FLAG(int64_t, chunk_size);

namespace tokenselect::cli {
namespace {

absl::Status NoArgs(const std::vector<std::string>& args) {
  if (args.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected arguments: ", absl::StrJoin(args, " ")));
}

absl::StatusOr<std::unique_ptr<clients::Client>> ConnectFromFlags() {
  clients::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  if (options.target.empty()) return absl::InvalidArgumentError("--server is required");
  ASSIGN_OR_RETURN(options.tls, rpc::TlsOptionsFromFlags(absl::GetFlag(FLAGS_tls_cert),
                                                         absl::GetFlag(FLAGS_tls_key),
                                                         absl::GetFlag(FLAGS_tls_ca)));
  options.tls.server_name_override = absl::GetFlag(FLAGS_tls_server_name);
  options.api_key = absl::GetFlag(FLAGS_api_key);
  return clients::Client::Create(options);
}

clients::CallOptions CallFromFlags() {
  clients::CallOptions call;
  if (absl::GetFlag(FLAGS_timeout_s) > 0)
    call.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  return call;
}

absl::StatusOr<clients::GenerateInput> InputFromFlags() {
  clients::GenerateInput in;
  const std::string text = absl::GetFlag(FLAGS_prompt);
  ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> ids, PromptIdsFromFlags());
  if (ids.has_value()) {
    in.prompt_ids = *std::move(ids);
  } else if (absl::GetFlag(FLAGS_chat)) {
    if (!absl::GetFlag(FLAGS_system).empty())
      in.chat.emplace_back("system", absl::GetFlag(FLAGS_system));
    in.chat.emplace_back("user", text);
  } else {
    in.prompt = text;
  }
  // Every sampling field is sent explicitly, so that a remote run and an offline
  // `tokenselect generate` with the same flags use the same parameters.
  clients::Sampling& s = in.sampling;
  s.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  s.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  s.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  s.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  s.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  if (absl::GetFlag(FLAGS_seed) >= 0) s.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  s.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  s.stop = absl::GetFlag(FLAGS_stop);
  ASSIGN_OR_RETURN(s.stop_token_ids,
                   ParseTokenIds(absl::GetFlag(FLAGS_stop_token_ids), "stop_token_ids"));
  s.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  s.logprobs = absl::GetFlag(FLAGS_logprobs);
  // Selection too: the remote run uses the same policy and budget as the offline one.
  clients::Selection& sel = in.selection;
  sel.policy = absl::GetFlag(FLAGS_policy);
  sel.k = absl::GetFlag(FLAGS_k);
  sel.n_init = absl::GetFlag(FLAGS_n_init);
  sel.n_local = absl::GetFlag(FLAGS_n_local);
  sel.theta = absl::GetFlag(FLAGS_theta);
  sel.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  return in;
}

const char* ServingStatusName(rpc::ServingStatus s) {
  switch (s) {
    case rpc::ServingStatus::kServing:
      return "SERVING";
    case rpc::ServingStatus::kNotServing:
      return "NOT_SERVING";
    case rpc::ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

absl::Status RunRemoteGenerate(const std::vector<std::string>& args) {
  RETURN_IF_ERROR(NoArgs(args));
  ASSIGN_OR_RETURN(clients::GenerateInput input, InputFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client, ConnectFromFlags());
  ASSIGN_OR_RETURN(clients::GenerateResult result,
                   client->Generate(input, CallFromFlags(), [](const clients::StreamChunk& c) {
                     std::fputs(c.text.c_str(), stdout);
                     std::fflush(stdout);
                     return true;
                   }));
  std::fputs("\n", stdout);
  if (absl::GetFlag(FLAGS_print_ids)) {
    std::printf("ids: %s\n", absl::StrJoin(result.token_ids, ",").c_str());
  }
  if (!result.logprobs.empty()) {
    std::vector<std::string> lines;
    for (size_t i = 0; i < result.logprobs.size() && i < result.token_ids.size(); ++i) {
      lines.push_back(absl::StrCat(result.token_ids[i], ":", result.logprobs[i]));
    }
    std::printf("logprobs: %s\n", absl::StrJoin(lines, " ").c_str());
  }
  std::fprintf(stderr,
               "[generate] request=%s finish=%s prompt=%lld tokens generated=%lld tokens | "
               "queue %.3f s | ttft %.3f s | total %.3f s\n",
               result.request_id.c_str(), result.finish_reason.c_str(),
               static_cast<long long>(result.prompt_tokens),
               static_cast<long long>(result.completion_tokens), result.timings.queue_seconds,
               result.timings.ttft_seconds, result.timings.total_seconds);
  return absl::OkStatus();
}

absl::Status RunHealth(const std::vector<std::string>& args) {
  RETURN_IF_ERROR(NoArgs(args));
  ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client, ConnectFromFlags());
  const double timeout = absl::GetFlag(FLAGS_timeout_s);
  ASSIGN_OR_RETURN(rpc::ServingStatus status,
                   client->Health(absl::GetFlag(FLAGS_service),
                                  timeout > 0 ? absl::Seconds(timeout) : absl::Seconds(5)));
  std::printf("%s\n", ServingStatusName(status));
  if (status != rpc::ServingStatus::kServing) {
    return absl::UnavailableError(absl::StrCat("server is ", ServingStatusName(status)));
  }
  return absl::OkStatus();
}

absl::Status RunInfo(const std::vector<std::string>& args) {
  RETURN_IF_ERROR(NoArgs(args));
  ASSIGN_OR_RETURN(std::unique_ptr<clients::Client> client, ConnectFromFlags());
  ASSIGN_OR_RETURN(clients::ModelInfoResult info, client->GetModelInfo(CallFromFlags()));
  std::printf(
      "model: %s\narchitecture: %s\nvocab_size: %lld\nlayers: %lld\nheads: %lld\nkv_heads: "
      "%lld\nhead_dim: %lld\nmax_position_embeddings: %lld\nmax_prompt_tokens: %lld\n"
      "eos_token_ids: %s\n",
      info.model_name.c_str(), info.architecture.c_str(), static_cast<long long>(info.vocab_size),
      static_cast<long long>(info.num_layers), static_cast<long long>(info.num_heads),
      static_cast<long long>(info.num_kv_heads), static_cast<long long>(info.head_dim),
      static_cast<long long>(info.max_position_embeddings),
      static_cast<long long>(info.max_prompt_tokens),
      absl::StrJoin(info.eos_token_ids, ",").c_str());
  return absl::OkStatus();
}

}  // namespace tokenselect::cli
