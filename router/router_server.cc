#include "router/router_server.h"

#include <chrono>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "router/generation_service.h"

namespace tokenselect::router {
namespace {
constexpr char kServiceName[] = "tokenselect.v1.Generation";
}  // namespace

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(RouterOptions options) {
  std::unique_ptr<RouterServer> router(new RouterServer());
  router->probe_interval_ = options.probe_interval;
  ASSIGN_OR_RETURN(router->model_, LoadServedModel(options.model_dir, options.max_prompt_tokens,
                                                   options.model_name));
  GenerationServiceOptions service_options;
  if (!options.api_keys_file.empty()) {
    ASSIGN_OR_RETURN(service_options.api_keys, rpc::ApiKeys::LoadFile(options.api_keys_file));
  }
  WorkerRegistryOptions registry_options;
  registry_options.prefill_targets = options.prefill_targets;
  registry_options.decode_targets = options.decode_targets;
  registry_options.channel = options.workers;
  registry_options.load_probe = Dispatcher::MakeLoadProbe();
  registry_options.probe_interval = options.probe_interval;
  registry_options.resolve_interval = options.resolve_interval;
  ASSIGN_OR_RETURN(router->registry_, WorkerRegistry::Create(std::move(registry_options)));
  if (options.metrics != nullptr) {
    router->metrics_ = std::make_unique<RouterMetrics>(*options.metrics);
  }
  router->dispatcher_ =
      std::make_unique<Dispatcher>(router->registry_.get(), router->metrics_.get());
  service_options.metrics = router->metrics_.get();
  service_options.model = &router->model_;
  service_options.dispatcher = router->dispatcher_.get();
  service_options.default_selection = options.default_selection;
  router->service_ = NewGenerationService(std::move(service_options));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RETURN_IF_ERROR(
      rpc::ConfigureServer(builder, options.listen_address, options.server, &router->port_));
  builder.RegisterService(router->service_.get());
  router->server_ = builder.BuildAndStart();
  if (!router->server_ || router->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  router->ReadinessOnce();
  router->readiness_ = std::thread([r = router.get()] { r->ReadinessLoop(); });
  TS_LOG(INFO, "router serving model {} on port {} ({} prefill, {} decode targets)",
         router->model_.name, router->port_, options.prefill_targets.size(),
         options.decode_targets.size());
  return router;
}

void RouterServer::ReadinessOnce() {
  const size_t prefill = registry_->Healthy(WorkerKind::kPrefill).size();
  const size_t decode = registry_->Healthy(WorkerKind::kDecode).size();
  if (metrics_ != nullptr) {
    metrics_->SetHealthyWorkers(static_cast<int64_t>(prefill), static_cast<int64_t>(decode));
  }
  const bool ready = prefill > 0 && decode > 0;
  server_->GetHealthCheckService()->SetServingStatus(kServiceName, ready);
}

void RouterServer::ReadinessLoop() {
  while (!stop_.WaitForNotificationWithTimeout(probe_interval_)) ReadinessOnce();
}

void RouterServer::Shutdown(absl::Duration drain) {
  std::call_once(shutdown_once_, [&] {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (readiness_.joinable()) readiness_.join();
    // NOT_SERVING first so that load balancers and probes stop sending new requests.
    server_->GetHealthCheckService()->SetServingStatus(false);
    TS_LOG(INFO, "router draining (up to {})", absl::FormatDuration(drain));
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(drain));
  });
}

void RouterServer::Wait() { server_->Wait(); }

RouterServer::~RouterServer() {
  if (server_) {
    Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (readiness_.joinable()) readiness_.join();
}

}  // namespace tokenselect::router
