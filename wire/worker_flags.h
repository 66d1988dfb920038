// The flags both worker binaries share, defined once here: the model (--model, --load_format),
// where to listen (--host; --port stays per binary, its default differs), --drain_timeout_ms,
// the device and KV capacity (--device, --gpu, --kv_pages, --page_size, --max_chunk,
// --max_batch, --gpu_memory_fraction; engine/generation/worker_backend.h), the device K/V links'
// --kv_link_timeout_ms, and the start-up flags of worker_setup.h (--tls_*, --metrics_*).
// Linked by the two worker binaries only (the CLI's `serve` has its own flags of these names).
#ifndef TOKENSELECT_WIRE_WORKER_FLAGS_H_
#define TOKENSELECT_WIRE_WORKER_FLAGS_H_

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

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_WORKER_FLAGS_H_
