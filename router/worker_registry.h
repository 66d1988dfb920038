// The router's view of its workers. Targets come from flags (--prefill_workers,
// --decode_workers): comma-separated "host:port" entries, or "dns:///name:port", which resolves
// to every address of `name` (a Kubernetes headless Service gives one per pod) and is
// re-resolved periodically. A background thread health-checks every worker
// (grpc.health.v1 Check) and polls its load; routing picks among the healthy ones.
#ifndef TOKENSELECT_ROUTER_WORKER_REGISTRY_H_
#define TOKENSELECT_ROUTER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "params/selection_options.h"
#include "rpc/channels.h"

namespace tokenselect::router {

enum class WorkerKind { kPrefill, kDecode };
const char* WorkerKindName(WorkerKind kind);

// tokenselect.v1.WorkerLoad without the proto.
struct WorkerLoadInfo {
  int64_t queued_prefill_tokens = 0;
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t free_kv_pages = 0;
  int64_t total_kv_pages = 0;
  int64_t page_size = 0;
  bool draining = false;
  // The worker's selection defaults; nullopt from a worker that does not report them.
  std::optional<params::SelectionOptions> default_selection;
};

struct WorkerSnapshot {
  std::string address;  // "ip:port" as dialled and as handed to other workers
  std::shared_ptr<grpc::Channel> channel;
  WorkerLoadInfo load;
  int64_t inflight = 0;         // requests this router has on it now
  int64_t inflight_tokens = 0;  // their prompt tokens (prefill) or reserved tokens (decode)
};

// Reads a worker's load (GetLoad); supplied by dispatch_service.cc, which owns the stubs.
using LoadProbe = std::function<absl::StatusOr<WorkerLoadInfo>(
    WorkerKind, const std::shared_ptr<grpc::Channel>&, absl::Duration timeout)>;

struct WorkerRegistryOptions {
  std::vector<std::string> prefill_targets;
  std::vector<std::string> decode_targets;
  rpc::ChannelOptions channel;
  LoadProbe load_probe;                                     // may be empty (no load polling)
  absl::Duration probe_interval = absl::Milliseconds(500);  // health + load
  absl::Duration resolve_interval = absl::Seconds(10);      // dns:/// targets
  absl::Duration probe_timeout = absl::Seconds(1);
};

// Splits a flag value "a:1,dns:///b:2" into targets; InvalidArgument for an entry without a port.
absl::StatusOr<std::vector<std::string>> ParseTargets(const std::string& flag_value);

// "ip:port" for each address of a target: itself for "host:port", every resolved address for
// "dns:///name:port" (or "dns:name:port"). Unavailable when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target);

class WorkerRegistry {
 public:
  // Resolves the targets, probes every worker once and starts the background thread.
  // InvalidArgument for malformed targets; a name that does not resolve yet is retried later.
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(WorkerRegistryOptions options);
  ~WorkerRegistry();

  // Healthy, non-draining workers of `kind` with their last load, in address order.
  std::vector<WorkerSnapshot> Healthy(WorkerKind kind) const;
  // Every known worker and whether it is healthy (for logs and the `health` command).
  std::vector<std::pair<std::string, bool>> All(WorkerKind kind) const;

  // The router's own accounting between load polls.
  void AddInflight(WorkerKind kind, const std::string& address, int64_t requests, int64_t tokens);
  // After a failed call: treat the worker as unhealthy until the next successful probe.
  void MarkUnhealthy(WorkerKind kind, const std::string& address);
  // Probes every worker now (tests; the background thread calls it periodically).
  void ProbeAll();

 private:
  struct Worker {
    std::shared_ptr<grpc::Channel> channel;
    bool healthy = false;
    WorkerLoadInfo load;
    int64_t inflight = 0;
    int64_t inflight_tokens = 0;
  };
  using WorkerMap = std::map<std::string, Worker>;

  explicit WorkerRegistry(WorkerRegistryOptions options);
  void Resolve();
  void Loop();
  WorkerMap& Map(WorkerKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return kind == WorkerKind::kPrefill ? prefill_ : decode_;
  }
  const WorkerMap& Map(WorkerKind kind) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return kind == WorkerKind::kPrefill ? prefill_ : decode_;
  }

  const WorkerRegistryOptions options_;
  mutable absl::Mutex mu_;
  WorkerMap prefill_ ABSL_GUARDED_BY(mu_);
  WorkerMap decode_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_WORKER_REGISTRY_H_
