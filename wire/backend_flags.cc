#include "wire/backend_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "common/status.h"

ABSL_FLAG(std::string, device, "cpu",
          "cpu | cuda: where the model runs (cuda: bf16 weights and KV cache on --gpu)");
ABSL_FLAG(int32_t, gpu, 0, "with --device cuda: the CUDA device ordinal");
ABSL_FLAG(int64_t, kv_pages, 4096,
          "KV-cache pages of --page_size token slots (--device cuda: 0 plans the capacity from "
          "the GPU's free memory, see --gpu_memory_fraction)");
ABSL_FLAG(int64_t, page_size, 16, "token slots per KV page");
ABSL_FLAG(int64_t, max_chunk, 512,
          "with --device cuda: the most tokens per forward step (prefill chunk sizes above it "
          "are refused)");
ABSL_FLAG(int64_t, max_batch, 64, "with --device cuda: the most sequences per decode step");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "with --device cuda and --kv_pages 0: the share of the GPU's memory this process may "
          "hold in all (weights, activations, KV)");

namespace tokenselect::wire {

absl::StatusOr<engine::WorkerBackendOptions> BackendOptionsFromFlags() {
  engine::WorkerBackendOptions o;
  o.device = absl::GetFlag(FLAGS_device);
  o.gpu = absl::GetFlag(FLAGS_gpu);
  o.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  o.page_size = absl::GetFlag(FLAGS_page_size);
  o.max_chunk = absl::GetFlag(FLAGS_max_chunk);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  RETURN_IF_ERROR(engine::ValidateWorkerBackendOptions(o));
  return o;
}

}  // namespace tokenselect::wire
