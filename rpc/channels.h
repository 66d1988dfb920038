// Channel and server construction with the limits every tokenselect port shares: message size
// caps (prompts of 1M tokens are ~4 MiB of ids; the KV push streams use their own chunking) and
// keepalive so a dead peer is noticed while a long stream is idle.
#ifndef TOKENSELECT_RPC_CHANNELS_H_
#define TOKENSELECT_RPC_CHANNELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_builder.h"
#include "rpc/credentials.h"

namespace tokenselect::rpc {

inline constexpr int kDefaultMaxMessageBytes = 64 << 20;

struct ChannelOptions {
  TlsOptions tls;
  int max_message_bytes = kDefaultMaxMessageBytes;  // send and receive
};

// A channel to `target` ("host:port", "dns:///name:port", "unix:path"). Errors as
// MakeChannelCredentials. Connecting is lazy: a bad address shows up as UNAVAILABLE on calls.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelOptions& options);

struct ServerOptions {
  TlsOptions tls;
  int max_message_bytes = kDefaultMaxMessageBytes;
};

// Adds a listening port on `address` ("0.0.0.0:PORT"; port 0 picks a free one, written to
// *selected_port once the server starts) with the credentials and limits of `options`.
absl::Status ConfigureServer(grpc::ServerBuilder& builder, const std::string& address,
                             const ServerOptions& options, int* selected_port);

// "host:port" for a listen address "0.0.0.0:PORT" that a local client can dial.
std::string LoopbackTarget(int port);

// "host:port" a client can dial for a server listening on `listen_address` ("host:PORT") that
// was given `port`: the listen host, or the loopback address for a wildcard or empty host
// ("0.0.0.0", "[::]", ":PORT").
std::string DialTarget(absl::string_view listen_address, int port);

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_CHANNELS_H_
