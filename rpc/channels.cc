#include "rpc/channels.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace tokenselect::rpc {

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                   MakeChannelCredentials(options.tls));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Reconnect quickly after a worker restarts (the default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  if (!options.tls.server_name_override.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name_override);
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

absl::Status ConfigureServer(grpc::ServerBuilder& builder, const std::string& address,
                             const ServerOptions& options, int* selected_port) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   MakeServerCredentials(options.tls));
  builder.AddListeningPort(address, creds, selected_port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  return absl::OkStatus();
}

std::string LoopbackTarget(int port) { return absl::StrCat("127.0.0.1:", port); }

std::string DialTarget(absl::string_view listen_address, int port) {
  const absl::string_view host = listen_address.substr(0, listen_address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") return LoopbackTarget(port);
  return absl::StrCat(host, ":", port);
}

}  // namespace tokenselect::rpc
