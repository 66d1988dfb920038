// The flags both worker binaries share, defined once here: the model (--model, --load_format),
// where to listen (--host; --port stays per binary, its default differs), --drain_timeout_ms,
// the device and KV capacity (--device, --gpu, --kv_pages, --page_size, --max_chunk,
// --max_batch, --gpu_memory_fraction; engine/generation/worker_backend.h), the device K/V links'
// --kv_link_timeout_ms, and the start-up flags of worker_setup.h (--tls_*, --metrics_*).
// Linked by the two worker binaries only (the CLI's `serve` has its own flags of these names).
#ifndef TOKENSELECT_WIRE_WORKER_FLAGS_H_
#define TOKENSELECT_WIRE_WORKER_FLAGS_H_

#include <signal.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/generation/worker_backend.h"
#include "engine/transfer/kv_links.h"
#include "wire/worker_setup.h"

namespace tokenselect::wire {

struct WorkerFlags {
  std::string model_dir;
  std::string load_format;
  std::string host;
  absl::Duration drain_timeout;
  engine::WorkerBackendOptions backend;
  engine::KvLinkOptions links;
  WorkerSetupOptions setup;
};

// The flags' values; InvalidArgument naming the flag for a missing --model or a bad device / KV
// capacity flag (ValidateWorkerBackendOptions).
absl::StatusOr<WorkerFlags> WorkerFlagsFromFlags();

// The first lines of both worker mains: parses the command line (`usage` for --help), reads the
// shared flags, and blocks SIGINT and SIGTERM in this thread and every thread started after it
// (*signals: the set, for WaitForTermination). On bad flags it prints the message to stderr and
// returns the error (the main exits with 2).
absl::StatusOr<WorkerFlags> StartWorkerMain(int argc, char** argv, const char* usage,
                                            sigset_t* signals);

// Waits for one of `signals` (blocked by StartWorkerMain) and logs it as `who`'s.
void WaitForTermination(const sigset_t& signals, const char* who);

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_WORKER_FLAGS_H_
