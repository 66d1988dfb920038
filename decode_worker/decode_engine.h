// The decode worker's engine, without gRPC (decode_service.cc translates): admission by KV
// reservation, reception of the K/V pushed by a prefill worker, and one decode loop thread that
// runs continuous batching over every running request, on the worker's GenerationBackend (CPU or
// GPU, engine/generation/backend.h). docs/DESIGN.md section 2, steps 2 and 4.
//
// A request's life here:
//   Admit      reserves prompt + max_new_tokens token slots (all or nothing; a SequenceRunner of the
//              backend, which also holds the request's selection provider) and returns a session
//              holding a lease: if no KV message arrives for lease_timeout (common::Clock time;
//              every accepted block renews it) the reservation is freed and the session ends with
//              DeadlineExceeded.
//   AcceptKv / FinishKv  validate and write the K/V into the reserved slots (KvReceiver); the
//              final record brings the first token (sampled by the prefill worker), the seed and
//              the selection policy's per-layer state, restored into the request's runner
//              before its first decode step. With the NCCL transport the blocks' bytes come
//              through the stream's KvSideChannel (engine/transfer/kv_store.h).
//   decode loop  between steps, takes newly complete requests into the running batch (emitting
//              their first token), then advances every running request by one token: one
//              GenerationBackend::DecodeBatch over all of them (each with its own selection
//              provider, hence its own selection cache),
//              Sampler (same seed; step t keys the draw, so the stream continues the prefill
//              worker's), StopChecker and StreamDecoder (this worker holds the tokenizer, applies
//              stop strings and sends text deltas with the ids; the router passes text through).
//   Cancel     ends the session with Cancelled; pages of a request not yet running are freed at
//              once, those of a running one at the start of the next step.
// Every end (finish, error, cancel, lease expiry, shutdown) frees the pages.
#ifndef TOKENSELECT_DECODE_WORKER_DECODE_ENGINE_H_
#define TOKENSELECT_DECODE_WORKER_DECODE_ENGINE_H_

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
#include "decode_worker/decode_metrics.h"
#include "engine/generation/backend.h"
#include "engine/sampling/finish_reason.h"
#include "engine/sampling/logprobs.h"
#include "engine/sampling/sampling_params.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_transport.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::decode_worker {

struct DecodeEngineOptions {
  // A reservation is freed when no KV message arrives for this long.
  absl::Duration lease_timeout = absl::Seconds(30);
  common::Clock* clock = nullptr;  // common::Clock::Real() when null
  int64_t max_running = 256;       // running + waiting requests; more is ResourceExhausted
  // Where the engine records its metrics (decode_metrics.h); null: none. Must outlive the engine.
  const common::metrics::TokenSelectMetrics* metrics = nullptr;
  // Also record tokenselect_inter_token_latency_seconds (off when a router records it into the
  // same registry, as in all-in-one).
  bool record_inter_token = true;
};

// A tokenized request, translated from the wire.
struct DecodeSpec {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
  engine::SelectionOptions selection;
  bool skip_special_tokens = true;
};

struct DecodedToken {
  int32_t id = -1;
  std::optional<float> logprob;
  std::vector<engine::TokenLogprob> top_logprobs;
};

// What the Decode stream sends after the reservation.
struct DecodeEvent {
  enum class Kind { kTokens, kFinal, kError };
  Kind kind = Kind::kTokens;
  std::vector<DecodedToken> tokens;  // kTokens
  std::string text;                  // kTokens: safe text delta
  // kFinal:
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double kv_wait_seconds = 0;
  double decode_seconds = 0;
  engine::SelectionCacheCounters cache;
  absl::Status status;  // kError
};

struct Reservation {
  std::string reservation_id;
  std::string request_id;
  int64_t reserved_tokens = 0;
  int64_t prompt_tokens = 0;
  engine::KvLayout layout;
  absl::Time lease_expires;
};

class Session;  // decode_engine.cc

// The consumer end of one admitted request (the Decode stream handler holds it).
class DecodeStream {
 public:
  explicit DecodeStream(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  const Reservation& reservation() const;
  // The next event, or nullopt when none arrives within `timeout`. After a kFinal or kError
  // event nothing more comes.
  std::optional<DecodeEvent> Next(absl::Duration timeout);

 private:
  std::shared_ptr<Session> session_;
};

struct DecodeLoad {
  int64_t running = 0;
  int64_t waiting = 0;  // reserved, KV not complete
  int64_t free_pages = 0;
  int64_t total_pages = 0;
  int64_t page_size = 0;
  bool draining = false;
};

class DecodeEngine {
 public:
  // `backend` (the model and its KV pool) and `tokenizer` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(engine::GenerationBackend* backend,
                                                              const tokenizer::Tokenizer* tok,
                                                              const DecodeEngineOptions& options);
  ~DecodeEngine();  // Shutdown(0)

  // Admits a request. InvalidArgument naming the field (prompt, sampling.*, selection.*,
  // request_id); AlreadyExists for a request id in use; ResourceExhausted when the pages or the
  // request slots are not there; the backend's refusals (Unimplemented for a policy it lacks);
  // Unavailable while draining.
  absl::StatusOr<DecodeStream> Admit(DecodeSpec spec);

  // KV reception (one stream per request at a time). NotFound for an unknown or expired
  // reservation; InvalidArgument from the receiver's checks. A failed or aborted stream rewinds
  // the reservation to empty (the request keeps waiting, so the router may retry the prefill on
  // another worker); the lease bounds the wait. `side`: the stream's device link, for blocks
  // that name one (KvReceiver::Accept).
  absl::Status AcceptKv(const std::string& request_id, const std::string& reservation_id,
                        const engine::KvBlock& block, engine::KvSideChannel* side = nullptr);
  // `final` is taken by value: its selection states move into the request. With `side`, waits
  // for the link's blocks to land first.
  absl::StatusOr<engine::KvPushStats> FinishKv(const std::string& request_id,
                                               const std::string& reservation_id,
                                               engine::KvFinal final,
                                               engine::KvSideChannel* side = nullptr);
  // The KV stream broke before its final record: the reservation is rewound (see above).
  void AbortKv(const std::string& request_id, const std::string& reservation_id,
               const absl::Status& status);

  // Ends the request with Cancelled; false when it is unknown (or already over).
  bool Cancel(const std::string& request_id, const std::string& reason);

  // Stops admitting; lets running requests finish until `grace` has passed, then cancels the
  // rest; joins the threads. Idempotent.
  void Shutdown(absl::Duration grace);

  DecodeLoad Load() const;
  engine::KvCapacity kv_capacity() const { return backend_->kv_capacity(); }
  engine::KvLayout layout() const { return backend_->kv_layout(); }

 private:
  DecodeEngine(engine::GenerationBackend* backend, const tokenizer::Tokenizer* tok,
               const DecodeEngineOptions& options);
  std::shared_ptr<Session> Find(const std::string& request_id);
  // Ends `s` with `event` (error or final) and frees its pages unless it runs in the loop.
  void End(const std::shared_ptr<Session>& s, DecodeEvent event);
  void LoopThread();
  void LeaseThread();
  void ResetKv(const std::shared_ptr<Session>& s);
  void StartRunning(const std::shared_ptr<Session>& s);
  // One decode step of every session in `sessions` (the running ones not just started).
  void StepAll(const std::vector<std::shared_ptr<Session>>& sessions);
  // Samples `s`'s next token from its logits row and streams it.
  void Advance(const std::shared_ptr<Session>& s, absl::Span<const float> logits);
  // Ends `s` with its final event (finish reason, usage, timings, cache counters).
  void Finish(const std::shared_ptr<Session>& s);
  // Publishes the load gauges (no-op without metrics).
  void PublishLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  engine::GenerationBackend* backend_;
  const tokenizer::Tokenizer* tokenizer_;
  const DecodeEngineOptions options_;
  common::Clock* clock_;
  std::vector<int32_t> eos_ids_;
  std::unique_ptr<DecodeMetrics> metrics_;  // null without options.metrics

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Session>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t num_running_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Owned by the loop thread.
  std::vector<std::shared_ptr<Session>> running_;
  std::vector<float> logits_;  // [batch, vocab] of the last step

  std::thread loop_;
  std::thread lease_;
};

}  // namespace tokenselect::decode_worker

#endif  // TOKENSELECT_DECODE_WORKER_DECODE_ENGINE_H_
