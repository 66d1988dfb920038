#include "rpc/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tokenselect::rpc {

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is empty"));
  return text.str();
}

absl::StatusOr<TlsOptions> TlsOptionsFromFlags(const std::string& cert_file,
                                               const std::string& key_file,
                                               const std::string& ca_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  TlsOptions options;
  options.enabled = !cert_file.empty() || !ca_file.empty();
  options.cert_file = cert_file;
  options.key_file = key_file;
  options.ca_file = ca_file;
  return options;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  if (!options.enabled) return grpc::InsecureServerCredentials();
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS server needs --tls_cert and --tls_key");
  }
  if (options.require_client_cert && options.ca_file.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs --tls_ca to verify client certificates");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(options.cert_file));
  ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(options.key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(options.ca_file));
  }
  ssl.client_certificate_request = options.require_client_cert
                                       ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options) {
  if (!options.enabled) return grpc::InsecureChannelCredentials();
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs both cert and key");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(options.ca_file));
  }
  if (!options.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile(options.cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile(options.key_file));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace tokenselect::rpc
