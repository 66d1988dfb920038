// TLS and mutual TLS for every gRPC port and channel, from PEM files named by flags
// (--tls_cert, --tls_key, --tls_ca in each binary).
//
// Server side: with cert + key the port serves TLS; with a CA as well and require_client_cert,
// clients must present a certificate signed by that CA (mTLS, used between router and workers).
// Client side: with a CA the server's certificate is verified against it (else the system roots);
// with cert + key the client presents its own certificate (mTLS).
#ifndef TOKENSELECT_RPC_CREDENTIALS_H_
#define TOKENSELECT_RPC_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace tokenselect::rpc {

struct TlsOptions {
  bool enabled = false;              // false: plaintext (insecure credentials)
  std::string cert_file;             // PEM certificate chain (server identity, or client for mTLS)
  std::string key_file;              // PEM private key of cert_file
  std::string ca_file;               // PEM roots that verify the peer
  bool require_client_cert = false;  // server only: mTLS, needs ca_file
  // Client only: the name checked against the server certificate instead of the target host
  // (for connecting to an IP address whose certificate names a DNS name).
  std::string server_name_override;
};

// TLS options from the three flag values: enabled when any is set. InvalidArgument when only
// one of cert/key is given.
absl::StatusOr<TlsOptions> TlsOptionsFromFlags(const std::string& cert_file,
                                               const std::string& key_file,
                                               const std::string& ca_file);

// Server credentials for `options`: insecure when disabled. InvalidArgument when TLS is enabled
// without cert and key, or require_client_cert without a CA; NotFound when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// Channel credentials for `options`: insecure when disabled. Errors as MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options);

// The whole file; NotFound naming the path when it cannot be read.
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

}  // namespace tokenselect::rpc

#endif  // TOKENSELECT_RPC_CREDENTIALS_H_
