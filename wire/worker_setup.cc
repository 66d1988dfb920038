#include "wire/worker_setup.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "rpc/channels.h"
#include "wire/selection_flags.h"

namespace tokenselect::wire {

namespace {

// Flag problems (unreadable certificate files included) are the operator's to fix: one code.
absl::Status AsFlagError(const absl::Status& status) {
  return absl::InvalidArgumentError(status.message());
}

}  // namespace

absl::StatusOr<WorkerSetup> SetUpWorker(const WorkerSetupOptions& options) {
  WorkerSetup setup;
  auto tls = rpc::TlsOptionsFromFlags(options.tls_cert, options.tls_key, options.tls_ca);
  if (!tls.ok()) return AsFlagError(tls.status());
  setup.tls = *tls;
  rpc::TlsOptions server_tls = setup.tls;
  server_tls.require_client_cert = setup.tls.enabled && options.tls_require_client_cert;
  auto credentials = rpc::MakeServerCredentials(server_tls);
  if (!credentials.ok()) return AsFlagError(credentials.status());
  setup.credentials = *credentials;
  auto selection = SelectionDefaultsFromFlags();
  if (!selection.ok()) return AsFlagError(selection.status());
  setup.default_selection = *selection;
  ASSIGN_OR_RETURN(setup.metrics_server, common::metrics::StartMetricsServerIfEnabled(
                                             options.metrics_port, options.metrics_host));
  return setup;
}

int SetupExitCode(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<WorkerServer> StartWorkerServer(absl::string_view who,
                                               const std::string& listen_address,
                                               std::shared_ptr<grpc::ServerCredentials> credentials,
                                               int max_receive_message_bytes,
                                               grpc::Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  WorkerServer started;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address,
                           credentials ? credentials : grpc::InsecureServerCredentials(),
                           &started.port);
  builder.SetMaxReceiveMessageSize(max_receive_message_bytes);
  builder.RegisterService(service);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(absl::StrCat(who, ": cannot listen on ", listen_address));
  }
  started.address = rpc::DialTarget(listen_address, started.port);
  return started;
}

void StopWorkerServer(WorkerServer* server, const std::function<void()>& drain) {
  grpc::Server* s = server->server.get();
  if (s != nullptr && s->GetHealthCheckService() != nullptr) {
    s->GetHealthCheckService()->SetServingStatus(false);
  }
  drain();
  if (s != nullptr) {
    s->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    s->Wait();
  }
}

}  // namespace tokenselect::wire
