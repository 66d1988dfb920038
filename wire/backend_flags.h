// The workers' device and KV-capacity flags (--device, --gpu, --kv_pages, --page_size,
// --max_chunk, --max_batch, --gpu_memory_fraction) and the prefill worker's --transport, defined
// once for both worker binaries (engine/generation/worker_backend.h says what they choose).
#ifndef TOKENSELECT_WIRE_BACKEND_FLAGS_H_
#define TOKENSELECT_WIRE_BACKEND_FLAGS_H_

#include "absl/status/statusor.h"
#include "engine/generation/worker_backend.h"

namespace tokenselect::wire {

// The flags as WorkerBackendOptions; InvalidArgument naming the flag for a bad value.
absl::StatusOr<engine::WorkerBackendOptions> BackendOptionsFromFlags();

}  // namespace tokenselect::wire

#endif  // TOKENSELECT_WIRE_BACKEND_FLAGS_H_
