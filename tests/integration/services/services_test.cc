// Black-box tests of the disaggregated services: the real router, 2 prefill and 2 decode worker
// binaries on loopback, driven through the C++ client (clients/client.h). Outputs are compared
// token for token with offline `tokenselect generate` (engine::Generator) on the same model.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/client.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/tokenselect/v1/generate.grpc.pb.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"
#include "tests/integration/services/cluster.h"

namespace tokenselect::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kDecodePages = 256;  // x 16 slots: 4096 tokens per decode worker
constexpr int kPageSize = 16;

struct Worker {
  Process process;
  int port = 0;
  int metrics_port = 0;
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
};

class ServicesTest : public ::testing::Test {
 protected:
  // A failed SetUpTestSuite would otherwise only skip the tests.
  void SetUp() override { ASSERT_TRUE(setup_ok_) << "cluster did not start, logs in " << *dir_; }

  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("ts-services"));
    model_ = new std::string(*dir_ + "/model");
    int rc = 0;
    RunAndCapture(
        {BinDir() + "/tokenselect", "make-model", "--preset", "llama-gqa", "--out", *model_},
        *dir_ + "/make-model.log", &rc);
    ASSERT_EQ(rc, 0) << "make-model failed, see " << *dir_;
    prefill_ = new std::vector<Worker>(2);
    decode_ = new std::vector<Worker>(2);
    for (size_t i = 0; i < 2; ++i) {
      Worker& d = (*decode_)[i];
      d.port = FreePort();
      d.metrics_port = FreePort();
      d.process =
          Process({BinDir() + "/decode_worker", "--model", *model_, "--host", "127.0.0.1", "--port",
                   std::to_string(d.port), "--kv_pages", std::to_string(kDecodePages),
                   "--page_size", std::to_string(kPageSize), "--lease_timeout_ms", "3000",
                   "--metrics_host", "127.0.0.1", "--metrics_port", std::to_string(d.metrics_port)},
                  absl::StrCat(*dir_, "/decode", i, ".log"));
      Worker& p = (*prefill_)[i];
      p.port = FreePort();
      p.metrics_port = FreePort();
      p.process = Process({BinDir() + "/prefill_worker", "--model", *model_, "--host", "127.0.0.1",
                           "--port", std::to_string(p.port), "--metrics_host", "127.0.0.1",
                           "--metrics_port", std::to_string(p.metrics_port)},
                          absl::StrCat(*dir_, "/prefill", i, ".log"));
    }
    router_port_ = FreePort();
    router_metrics_port_ = FreePort();
    router_ = new Process(RouterArgv(router_port_, {"--metrics_host", "127.0.0.1", "--metrics_port",
                                                    std::to_string(router_metrics_port_)}),
                          *dir_ + "/router.log");
    ASSERT_TRUE(WaitServing(router_port_, "tokenselect.v1.Generation", 60))
        << "router not ready, logs in " << *dir_;
    setup_ok_ = true;
  }

  static void TearDownTestSuite() {
    delete router_;
    delete prefill_;
    delete decode_;
    // Keep the logs of a failed run.
    if (::testing::UnitTest::GetInstance()->failed_test_count() == 0) {
      std::filesystem::remove_all(*dir_);
    }
  }

  static std::vector<std::string> RouterArgv(int port, const std::vector<std::string>& extra) {
    std::string prefill, decode;
    for (const Worker& w : *prefill_)
      absl::StrAppend(&prefill, prefill.empty() ? "" : ",", w.address());
    for (const Worker& w : *decode_)
      absl::StrAppend(&decode, decode.empty() ? "" : ",", w.address());
    std::vector<std::string> argv = {BinDir() + "/router",
                                     "--model",
                                     *model_,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(port),
                                     "--prefill_workers",
                                     prefill,
                                     "--decode_workers",
                                     decode,
                                     "--max_prompt_tokens",
                                     "3500",
                                     "--probe_interval_s",
                                     "0.2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  static std::unique_ptr<clients::Client> Connect(int port = router_port_) {
    clients::ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", port);
    return *clients::Client::Create(options);
  }

  // Offline reference: the ids `tokenselect generate` prints for a greedy run.
  static std::vector<int32_t> OfflineIds(const std::string& prompt, int max_new_tokens) {
    int rc = 0;
    const std::string out = RunAndCapture(
        {BinDir() + "/tokenselect", "generate", "--model", *model_, "--prompt", prompt,
         "--max_new_tokens", std::to_string(max_new_tokens), "--temperature", "0", "--print_ids"},
        *dir_ + "/offline.log", &rc);
    EXPECT_EQ(rc, 0);
    std::vector<int32_t> ids;
    const size_t at = out.rfind("ids: ");
    if (at == std::string::npos) return ids;
    const std::string line = out.substr(at + 5, out.find('\n', at) - at - 5);
    for (absl::string_view part : absl::StrSplit(line, ',', absl::SkipEmpty())) {
      int32_t id;
      if (absl::SimpleAtoi(part, &id)) ids.push_back(id);
    }
    return ids;
  }

  // Free / total KV pages of a worker (GetLoad).
  template <typename Service>
  static std::pair<int64_t, int64_t> Pages(int port) {
    auto stub = Service::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::WorkerLoad load;
    if (!stub->GetLoad(&context, v1::GetLoadRequest(), &load).ok()) return {-1, -1};
    return {load.free_kv_pages(), load.total_kv_pages()};
  }

  static int64_t QueuedPrefillTokens(int port) {
    auto stub = v1::PrefillWorker::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::WorkerLoad load;
    if (!stub->GetLoad(&context, v1::GetLoadRequest(), &load).ok()) return -1;
    return load.queued_prefill_tokens() + load.running_requests();
  }

  // True once every live worker is back at its idle page usage (within `timeout_s`).
  static bool AllPagesFree(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      bool idle = true;
      for (const Worker& w : *decode_) {
        if (!w.process.running()) continue;
        auto [free, total] = Pages<v1::DecodeWorker>(w.port);
        idle = idle && free == total && total > 0;
      }
      for (const Worker& w : *prefill_) {
        if (!w.process.running()) continue;
        auto [free, total] = Pages<v1::PrefillWorker>(w.port);
        idle = idle && free == total;
      }
      if (idle) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // The sum of the samples of `name` (exact, before `{` or ` `) whose line contains every one of
  // `labels`, from 127.0.0.1:port/metrics; -1 when the endpoint does not answer.
  static double MetricSum(int port, const std::string& name,
                          const std::vector<std::string>& labels) {
    httplib::Client http("127.0.0.1", port);
    http.set_connection_timeout(2);
    auto response = http.Get("/metrics");
    if (!response || response->status != 200) return -1;
    double sum = 0;
    for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
      if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
      const char next = line[name.size()];
      if (next != '{' && next != ' ') continue;
      bool match = true;
      for (const std::string& label : labels) match = match && absl::StrContains(line, label);
      double value = 0;
      const size_t space = line.rfind(' ');
      if (match && absl::SimpleAtod(line.substr(space + 1), &value)) sum += value;
    }
    return sum;
  }

  // `tokenselect generate FLAGS` through the router prints what it prints offline (the streamed
  // text and, with --print_ids, the ids line); logs remote-NAME.log and offline-NAME.log.
  static void ExpectRemoteCliMatchesOffline(const std::vector<std::string>& flags,
                                            const std::string& name) {
    std::vector<std::string> remote = {BinDir() + "/tokenselect", "generate", "--server",
                                       absl::StrCat("127.0.0.1:", router_port_)};
    std::vector<std::string> offline = {BinDir() + "/tokenselect", "generate", "--model", *model_};
    remote.insert(remote.end(), flags.begin(), flags.end());
    offline.insert(offline.end(), flags.begin(), flags.end());
    int rc_remote = 0, rc_offline = 0;
    const std::string remote_out =
        RunAndCapture(remote, absl::StrCat(*dir_, "/remote-", name, ".log"), &rc_remote);
    const std::string offline_out =
        RunAndCapture(offline, absl::StrCat(*dir_, "/offline-", name, ".log"), &rc_offline);
    EXPECT_EQ(rc_remote, 0) << name;
    EXPECT_EQ(rc_offline, 0) << name;
    EXPECT_THAT(remote_out, HasSubstr("ids: ")) << name;
    EXPECT_EQ(remote_out, offline_out) << name;
  }

  static clients::GenerateInput Greedy(const std::string& prompt, int max_new_tokens) {
    clients::GenerateInput in;
    in.prompt = prompt;
    in.sampling.temperature = 0;
    in.sampling.max_new_tokens = max_new_tokens;
    return in;
  }

  static std::string LongPrompt(int words) {
    std::string text;
    for (int i = 0; i < words; ++i) absl::StrAppend(&text, "token", i % 97, " ");
    return text;
  }

  static std::string* dir_;
  static std::string* model_;
  static std::vector<Worker>* prefill_;
  static std::vector<Worker>* decode_;
  static Process* router_;
  static int router_port_;
  static int router_metrics_port_;
  static bool setup_ok_;
};

std::string* ServicesTest::dir_ = nullptr;
std::string* ServicesTest::model_ = nullptr;
std::vector<Worker>* ServicesTest::prefill_ = nullptr;
std::vector<Worker>* ServicesTest::decode_ = nullptr;
Process* ServicesTest::router_ = nullptr;
int ServicesTest::router_port_ = 0;
int ServicesTest::router_metrics_port_ = 0;
bool ServicesTest::setup_ok_ = false;

TEST_F(ServicesTest, SixteenConcurrentStreamsMatchOfflineGeneration) {
  constexpr int kRequests = 16;
  constexpr int kNewTokens = 12;
  std::vector<std::string> prompts;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(absl::StrCat("Request ", i, ": the quick brown fox ", LongPrompt(i * 3)));
  }
  std::vector<absl::StatusOr<clients::GenerateResult>> results(kRequests);
  std::vector<std::thread> threads;
  auto client = Connect();
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      results[i] = client->Generate(Greedy(prompts[i], kNewTokens), {},
                                    [](const clients::StreamChunk&) { return true; });
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->token_ids, OfflineIds(prompts[i], kNewTokens)) << "request " << i;
    EXPECT_FALSE(results[i]->finish_reason.empty());
    EXPECT_GT(results[i]->prompt_tokens, 0);
  }
  EXPECT_TRUE(AllPagesFree(5));
}

TEST_F(ServicesTest, UnaryMatchesStreaming) {
  auto client = Connect();
  auto unary = client->GenerateUnary(Greedy("Unary and streaming agree", 8));
  auto streamed = client->Generate(Greedy("Unary and streaming agree", 8), {}, nullptr);
  ASSERT_TRUE(unary.ok()) << unary.status();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(unary->token_ids, streamed->token_ids);
  EXPECT_EQ(unary->text, streamed->text);
}

TEST_F(ServicesTest, RemoteCliMatchesOfflineCli) {
  ExpectRemoteCliMatchesOffline(
      {"--prompt", "The remote CLI", "--max_new_tokens", "10", "--print_ids"}, "cli");
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// --prompt_ids_file reaches the server too: the remote run of a prompt given as a file of ids
// prints what the offline run of the same file does.
TEST_F(ServicesTest, RemoteCliPromptIdsFile) {
  const std::string ids_file = *dir_ + "/prompt_ids.txt";
  std::ofstream(ids_file) << "5, 17, 42\n99 250\t7\n";
  ExpectRemoteCliMatchesOffline(
      {"--prompt_ids_file", ids_file, "--max_new_tokens", "6", "--print_ids"}, "ids-file");
}

// --device: a bad value is refused naming the flag; cuda either runs (GPU host, CUDA build) and
// prints ids, or fails with a clear reason (no GPU here, or a build without CUDA), never crashes.
TEST_F(ServicesTest, OfflineCliDeviceFlag) {
  int rc = 0;
  RunAndCapture({BinDir() + "/tokenselect", "generate", "--model", *model_, "--prompt", "x",
                 "--device", "tpu"},
                *dir_ + "/device-tpu.log", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_THAT(ReadLog(*dir_ + "/device-tpu.log"), HasSubstr("--device must be cpu or cuda"));
  const std::string out =
      RunAndCapture({BinDir() + "/tokenselect", "generate", "--model", *model_, "--prompt", "x",
                     "--max_new_tokens", "3", "--device", "cuda", "--max_context", "64",
                     "--chunk_size", "8", "--print_ids"},
                    *dir_ + "/device-cuda.log", &rc);
  if (rc == 0) {
    EXPECT_THAT(out, HasSubstr("ids: "));
  } else {
    const std::string log = ReadLog(*dir_ + "/device-cuda.log");
    EXPECT_TRUE(log.find("no usable CUDA device") != std::string::npos ||
                log.find("this build has no CUDA backend") != std::string::npos)
        << log;
  }
}

// GetModelInfo of the router on 127.0.0.1:`port` (an empty message, and a failure, when the call
// fails).
v1::ModelInfo ModelInfoAt(int port) {
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::ModelInfo info;
  const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return info;
}

// The command line `BINARY ARGS...` (a binary of the build's bin/; tokenselect by default) fails,
// naming the flag as `message` says (its output in `log`, under the test's directory).
void ExpectRefused(const std::vector<std::string>& args, const std::string& dir,
                   const std::string& log, const std::string& message,
                   const std::string& binary = "tokenselect") {
  std::vector<std::string> argv = {BinDir() + "/" + binary};
  argv.insert(argv.end(), args.begin(), args.end());
  int rc = 0;
  RunAndCapture(argv, dir + "/" + log, &rc);
  EXPECT_NE(rc, 0) << log;
  EXPECT_THAT(ReadLog(dir + "/" + log), HasSubstr(message)) << log;
}

// serve --all-in-one reads --kv_dtype as the worker binaries do, and generate reads --gpu as
// serve does: a bad value, or fp8 on the CPU (whose KV stays fp32), is refused naming the flag
// before anything loads or starts serving.
TEST_F(ServicesTest, KvDtypeAndGpuFlags) {
  const std::vector<std::string> serve = {"serve",    "--all-in-one", "--model", *model_,
                                          "--device", "cpu",          "--port",  "0"};
  auto with = [](std::vector<std::string> args, std::vector<std::string> more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  ExpectRefused(with(serve, {"--kv_dtype", "fp4"}), *dir_, "serve-fp4.log",
                "--kv_dtype must be bf16 or fp8");
  ExpectRefused(with(serve, {"--kv_dtype", "fp8"}), *dir_, "serve-fp8.log",
                "--kv_dtype fp8 needs --device cuda");
  const std::vector<std::string> generate = {"generate", "--model", *model_, "--prompt", "x"};
  ExpectRefused(with(generate, {"--kv_dtype", "fp4"}), *dir_, "generate-fp4.log",
                "--kv_dtype must be bf16 or fp8");
  ExpectRefused(with(generate, {"--device", "cuda", "--gpu", "-1"}), *dir_, "generate-gpu.log",
                "--gpu must be >= 0");
}

// serve --all-in-one takes the workers' default-selection flags: GetModelInfo reports them, a
// request that names no selection runs the default policy (the selection metric's policy label
// shows which), and a bad default is refused before anything starts.
TEST_F(ServicesTest, ServeAllInOneDefaultSelection) {
  ExpectRefused({"serve", "--all-in-one", "--model", *model_, "--device", "cpu", "--port", "0",
                 "--selection_policy", "bogus"},
                *dir_, "serve-policy.log", "--selection_* or --prefill_chunk_size");
  const int port = FreePort(), metrics_port = FreePort();
  Process serve({BinDir() + "/tokenselect",
                 "serve",
                 "--all-in-one",
                 "--model",
                 *model_,
                 "--device",
                 "cpu",
                 "--host",
                 "127.0.0.1",
                 "--port",
                 std::to_string(port),
                 "--kv_pages",
                 "256",
                 "--metrics_host",
                 "127.0.0.1",
                 "--metrics_port",
                 std::to_string(metrics_port),
                 "--selection_policy",
                 "streaming",
                 "--selection_k",
                 "16",
                 "--selection_n_init",
                 "4",
                 "--selection_n_local",
                 "8"},
                *dir_ + "/serve-streaming.log");
  ASSERT_TRUE(WaitServing(port, "tokenselect.v1.Generation", 60)) << "see " << *dir_;
  // GetModelInfo reports them.
  const v1::ModelInfo info = ModelInfoAt(port);
  EXPECT_EQ(info.default_selection().policy(), v1::SELECTION_POLICY_STREAMING);
  EXPECT_EQ(info.default_selection().k(), 16);
  EXPECT_EQ(info.default_selection().n_local(), 8);
  auto result = Connect(port)->GenerateUnary(Greedy(LongPrompt(60), 4));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(
      MetricSum(metrics_port, "tokenselect_selection_seconds_count", {"policy=\"streaming\""}), 0);
  EXPECT_EQ(
      MetricSum(metrics_port, "tokenselect_selection_seconds_count", {"policy=\"tokenselect\""}),
      0);
}

// Flags that only mean something with TLS on are refused without it, rather than ignored.
TEST_F(ServicesTest, TlsDependentFlagsAloneAreRefused) {
  const std::vector<std::string> router = {
      "--model", *model_, "--prefill_workers", "127.0.0.1:1", "--decode_workers", "127.0.0.1:2"};
  std::vector<std::string> args = router;
  args.push_back("--tls_require_client_cert");
  ExpectRefused(args, *dir_, "router-require-cert.log", "--tls_require_client_cert needs --tls_ca",
                "router");
  args = router;
  args.insert(args.end(), {"--worker_tls_server_name", "workers.local"});
  ExpectRefused(args, *dir_, "router-server-name.log",
                "--worker_tls_server_name needs --worker_tls", "router");
  ExpectRefused({"--model", *model_, "--kv_tls_server_name", "decode.local"}, *dir_,
                "prefill-kv-server-name.log", "--kv_tls_server_name needs TLS", "prefill_worker");
}

// A standalone router reports its workers' selection defaults in GetModelInfo (they answer them
// in GetLoad), not the built-in ones.
TEST_F(ServicesTest, RouterReportsTheWorkersDefaultSelection) {
  const std::vector<std::string> selection = {"--selection_policy", "dense", "--selection_k", "64",
                                              "--selection_theta",  "0.5"};
  const int decode_port = FreePort(), prefill_port = FreePort(), port = FreePort();
  std::vector<std::string> decode = {
      BinDir() + "/decode_worker", "--model",    *model_, "--host", "127.0.0.1", "--port",
      std::to_string(decode_port), "--kv_pages", "64"};
  std::vector<std::string> prefill = {
      BinDir() + "/prefill_worker", "--model", *model_, "--host", "127.0.0.1", "--port",
      std::to_string(prefill_port)};
  decode.insert(decode.end(), selection.begin(), selection.end());
  prefill.insert(prefill.end(), selection.begin(), selection.end());
  Process d(decode, *dir_ + "/defaults-decode.log");
  Process p(prefill, *dir_ + "/defaults-prefill.log");
  Process router(
      {BinDir() + "/router", "--model", *model_, "--host", "127.0.0.1", "--port",
       std::to_string(port), "--prefill_workers", absl::StrCat("127.0.0.1:", prefill_port),
       "--decode_workers", absl::StrCat("127.0.0.1:", decode_port), "--probe_interval_s", "0.2"},
      *dir_ + "/defaults-router.log");
  ASSERT_TRUE(WaitServing(port, "tokenselect.v1.Generation", 60)) << "see " << *dir_;
  const v1::ModelInfo info = ModelInfoAt(port);
  EXPECT_EQ(info.default_selection().policy(), v1::SELECTION_POLICY_DENSE);
  EXPECT_EQ(info.default_selection().k(), 64);
  EXPECT_DOUBLE_EQ(info.default_selection().theta(), 0.5);
  EXPECT_EQ(info.default_selection().n_init(), 128);  // the built-in one: not set
}

TEST_F(ServicesTest, RemoteCliAcceptsEveryPolicy) {
  for (const char* policy : {"tokenselect", "topk", "head_vote", "dense", "streaming",
                             "tokenselect_span", "infllm", "quest", "cascade"}) {
    int rc = 0;
    const std::string out =
        RunAndCapture({BinDir() + "/tokenselect", "generate", "--server",
                       absl::StrCat("127.0.0.1:", router_port_), "--prompt", "Every policy",
                       "--max_new_tokens", "3", "--policy", policy, "--print_ids"},
                      absl::StrCat(*dir_, "/policy-", policy, ".log"), &rc);
    EXPECT_EQ(rc, 0) << policy << ", see " << *dir_;
    EXPECT_THAT(out, HasSubstr("ids: ")) << policy;
  }
}

TEST_F(ServicesTest, MetricsEndpointsCountRequests) {
  constexpr int kRequests = 3;
  const double ok_before =
      MetricSum(router_metrics_port_, "tokenselect_requests_total", {"code=\"OK\""});
  const double ttft_before =
      MetricSum(router_metrics_port_, "tokenselect_time_to_first_token_seconds_count", {});
  auto client = Connect();
  for (int i = 0; i < kRequests; ++i) {
    // A budget below the prompt length, so that decode steps select (and use the cache).
    clients::GenerateInput in = Greedy(absl::StrCat("Metrics ", i, LongPrompt(60)), 6);
    in.selection.policy = "tokenselect";
    in.selection.k = 16;
    in.selection.n_init = 4;
    in.selection.n_local = 8;
    auto result = client->GenerateUnary(in);
    ASSERT_TRUE(result.ok()) << result.status();
  }
  EXPECT_GE(MetricSum(router_metrics_port_, "tokenselect_requests_total", {"code=\"OK\""}),
            ok_before + kRequests);
  EXPECT_GE(MetricSum(router_metrics_port_, "tokenselect_time_to_first_token_seconds_count", {}),
            ttft_before + kRequests);
  EXPECT_GT(MetricSum(router_metrics_port_, "tokenselect_inter_token_latency_seconds_count", {}),
            0);
  EXPECT_GE(MetricSum(router_metrics_port_, "tokenselect_e2e_request_latency_seconds_count", {}),
            kRequests);
  EXPECT_GT(MetricSum(router_metrics_port_, "tokenselect_prompt_tokens_total", {}), 0);
  EXPECT_GE(MetricSum(router_metrics_port_, "tokenselect_generation_tokens_total", {}),
            6 * kRequests);
  EXPECT_EQ(MetricSum(router_metrics_port_, "tokenselect_healthy_workers", {"role=\"decode\""}), 2);
  // The workers' share, summed over both of each kind.
  double chunks = 0, transfers = 0, lookups = 0, decode_queue = 0;
  for (const Worker& p : *prefill_) {
    chunks += MetricSum(p.metrics_port, "tokenselect_prefill_chunk_seconds_count", {});
    transfers += MetricSum(p.metrics_port, "tokenselect_kv_transfers_total",
                           {"transport=\"host\"", "outcome=\"ok\""});
  }
  for (const Worker& d : *decode_) {
    lookups += MetricSum(d.metrics_port, "tokenselect_selection_cache_lookups_total",
                         {"policy=\"tokenselect\""});
    decode_queue +=
        MetricSum(d.metrics_port, "tokenselect_queue_time_seconds_count", {"phase=\"decode\""});
  }
  EXPECT_GE(chunks, kRequests);
  EXPECT_GE(transfers, kRequests);
  EXPECT_GT(lookups, 0);
  EXPECT_GE(decode_queue, kRequests);
}

TEST_F(ServicesTest, CancelMidStreamFreesPages) {
  auto client = Connect();
  clients::GenerateInput in = Greedy("Cancel me after a few tokens", 2000);
  in.sampling.ignore_eos = true;
  auto stream = client->StartGenerate(in);
  clients::StreamChunk chunk;
  int tokens = 0;
  while (tokens < 3 && stream->Next(&chunk)) tokens += static_cast<int>(chunk.token_ids.size());
  EXPECT_GE(tokens, 3);
  stream->Cancel();
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(AllPagesFree(5));
}

TEST_F(ServicesTest, DeadlineExpiryFreesPages) {
  auto client = Connect();
  clients::GenerateInput in = Greedy("Run past the deadline", 3000);
  in.sampling.ignore_eos = true;
  clients::CallOptions call;
  call.timeout = absl::Milliseconds(300);
  auto result = client->Generate(in, call, nullptr);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_TRUE(AllPagesFree(5));
}

TEST_F(ServicesTest, BadInputIsInvalidArgumentNamingTheField) {
  auto client = Connect();
  struct Case {
    std::string field;
    std::function<void(clients::GenerateInput*)> edit;
  };
  const std::vector<Case> cases = {
      {"input", [](clients::GenerateInput* in) { in->prompt.clear(); }},
      {"top_p", [](clients::GenerateInput* in) { in->sampling.top_p = 1.5f; }},
      {"temperature", [](clients::GenerateInput* in) { in->sampling.temperature = -1; }},
      {"max_new_tokens", [](clients::GenerateInput* in) { in->sampling.max_new_tokens = 0; }},
      {"selection.k", [](clients::GenerateInput* in) { in->selection.k = -3; }},
      {"prompt", [](clients::GenerateInput* in) { in->prompt = LongPrompt(4000); }},
      {"prompt_token_ids",
       [](clients::GenerateInput* in) {
         in->prompt.clear();
         in->prompt_ids = {1, 2, 999999};
       }},
  };
  for (const Case& c : cases) {
    clients::GenerateInput in = Greedy("fine", 4);
    c.edit(&in);
    auto result = client->GenerateUnary(in);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(c.field));
  }
  // An enum value this server does not know (a newer client's policy).
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", router_port_),
                                                          grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  request.set_prompt("fine");
  request.mutable_selection()->set_policy(static_cast<v1::SelectionPolicy>(99));
  grpc::ClientContext context;
  v1::GenerateUnaryResponse response;
  grpc::Status status = stub->GenerateUnary(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("selection.policy"));
}

TEST_F(ServicesTest, OverCapacityIsResourceExhausted) {
  auto client = Connect();
  // A request no decode worker could ever hold is rejected by the worker as INVALID_ARGUMENT.
  auto never = client->GenerateUnary(Greedy("too big", kDecodePages * kPageSize + 100));
  EXPECT_EQ(never.status().code(), absl::StatusCode::kInvalidArgument) << never.status();
  // Fill both decode workers with one long request each; a third does not fit anywhere.
  constexpr int kLong = kDecodePages * kPageSize * 3 / 4;
  std::vector<std::unique_ptr<clients::GenerateStream>> holders;
  for (int i = 0; i < 2; ++i) {
    clients::GenerateInput in = Greedy(absl::StrCat("hold ", i), kLong);
    in.sampling.ignore_eos = true;
    holders.push_back(client->StartGenerate(in));
    clients::StreamChunk chunk;
    ASSERT_TRUE(holders.back()->Next(&chunk)) << holders.back()->Finish();
  }
  auto full = client->GenerateUnary(Greedy("no room", kLong));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  for (auto& h : holders) {
    h->Cancel();
    h->Finish().IgnoreError();
  }
  EXPECT_TRUE(AllPagesFree(5));
}

TEST_F(ServicesTest, ModelInfoAndTokenize) {
  auto client = Connect();
  auto info = client->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->architecture, "LlamaForCausalLM");
  EXPECT_EQ(info->vocab_size, 2048);
  EXPECT_EQ(info->max_prompt_tokens, 3500);
  auto ids = client->Tokenize("hello");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_FALSE(ids->empty());
}

// Runs last: it kills a prefill worker.
TEST_F(ServicesTest, KilledPrefillWorkerCompletesElsewhereOrFailsUnavailable) {
  auto client = Connect();
  const std::string prompt = LongPrompt(700);  // ~2500 tokens: a prefill of seconds
  absl::StatusOr<clients::GenerateResult> result;
  std::thread request([&] { result = client->GenerateUnary(Greedy(prompt, 8)); });
  // Kill the prefill worker that has the request, while it is prefilling.
  Worker* busy = nullptr;
  for (int i = 0; i < 2000 && busy == nullptr; ++i) {
    for (Worker& w : *prefill_) {
      if (QueuedPrefillTokens(w.port) > 0) busy = &w;
    }
    if (busy == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_NE(busy, nullptr) << "no prefill worker reported the request";
  busy->process.Kill(SIGKILL);
  request.join();
  if (result.ok()) {
    EXPECT_EQ(result->token_ids, OfflineIds(prompt, 8));
  } else {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  }
  EXPECT_TRUE(AllPagesFree(10));
  // The router keeps serving on the surviving prefill worker.
  auto after = client->GenerateUnary(Greedy("still serving", 4));
  EXPECT_TRUE(after.ok()) << after.status();
}

}  // namespace
}  // namespace tokenselect::testing
