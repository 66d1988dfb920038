// The prefill worker's engine, without gRPC (prefill_service.cc translates): a FIFO queue of
// prefill jobs run by `num_threads` threads (one job at a time each). A job is the request's
// chunked prefill on the worker's GenerationBackend (CPU or GPU, engine/generation/backend.h):
// selection.chunk_size tokens per forward pass, through the request's own selection provider, so
// non-dense policies select with the chunk's mean query, with each finished chunk's K/V handed to
// the transport's KvChunkSender (host: PipelinedKvSender; GPU to GPU: the NCCL sender), which
// pushes it to the decode worker while the next chunk is computed; then the first token is sampled (the request's seed, or one picked here
// and sent along in KvFinal) and the stream is finished with it and the selection policy's
// per-layer state (engine/transfer/selection_state.h). docs/DESIGN.md section 2 step 3.
//
// Cancel (by request id), the job's deadline and shutdown abort a job between chunks and while it
// waits for the transfer; every end frees the job's pages and closes its KV stream.
#ifndef TOKENSELECT_PREFILL_WORKER_PREFILL_ENGINE_H_
#define TOKENSELECT_PREFILL_WORKER_PREFILL_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics/tokenselect_metrics.h"
#include "engine/generation/backend.h"
#include "engine/sampling/sampling_params.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_transport.h"
#include "prefill_worker/prefill_metrics.h"

namespace tokenselect::prefill_worker {

struct PrefillEngineOptions {
  int num_threads = 1;             // prefills running at once
  int64_t max_queued = 64;         // queued + running jobs; more is ResourceExhausted
  engine::KvSenderOptions kv;      // block size, checksum, pipeline depth
  common::Clock* clock = nullptr;  // deadlines; common::Clock::Real() when null
  // Where the engine records its metrics (prefill_metrics.h); null: none. Must outlive the
  // engine. The worker also meters its KV transport with it (metered_kv_transport.h).
  const common::metrics::TokenSelectMetrics* metrics = nullptr;
};

// A tokenized request plus where its K/V goes.
struct PrefillSpec {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
  engine::SelectionOptions selection;
  // The decode worker's reservation.
  std::string decode_address;
  std::string reservation_id;
  int64_t reserved_prompt_tokens = 0;
  engine::KvLayout receiver_layout;
  std::optional<absl::Time> deadline;
};

struct PrefillResult {
  int64_t prompt_tokens = 0;
  int32_t first_token_id = -1;
  std::optional<float> first_token_logprob;
  uint64_t seed = 0;
  double queue_seconds = 0;
  double prefill_seconds = 0;
  double transfer_seconds = 0;  // from the first chunk queued to the receiver's verdict
  int64_t kv_bytes = 0;
  int64_t kv_chunks = 0;
};

struct PrefillJob;  // prefill_engine.cc

// The submitter's end of a job.
class PrefillHandle {
 public:
  explicit PrefillHandle(std::shared_ptr<PrefillJob> job) : job_(std::move(job)) {}
  // The result, or nullopt while the job runs after `timeout`.
  std::optional<absl::StatusOr<PrefillResult>> Wait(absl::Duration timeout);

 private:
  std::shared_ptr<PrefillJob> job_;
};

struct PrefillLoad {
  int64_t queued_prefill_tokens = 0;  // queued and running
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t free_pages = 0;
  int64_t total_pages = 0;
  int64_t page_size = 0;
  bool draining = false;
};

class PrefillEngine {
 public:
  // `backend` (the model and its KV pool) and `transport` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(engine::GenerationBackend* backend,
                                                               engine::KvTransport* transport,
                                                               const PrefillEngineOptions& opts);
  ~PrefillEngine();  // Shutdown(0)

  // Validates and queues. InvalidArgument naming the field (request_id, prompt_token_ids,
  // sampling.*, selection.* - chunk_size also above the backend's max_chunk - reservation.*);
  // FailedPrecondition when the receiver's KV layout
  // differs from this model's; AlreadyExists for a request id in use; ResourceExhausted when the
  // queue is full; Unavailable while draining. The job's own errors come from Wait:
  // ResourceExhausted (no pages), the transport's (Unavailable, the receiver's verdict),
  // Cancelled, DeadlineExceeded.
  absl::StatusOr<PrefillHandle> Submit(PrefillSpec spec);

  // Aborts a queued or running job; false when unknown.
  bool Cancel(const std::string& request_id, const std::string& reason);

  // Refuses new jobs, lets queued and running ones finish for `grace`, aborts the rest, joins.
  void Shutdown(absl::Duration grace);

  PrefillLoad Load() const;
  engine::KvCapacity kv_capacity() const { return backend_->kv_capacity(); }

 private:
  PrefillEngine(engine::GenerationBackend* backend, engine::KvTransport* transport,
                const PrefillEngineOptions& opts);
  void WorkerThread();
  absl::StatusOr<PrefillResult> Run(PrefillJob* job);
  void Complete(const std::shared_ptr<PrefillJob>& job, absl::StatusOr<PrefillResult> result);
  // Publishes the load gauges (no-op without metrics).
  void PublishLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  engine::GenerationBackend* backend_;
  engine::KvTransport* transport_;
  const PrefillEngineOptions options_;
  common::Clock* clock_;
  std::unique_ptr<PrefillMetrics> metrics_;  // null without options.metrics

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<PrefillJob>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<PrefillJob>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_PREFILL_ENGINE_H_
