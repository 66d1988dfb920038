// The start-up both worker binaries share, from their flag values: server credentials for the
// --tls_* flags, the default selection (--selection_*, selection_flags.h) and the optional /metrics
// endpoint; and the start and stop of their gRPC servers. The values come in as options: the
// worker binaries read them from the flags of worker_flags.h (the CLI's `serve`, which links both
// workers, has flags of its own).
#ifndef TOKENSELECT_WIRE_WORKER_SETUP_H_
#define TOKENSELECT_WIRE_WORKER_SETUP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_server.h"
#include "engine/selection/selection_options.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "rpc/credentials.h"

namespace tokenselect::wire {

struct WorkerSetupOptions {
  std::string tls_cert, tls_key, tls_ca;  // --tls_cert, --tls_key, --tls_ca
  bool tls_require_client_cert = true;    // with --tls_ca: mTLS
  int metrics_port = 0;                   // 0: no /metrics endpoint
  std::string metrics_host = "0.0.0.0";
};

struct WorkerSetup {
  rpc::TlsOptions tls;  // as parsed (for workers that also dial out with the same certificate)
  std::shared_ptr<grpc::ServerCredentials> credentials;
  engine::SelectionOptions default_selection;
  std::unique_ptr<common::metrics::MetricsServer> metrics_server;  // null when metrics are off
};

// InvalidArgument (naming the flag) for bad TLS or selection flags; the metrics server's error
// (e.g. the port is taken) otherwise.
absl::StatusOr<WorkerSetup> SetUpWorker(const WorkerSetupOptions& options);

// The exit code a worker main returns for a failed SetUpWorker: 2 for bad flags, 1 otherwise.
int SetupExitCode(const absl::Status& status);

// A worker's gRPC server, started: health checking and reflection on, `service` registered on
// `listen_address` (null credentials: plaintext), messages up to max_receive_message_bytes.
// Unavailable "<who>: cannot listen on <address>" when the address cannot be bound.
struct WorkerServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;          // the bound port (the one picked for port 0)
  std::string address;   // what clients dial (rpc::DialTarget)
};
absl::StatusOr<WorkerServer> StartWorkerServer(absl::string_view who,
                                               const std::string& listen_address,
                                               std::shared_ptr<grpc::ServerCredentials> credentials,
                                               int max_receive_message_bytes,
                                               grpc::Service* service);

// Stops a worker's server in the order both workers need: health checks answer NOT_SERVING
// first (probes stop routing to it), then `drain` runs (the worker's engine ends its open
// streams), then the server shuts down with 1 s for the calls still open and is waited for.
// `drain` runs also when the server never started (null server).
void StopWorkerServer(WorkerServer* server, const std::function<void()>& drain);

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_WORKER_SETUP_H_
