// The public tokenselect.v1.Generation service (proto/tokenselect/v1/generate.proto): checks the
// API key, validates and tokenizes the request, and hands it to the Dispatcher; Tokenize and
// GetModelInfo are answered from the router's own tokenizer and config.json.
#ifndef TOKENSELECT_ROUTER_GENERATION_SERVICE_H_
#define TOKENSELECT_ROUTER_GENERATION_SERVICE_H_

#include <memory>

#include "grpcpp/impl/codegen/service_type.h"
#include "params/selection_options.h"
#include "router/dispatch_service.h"
#include "router/served_model.h"
#include "rpc/api_keys.h"

namespace tokenselect::router {

struct GenerationServiceOptions {
  const ServedModel* model = nullptr;      // must outlive the service
  const Dispatcher* dispatcher = nullptr;  // must outlive the service
  rpc::ApiKeys api_keys;                   // empty: no authentication
  const RouterMetrics* metrics = nullptr;  // requests by outcome; null: none recorded
  // GetModelInfo's default_selection until a worker reports its own.
  params::SelectionOptions default_selection;
};

std::unique_ptr<grpc::Service> NewGenerationService(GenerationServiceOptions options);

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_GENERATION_SERVICE_H_
