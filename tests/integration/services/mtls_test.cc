// Mutual TLS between the router and the workers, in one process: both workers accept only
// clients with a certificate from the test CA (rpc::MakeServerCredentials with
// require_client_cert), the prefill worker pushes KV to the decode worker over mTLS, and the
// router dials both with its client certificate (RouterOptions::workers.tls). A request through
// the router succeeds; a plaintext client and a TLS client without a certificate cannot reach
// the workers. BinariesWithTlsFlags runs the same checks on the real binaries and their flags.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "decode_worker/decode_worker.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/model_loader.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_worker.h"
#include "router/router_server.h"
#include "rpc/channels.h"
#include "rpc/credentials.h"
#include "rpc/health_client.h"
#include "tests/integration/services/cluster.h"

namespace tokenselect::testing {
namespace {

TEST(MtlsTest, RouterAndWorkersTalkMutualTls) {
  if (!HaveOpenssl()) GTEST_SKIP() << "openssl CLI not installed";
  const std::string dir = MakeTempDir("ts-mtls");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed, see " << dir;
  const std::string model_dir = dir + "/model";
  ASSERT_TRUE(engine::WriteDemoCheckpoint(model_dir, engine::DemoCheckpointOptions()).ok());
  auto loaded = engine::LoadModelDirectory(model_dir, engine::LoadFormat::kSafetensors);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  rpc::TlsOptions server_tls;
  server_tls.enabled = true;
  server_tls.cert_file = dir + "/server.pem";
  server_tls.key_file = dir + "/server.key";
  server_tls.ca_file = dir + "/ca.pem";
  server_tls.require_client_cert = true;
  rpc::TlsOptions client_tls = server_tls;  // the same identity, presented as a client
  client_tls.require_client_cert = false;
  auto server_creds = rpc::MakeServerCredentials(server_tls);
  auto client_creds = rpc::MakeChannelCredentials(client_tls);
  ASSERT_TRUE(server_creds.ok()) << server_creds.status();
  ASSERT_TRUE(client_creds.ok()) << client_creds.status();

  decode_worker::DecodeWorkerOptions decode_options;
  decode_options.model = loaded->model.get();
  decode_options.tokenizer = loaded->tokenizer.get();
  decode_options.credentials = *server_creds;
  decode_options.backend.kv_pages = 128;
  auto decode = decode_worker::StartDecodeWorker(decode_options);
  ASSERT_TRUE(decode.ok()) << decode.status();
  prefill_worker::PrefillWorkerOptions prefill_options;
  prefill_options.model = loaded->model.get();
  prefill_options.credentials = *server_creds;
  prefill_options.kv_channel_credentials = *client_creds;
  auto prefill = prefill_worker::StartPrefillWorker(prefill_options);
  ASSERT_TRUE(prefill.ok()) << prefill.status();

  router::RouterOptions router_options;
  router_options.model_dir = model_dir;
  router_options.listen_address = "127.0.0.1:0";
  router_options.workers.tls = client_tls;
  router_options.prefill_targets = {(*prefill)->address()};
  router_options.decode_targets = {(*decode)->address()};
  router_options.probe_interval = absl::Milliseconds(100);
  auto router = router::RouterServer::Start(router_options);
  ASSERT_TRUE(router.ok()) << router.status();

  clients::ClientOptions client_options;
  client_options.target = rpc::LoopbackTarget((*router)->port());
  auto client = *clients::Client::Create(client_options);
  ASSERT_TRUE(
      WaitServing(client_options.target, {client_options.tls}, "tokenselect.v1.Generation", 10))
      << "the router never saw healthy workers over mTLS";
  clients::GenerateInput in;
  in.prompt = "mutual TLS";
  in.sampling.temperature = 0;
  in.sampling.max_new_tokens = 6;
  auto result = client->GenerateUnary(in);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->token_ids.size(), 6u);

  // The workers refuse a plaintext client and a TLS client without a certificate.
  rpc::ChannelOptions plaintext;
  rpc::ChannelOptions no_client_cert;
  no_client_cert.tls.enabled = true;
  no_client_cert.tls.ca_file = dir + "/ca.pem";
  for (const rpc::ChannelOptions& options : {plaintext, no_client_cert}) {
    auto channel = rpc::MakeChannel((*decode)->address(), options);
    ASSERT_TRUE(channel.ok());
    auto health = rpc::CheckHealth(*channel, "", absl::Seconds(2));
    EXPECT_FALSE(health.ok() && *health == rpc::ServingStatus::kServing)
        << "tls=" << options.tls.enabled;
  }

  (*router)->Shutdown(absl::Seconds(1));
  (*prefill)->Shutdown(absl::Seconds(1));
  (*decode)->Shutdown(absl::Seconds(1));
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// The same cluster from the real binaries and their TLS flags: the workers take --tls_cert,
// --tls_key, --tls_ca (client certificates required by default), the prefill worker pushes K/V
// over mTLS with the same files (--kv_tls, on by default), the router dials them with
// --worker_tls.
TEST(MtlsTest, BinariesWithTlsFlags) {
  if (!HaveOpenssl()) GTEST_SKIP() << "openssl CLI not installed";
  const std::string dir = MakeTempDir("ts-mtls-bin");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed, see " << dir;
  const std::string model = dir + "/model";
  ASSERT_TRUE(engine::WriteDemoCheckpoint(model, engine::DemoCheckpointOptions()).ok());
  const std::vector<std::string> tls = {"--tls_cert",        dir + "/server.pem", "--tls_key",
                                        dir + "/server.key", "--tls_ca",          dir + "/ca.pem"};
  auto with_tls = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), tls.begin(), tls.end());
    return argv;
  };
  const int decode_port = FreePort();
  const int prefill_port = FreePort();
  const int router_port = FreePort();
  Process decode(with_tls({BinDir() + "/decode_worker", "--model", model, "--host", "127.0.0.1",
                           "--port", std::to_string(decode_port), "--kv_pages", "128"}),
                 dir + "/decode.log");
  Process prefill(with_tls({BinDir() + "/prefill_worker", "--model", model, "--host", "127.0.0.1",
                            "--port", std::to_string(prefill_port)}),
                  dir + "/prefill.log");
  Process router(with_tls({BinDir() + "/router", "--model", model, "--host", "127.0.0.1", "--port",
                           std::to_string(router_port), "--prefill_workers",
                           absl::StrCat("127.0.0.1:", prefill_port), "--decode_workers",
                           absl::StrCat("127.0.0.1:", decode_port), "--worker_tls",
                           "--probe_interval_s", "0.1"}),
                 dir + "/router.log");

  // The router's public port serves TLS too (--tls_cert); no client certificate needed there.
  clients::ClientOptions client_options;
  client_options.target = absl::StrCat("localhost:", router_port);
  client_options.tls.enabled = true;
  client_options.tls.ca_file = dir + "/ca.pem";
  auto client = *clients::Client::Create(client_options);
  ASSERT_TRUE(
      WaitServing(client_options.target, {client_options.tls}, "tokenselect.v1.Generation", 30))
      << "the router never saw healthy workers over mTLS, logs in " << dir;
  clients::GenerateInput in;
  in.prompt = "mutual TLS from flags";
  in.sampling.temperature = 0;
  in.sampling.max_new_tokens = 5;
  auto result = client->GenerateUnary(in);
  ASSERT_TRUE(result.ok()) << result.status() << ", logs in " << dir;
  EXPECT_EQ(result->token_ids.size(), 5u);

  // Both workers refuse a plaintext client and a TLS client without a certificate.
  rpc::ChannelOptions plaintext;
  rpc::ChannelOptions no_client_cert;
  no_client_cert.tls.enabled = true;
  no_client_cert.tls.ca_file = dir + "/ca.pem";
  for (int port : {decode_port, prefill_port}) {
    for (const rpc::ChannelOptions& options : {plaintext, no_client_cert}) {
      auto channel = rpc::MakeChannel(absl::StrCat("localhost:", port), options);
      ASSERT_TRUE(channel.ok());
      auto health = rpc::CheckHealth(*channel, "", absl::Seconds(2));
      EXPECT_FALSE(health.ok() && *health == rpc::ServingStatus::kServing)
          << "port " << port << " tls=" << options.tls.enabled;
    }
  }
  router.Kill(SIGTERM);
  prefill.Kill(SIGTERM);
  decode.Kill(SIGTERM);
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tokenselect::testing
