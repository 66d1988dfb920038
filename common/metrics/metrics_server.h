// A small HTTP server for Prometheus: GET /metrics renders a Registry in the text format 0.0.4,
// GET /healthz answers "ok" once the process says it serves (SetServing), 503 before that, while
// draining and when the health callback says no. One listener thread and a couple of worker
// threads; nothing else runs on it.
//
//   MetricsServerOptions options;
//   options.port = absl::GetFlag(FLAGS_metrics_port);  // binaries skip all this when it is 0
//   MetricsServer server(&Registry::Default(), options);
//   RETURN_IF_ERROR(server.Start());   // /metrics answers; /healthz is 503 "not serving"
//   ... start the gRPC server ...
//   server.SetServing(true);           // /healthz: 200 "ok"
//   ... on SIGTERM: server.SetServing(false), drain ...
//   server.Stop();                     // also done by the destructor
#ifndef TOKENSELECT_COMMON_METRICS_METRICS_SERVER_H_
#define TOKENSELECT_COMMON_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"

namespace httplib {
class Server;
}

namespace tokenselect::common::metrics {

struct MetricsServerOptions {
  // Address to listen on; "0.0.0.0" for every interface (pods), "127.0.0.1" for tests.
  std::string host = "0.0.0.0";
  // 0 picks a free port (see MetricsServer::port()). Binaries treat --metrics_port=0 as "off"
  // and never construct a server then.
  int port = 0;
  // Worker threads answering requests.
  int threads = 2;
  // While serving, /healthz answers 200 "ok" when this returns true (or is empty), 503 otherwise.
  std::function<bool()> healthy;
};

class MetricsServer {
 public:
  // `registry` must outlive the server.
  MetricsServer(const Registry* registry, MetricsServerOptions options);
  ~MetricsServer();  // Stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds and starts serving; returns once the server accepts connections.
  // FailedPrecondition when already started (a stopped server cannot start again);
  // InvalidArgument for a port outside [0, 65535]; Unavailable when the address cannot be bound
  // (port in use, bad host).
  absl::Status Start();

  // Stops listening, finishes requests in flight and joins the threads. Idempotent.
  void Stop();

  // Whether /healthz may answer 200: false from construction until the process's gRPC server
  // accepts calls, and again once it drains. Probes (Kubernetes readiness with TLS, where the
  // kubelet cannot speak gRPC health) then never see "ok" before the port they guard listens.
  void SetServing(bool serving);

  // The bound port while running (the chosen one when options.port was 0); 0 before Start()
  // and after Stop().
  int port() const;

 private:
  enum class State { kNew, kRunning, kStopped };

  const Registry* const registry_;
  const MetricsServerOptions options_;
  // Shared with the /healthz handler, which may run on a worker thread after Stop() returns.
  const std::shared_ptr<std::atomic<bool>> serving_ = std::make_shared<std::atomic<bool>>(false);
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  int port_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<httplib::Server> server_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// What the binaries do with --metrics_port / --metrics_host: nullptr when `port` is 0 (metrics
// off), else a started server on Registry::Default(), not yet serving (see SetServing). Errors
// from MetricsServer::Start.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerIfEnabled(int port,
                                                                           const std::string& host);
// server->SetServing(serving), or nothing for StartMetricsServerIfEnabled's nullptr (metrics off).
void SetServingIfEnabled(MetricsServer* server, bool serving);

}  // namespace tokenselect::common::metrics

#endif  // TOKENSELECT_COMMON_METRICS_METRICS_SERVER_H_
