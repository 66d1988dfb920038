// Runs one validated request on the workers (docs/DESIGN.md section 2, steps 2-5): picks a decode
// worker D by free KV and a prefill worker P by queued prefill tokens, opens D.Decode (reservation
// first), calls P.Prefill with D's address and the reservation, then relays D's token stream.
//
// Failure handling:
//   - D rejects with RESOURCE_EXHAUSTED (or is unreachable): the next decode worker is tried; when
//     every one is full the request fails RESOURCE_EXHAUSTED.
//   - P fails (other than CANCELLED / DEADLINE_EXCEEDED / INVALID_ARGUMENT): D's stream is
//     cancelled (D frees the reservation) and the request is retried once from the reservation on
//     another prefill worker. Nothing has reached the client yet, so the retry is invisible.
//   - D fails after tokens were sent: the error reaches the client (UNAVAILABLE for a lost
//     worker).
//   - The client cancels or its deadline passes: both worker calls are children of the server
//     call (grpc::ClientContext::FromServerContext), so gRPC cancels them and propagates the
//     deadline; the workers free their pages.
// Generated proto types stay in dispatch_service.cc.
#ifndef TOKENSELECT_ROUTER_DISPATCH_SERVICE_H_
#define TOKENSELECT_ROUTER_DISPATCH_SERVICE_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "params/selection_options.h"
#include "router/request_spec.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace tokenselect::router {

// Called for every event in order, the final one last; returns false when the client is gone
// (the request is then cancelled on the workers).
using EmitFn = std::function<bool(const StreamEvent&)>;

class Dispatcher {
 public:
  // `registry` and `metrics` (null: no metrics) must outlive the dispatcher.
  explicit Dispatcher(WorkerRegistry* registry, const RouterMetrics* metrics = nullptr)
      : registry_(registry), metrics_(metrics) {}

  // Runs `spec`; `server_context` (may be null in tests) is the parent of the worker calls.
  // `arrival` is when the request arrived (for queue and TTFT timings). Records TTFT,
  // inter-token and end-to-end latency and the token counters (not the outcome: the caller
  // knows the final status). Errors: UNAVAILABLE (no
  // healthy worker of a kind, or a worker lost), RESOURCE_EXHAUSTED (every decode worker full),
  // the workers' INVALID_ARGUMENT / DEADLINE_EXCEEDED / CANCELLED.
  absl::Status Run(grpc::ServerContext* server_context, const RequestSpec& spec, absl::Time arrival,
                   const EmitFn& emit) const;

  // The GetLoad probe the registry polls with.
  static LoadProbe MakeLoadProbe();

  // The selection defaults the workers report (a healthy decode worker's, else a prefill
  // worker's); nullopt until a probe has seen one.
  std::optional<params::SelectionOptions> WorkersDefaultSelection() const;

 private:
  WorkerRegistry* registry_;
  const RouterMetrics* metrics_;
};

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_DISPATCH_SERVICE_H_
