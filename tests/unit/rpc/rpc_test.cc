// rpc/: API keys, TLS option parsing and credential errors, status conversion. (The TLS
// handshakes themselves are exercised with real certificates by the services, TLS and mTLS
// integration tests.)
#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "rpc/api_keys.h"
#include "rpc/channels.h"
#include "rpc/credentials.h"
#include "rpc/status_convert.h"

namespace tokenselect::rpc {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ApiKeysTest, DisabledAllowsEverything) {
  ApiKeys keys;
  EXPECT_FALSE(keys.enabled());
  EXPECT_TRUE(keys.Check("").ok());
  EXPECT_TRUE(keys.Check("Bearer anything").ok());
}

TEST(ApiKeysTest, FileKeysSkipCommentsAndBlankLinesAndCheckBearerTokens) {
  const std::string path = WriteTemp("keys.txt", "# team keys\n\nkey-one\n  key-two  \n");
  auto keys = ApiKeys::LoadFile(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->enabled());
  EXPECT_TRUE(keys->Check("Bearer key-one").ok());
  EXPECT_TRUE(keys->Check("Bearer key-two").ok());
  for (const char* bad : {"", "key-one", "Bearer", "Bearer key-three", "Basic key-one",
                          "Bearer # team keys"}) {
    const absl::Status status = keys->Check(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(status.message().find("key-three"), absl::string_view::npos)
        << "the message must not echo the key";
  }
}

TEST(ApiKeysTest, LoadErrors) {
  EXPECT_EQ(ApiKeys::LoadFile("/nonexistent/keys.txt").status().code(),
            absl::StatusCode::kNotFound);
  const std::string empty = WriteTemp("empty_keys.txt", "# nothing here\n\n");
  EXPECT_EQ(ApiKeys::LoadFile(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CredentialsTest, TlsOptionsFromFlags) {
  auto off = TlsOptionsFromFlags("", "", "");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled);
  auto on = TlsOptionsFromFlags("c.pem", "k.pem", "ca.pem");
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->enabled);
  EXPECT_EQ(on->ca_file, "ca.pem");
  EXPECT_EQ(TlsOptionsFromFlags("c.pem", "", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TlsOptionsFromFlags("", "k.pem", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CredentialsTest, InsecureWhenDisabledAndClearErrorsOtherwise) {
  EXPECT_TRUE(MakeServerCredentials(TlsOptions{}).ok());
  EXPECT_TRUE(MakeChannelCredentials(TlsOptions{}).ok());

  TlsOptions missing_files;
  missing_files.enabled = true;
  missing_files.cert_file = "/nonexistent/cert.pem";
  missing_files.key_file = "/nonexistent/key.pem";
  auto server = MakeServerCredentials(missing_files);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(server.status().message().find("/nonexistent/cert.pem"), absl::string_view::npos);

  TlsOptions mtls_without_ca;
  mtls_without_ca.enabled = true;
  mtls_without_ca.cert_file = WriteTemp("cert.pem", "not really a certificate");
  mtls_without_ca.key_file = WriteTemp("key.pem", "not really a key");
  mtls_without_ca.require_client_cert = true;
  EXPECT_EQ(MakeServerCredentials(mtls_without_ca).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChannelsTest, DialTargetReplacesWildcardHostsWithLoopback) {
  EXPECT_EQ(DialTarget("0.0.0.0:0", 5123), "127.0.0.1:5123");
  EXPECT_EQ(DialTarget("[::]:50051", 50051), "127.0.0.1:50051");
  EXPECT_EQ(DialTarget(":0", 7), "127.0.0.1:7");
  EXPECT_EQ(DialTarget("10.1.2.3:0", 41000), "10.1.2.3:41000");
  EXPECT_EQ(DialTarget("worker-0.svc:50052", 50052), "worker-0.svc:50052");
  EXPECT_EQ(LoopbackTarget(9), "127.0.0.1:9");
}

TEST(StatusConvertTest, CodesAndMessagesSurviveBothWays) {
  const absl::Status status = absl::ResourceExhaustedError("no KV capacity");
  const grpc::Status wire = ToGrpcStatus(status);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(wire.error_message(), "no KV capacity");
  const absl::Status back = FromGrpcStatus(wire, "decode worker: ");
  EXPECT_EQ(back.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(back.message(), "decode worker: no KV capacity");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "ignored").ok());
}

}  // namespace
}  // namespace tokenselect::rpc
