// TLS and API keys on the router's public port, with the real binaries on loopback. The
// certificates are made at test time with the openssl CLI (skipped when it is not installed).

#include <fstream>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "gtest/gtest.h"
#include "tests/integration/services/cluster.h"

namespace tokenselect::testing {
namespace {

bool RunOk(const std::vector<std::string>& argv, const std::string& log) {
  int rc = 0;
  RunAndCapture(argv, log, &rc);
  return rc == 0;
}

// The decode worker is given as a DNS target (dns:///localhost:PORT), as a Kubernetes headless
// Service would be, so the router resolves it.
TEST(TlsTest, ApiKeyAndTlsOnThePublicPort) {
  if (!HaveOpenssl()) GTEST_SKIP() << "openssl CLI not installed";
  const std::string dir = MakeTempDir("ts-tls");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed, see " << dir;
  { std::ofstream(dir + "/keys.txt") << "# test keys\nsecret-key-1\n"; }
  const std::string model = dir + "/model";
  ASSERT_TRUE(RunOk({BinDir() + "/tokenselect", "make-model", "--out", model}, dir + "/mm.log"));
  const int decode_port = FreePort();
  const int prefill_port = FreePort();
  const int router_port = FreePort();
  Process decode({BinDir() + "/decode_worker", "--model", model, "--host", "127.0.0.1", "--port",
                  std::to_string(decode_port), "--kv_pages", "256"},
                 dir + "/decode.log");
  Process prefill({BinDir() + "/prefill_worker", "--model", model, "--host", "127.0.0.1", "--port",
                   std::to_string(prefill_port)},
                  dir + "/prefill.log");
  Process router(
      {BinDir() + "/router", "--model", model, "--host", "127.0.0.1", "--port",
       std::to_string(router_port), "--prefill_workers", absl::StrCat("127.0.0.1:", prefill_port),
       "--decode_workers", absl::StrCat("dns:///localhost:", decode_port), "--tls_cert",
       dir + "/server.pem", "--tls_key", dir + "/server.key", "--api_keys_file", dir + "/keys.txt",
       "--probe_interval_s", "0.2"},
      dir + "/router.log");

  clients::ClientOptions options;
  options.target = absl::StrCat("localhost:", router_port);
  options.tls.enabled = true;
  options.tls.ca_file = dir + "/ca.pem";
  options.api_key = "secret-key-1";
  auto good = *clients::Client::Create(options);
  // Wait until the router is up and has found its workers.
  ASSERT_TRUE(WaitServing(options.target, {options.tls}, "tokenselect.v1.Generation", 30))
      << "router not ready, logs in " << dir;

  clients::GenerateInput in;
  in.prompt = "secure hello";
  in.sampling.temperature = 0;
  in.sampling.max_new_tokens = 4;
  auto ok = good->Generate(in, {}, nullptr);
  EXPECT_TRUE(ok.ok()) << ok.status();

  clients::ClientOptions no_key = options;
  no_key.api_key.clear();
  auto result = (*clients::Client::Create(no_key))->GenerateUnary(in);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnauthenticated) << result.status();

  clients::ClientOptions wrong_key = options;
  wrong_key.api_key = "not-a-key";
  result = (*clients::Client::Create(wrong_key))->GenerateUnary(in);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnauthenticated) << result.status();

  clients::ClientOptions plaintext = options;
  plaintext.tls = rpc::TlsOptions();
  clients::CallOptions call;
  call.timeout = absl::Seconds(3);
  result = (*clients::Client::Create(plaintext))->GenerateUnary(in, call);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kUnauthenticated);
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// serve --all-in-one with --tls_ca: mutual TLS on the public port. A caller with a certificate
// the CA signed is served; one without a certificate is refused.
TEST(TlsTest, ServeAllInOneMutualTls) {
  if (!HaveOpenssl()) GTEST_SKIP() << "openssl CLI not installed";
  const std::string dir = MakeTempDir("ts-serve-mtls");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed, see " << dir;
  const std::string model = dir + "/model";
  ASSERT_TRUE(RunOk({BinDir() + "/tokenselect", "make-model", "--out", model}, dir + "/mm.log"));
  const int port = FreePort();
  Process serve(
      {BinDir() + "/tokenselect", "serve", "--all-in-one", "--model", model, "--host", "127.0.0.1",
       "--port", std::to_string(port), "--kv_pages", "256", "--tls_cert", dir + "/server.pem",
       "--tls_key", dir + "/server.key", "--tls_ca", dir + "/ca.pem"},
      dir + "/serve.log");
  clients::ClientOptions options;
  options.target = absl::StrCat("localhost:", port);
  options.tls.enabled = true;
  options.tls.ca_file = dir + "/ca.pem";
  options.tls.cert_file = dir + "/server.pem";  // also valid as a client certificate
  options.tls.key_file = dir + "/server.key";
  auto with_cert = *clients::Client::Create(options);
  ASSERT_TRUE(WaitServing(options.target, {options.tls}, "tokenselect.v1.Generation", 30))
      << "serve not ready, logs in " << dir;
  clients::GenerateInput in;
  in.prompt = "mutual hello";
  in.sampling.temperature = 0;
  in.sampling.max_new_tokens = 4;
  auto result = with_cert->GenerateUnary(in);
  EXPECT_TRUE(result.ok()) << result.status();

  clients::ClientOptions no_cert = options;
  no_cert.tls.cert_file.clear();
  no_cert.tls.key_file.clear();
  clients::CallOptions call;
  call.timeout = absl::Seconds(3);
  result = (*clients::Client::Create(no_cert))->GenerateUnary(in, call);
  EXPECT_FALSE(result.ok());
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tokenselect::testing
