#include "common/metrics/metrics_server.h"

#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "httplib.h"

namespace tokenselect::common::metrics {
namespace {
// How long Start() waits for the listener thread to enter its accept loop.
constexpr auto kStartTimeout = std::chrono::seconds(10);
}  // namespace

MetricsServer::MetricsServer(const Registry* registry, MetricsServerOptions options)
    : registry_(registry), options_(std::move(options)) {}

MetricsServer::~MetricsServer() { Stop(); }

absl::Status MetricsServer::Start() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kNew) {
    return absl::FailedPreconditionError("metrics server: Start() may be called once");
  }
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: port ", options_.port, " is outside [0, 65535]"));
  }
  auto server = std::make_unique<httplib::Server>();
  const int threads = options_.threads > 0 ? options_.threads : 1;
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default adds SO_REUSEPORT, which lets a second process bind the same port and
  // silently take half the scrapes; SO_REUSEADDR alone still allows quick restarts.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const Registry* registry = registry_;
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), std::string(kExpositionContentType).c_str());
  });
  std::function<bool()> healthy = options_.healthy;
  server->Get("/healthz", [healthy, serving = serving_](const httplib::Request&,
                                                         httplib::Response& res) {
    const bool up = serving->load();
    const bool ok = up && (!healthy || healthy());
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : (up ? "unhealthy\n" : "not serving\n"),
                    "text/plain; charset=utf-8");
  });

  int port = options_.port;
  if (port == 0) {
    port = server->bind_to_any_port(options_.host);
    if (port < 0) port = 0;
  } else if (!server->bind_to_port(options_.host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot listen on ", options_.host, ":", options_.port));
  }
  httplib::Server* raw = server.get();
  std::thread thread([raw] { raw->listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (!raw->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!raw->is_running()) {
    // The accept loop never started; it cannot be stopped either, so leave the thread to end
    // with the process rather than block here.
    thread.detach();
    (void)server.release();
    state_ = State::kStopped;
    return absl::UnavailableError("metrics server: listener thread did not start");
  }
  server_ = std::move(server);
  thread_ = std::move(thread);
  port_ = port;
  state_ = State::kRunning;
  TS_LOG(INFO, "metrics: serving /metrics and /healthz on {}:{}", options_.host, port);
  return absl::OkStatus();
}

void MetricsServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kRunning) {
    state_ = State::kStopped;
    return;
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
  state_ = State::kStopped;
}

void MetricsServer::SetServing(bool serving) { serving_->store(serving); }

void SetServingIfEnabled(MetricsServer* server, bool serving) {
  if (server != nullptr) server->SetServing(serving);
}

int MetricsServer::port() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kRunning ? port_ : 0;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerIfEnabled(
    int port, const std::string& host) {
  if (port == 0) return std::unique_ptr<MetricsServer>();
  MetricsServerOptions options;
  options.host = host;
  options.port = port;
  auto server = std::make_unique<MetricsServer>(&Registry::Default(), std::move(options));
  RETURN_IF_ERROR(server->Start());
  return server;
}

}  // namespace tokenselect::common::metrics
