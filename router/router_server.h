// The router process in one object: loads the served model's tokenizer and config.json, builds
// the worker registry, and serves tokenselect.v1.Generation, grpc.health.v1.Health (overall ""
// always SERVING while up; "tokenselect.v1.Generation" SERVING while at least one prefill and one
// decode worker are healthy) and server reflection on one port. Used by the `router` binary and
// by `tokenselect serve --all-in-one`.
#ifndef TOKENSELECT_ROUTER_ROUTER_SERVER_H_
#define TOKENSELECT_ROUTER_ROUTER_SERVER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics/tokenselect_metrics.h"
#include "grpcpp/server.h"
#include "params/selection_options.h"
#include "router/dispatch_service.h"
#include "router/router_metrics.h"
#include "router/served_model.h"
#include "router/worker_registry.h"
#include "rpc/channels.h"

namespace tokenselect::router {

struct RouterOptions {
  std::string model_dir;          // tokenizer.json, tokenizer_config.json, config.json
  std::string model_name;         // empty: the directory name
  int64_t max_prompt_tokens = 0;  // 0: config.json max_position_embeddings
  std::string listen_address = "0.0.0.0:50051";  // port 0 picks a free port
  rpc::ServerOptions server;                     // public port: TLS and message size limit
  rpc::ChannelOptions workers;  // channels to the workers (mTLS when cert + key + CA)
  std::vector<std::string> prefill_targets;
  std::vector<std::string> decode_targets;
  std::string api_keys_file;  // empty: no API keys
  absl::Duration probe_interval = absl::Milliseconds(500);
  absl::Duration resolve_interval = absl::Seconds(10);
  // Where the router records its metrics (docs/metrics.md); null: none. Must outlive the server.
  const common::metrics::TokenSelectMetrics* metrics = nullptr;
  // What GetModelInfo reports as the workers' selection defaults until a worker has reported
  // its own (WorkerLoad.default_selection): the built-in ones unless the caller knows better
  // (serve --all-in-one passes its workers').
  params::SelectionOptions default_selection;
};

class RouterServer {
 public:
  // Errors: NotFound / InvalidArgument for the model files, the worker targets, the TLS files or
  // the API keys file; Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(RouterOptions options);
  ~RouterServer();

  int port() const { return port_; }

  // Marks the service NOT_SERVING, stops accepting calls and waits up to `drain` for in-flight
  // requests, then cancels what is left. Idempotent.
  void Shutdown(absl::Duration drain);
  // Blocks until the server has shut down.
  void Wait();

 private:
  RouterServer() = default;
  void ReadinessOnce();
  void ReadinessLoop();

  ServedModel model_;
  std::unique_ptr<RouterMetrics> metrics_;  // null without RouterOptions::metrics
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Duration probe_interval_;
  absl::Notification stop_;
  std::thread readiness_;
  std::once_flag shutdown_once_;
};

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_ROUTER_SERVER_H_
