#include "prefill_worker/prefill_engine.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/sampling/sampler.h"

namespace tokenselect::prefill_worker {

struct PrefillJob {
  PrefillSpec spec;
  common::Stopwatch since_submit;
  std::atomic<bool> cancelled{false};

  absl::Mutex mu;
  absl::Status cancel_status ABSL_GUARDED_BY(mu);
  engine::KvChunkSender* sender ABSL_GUARDED_BY(mu) = nullptr;
  std::optional<absl::StatusOr<PrefillResult>> result ABSL_GUARDED_BY(mu);

  // Marks the job aborted and breaks its transfer; the job's thread notices between chunks.
  void Abort(const absl::Status& why) {
    absl::MutexLock lock(&mu);
    if (cancelled || result.has_value()) return;
    cancelled = true;
    cancel_status = why;
    if (sender != nullptr) sender->Abort();
  }
  absl::Status CancelStatus() {
    absl::MutexLock lock(&mu);
    return cancel_status;
  }
};

std::optional<absl::StatusOr<PrefillResult>> PrefillHandle::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&job_->mu);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) { return job_->result.has_value(); };
  if (!job_->mu.AwaitWithTimeout(absl::Condition(&done), timeout)) return std::nullopt;
  return job_->result;
}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(
    engine::GenerationBackend* backend, engine::KvTransport* transport,
    const PrefillEngineOptions& opts) {
  if (backend == nullptr || transport == nullptr) {
    return absl::InvalidArgumentError("PrefillEngine needs a backend and a KV transport");
  }
  return std::unique_ptr<PrefillEngine>(new PrefillEngine(backend, transport, opts));
}

PrefillEngine::PrefillEngine(engine::GenerationBackend* backend, engine::KvTransport* transport,
                             const PrefillEngineOptions& opts)
    : backend_(backend),
      transport_(transport),
      options_(opts),
      clock_(opts.clock != nullptr ? opts.clock : common::Clock::Real()) {
  if (opts.metrics != nullptr) {
    metrics_ = std::make_unique<PrefillMetrics>(*opts.metrics);
    absl::MutexLock lock(&mu_);
    PublishLoad();
  }
  for (int i = 0; i < std::max(1, opts.num_threads); ++i) {
    threads_.emplace_back([this] { WorkerThread(); });
  }
}

PrefillEngine::~PrefillEngine() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<PrefillHandle> PrefillEngine::Submit(PrefillSpec spec) {
  const int64_t vocab = backend_->config().vocab_size;
  if (spec.request_id.empty()) {
    return absl::InvalidArgumentError("request.request_id must not be empty");
  }
  if (spec.prompt.empty()) {
    return absl::InvalidArgumentError("request.prompt_token_ids must not be empty");
  }
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request.prompt_token_ids[", i, "] = ", spec.prompt[i], " is outside [0, ", vocab, ")"));
    }
  }
  RETURN_IF_ERROR(engine::Validate(spec.sampling, static_cast<int>(vocab)));
  RETURN_IF_ERROR(engine::ValidateSelectionOptions(spec.selection));
  if (spec.selection.chunk_size > backend_->max_chunk()) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.chunk_size ", spec.selection.chunk_size,
                     " exceeds this prefill worker's largest step of ", backend_->max_chunk(),
                     " tokens"));
  }
  if (spec.decode_address.empty()) {
    return absl::InvalidArgumentError("decode_worker_address must not be empty");
  }
  if (spec.reservation_id.empty()) {
    return absl::InvalidArgumentError("reservation.reservation_id must not be empty");
  }
  if (spec.reserved_prompt_tokens != static_cast<int64_t>(spec.prompt.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("reservation.prompt_tokens is ", spec.reserved_prompt_tokens,
                     " but the prompt has ", spec.prompt.size(), " tokens"));
  }
  RETURN_IF_ERROR(engine::CheckLayoutsMatch(backend_->kv_layout(), spec.receiver_layout));
  const int64_t slots = backend_->kv_capacity().num_slots();
  if (static_cast<int64_t>(spec.prompt.size()) > slots) {
    return absl::InvalidArgumentError(absl::StrCat("prompt too long: ", spec.prompt.size(),
                                                   " tokens exceed this prefill worker's ", slots,
                                                   " KV slots"));
  }
  auto job = std::make_shared<PrefillJob>();
  job->spec = std::move(spec);
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("prefill worker is shutting down");
  if (jobs_.contains(job->spec.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", job->spec.request_id, "' is already being prefilled here"));
  }
  if (static_cast<int64_t>(jobs_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prefill queue is full (", options_.max_queued, " requests)"));
  }
  jobs_[job->spec.request_id] = job;
  queue_.push_back(job);
  queued_tokens_ += static_cast<int64_t>(job->spec.prompt.size());
  PublishLoad();
  return PrefillHandle(job);
}

bool PrefillEngine::Cancel(const std::string& request_id, const std::string& reason) {
  std::shared_ptr<PrefillJob> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return false;
    job = it->second;
  }
  job->Abort(absl::CancelledError(absl::StrCat("prefill cancelled: ", reason)));
  return true;
}

void PrefillEngine::Complete(const std::shared_ptr<PrefillJob>& job,
                             absl::StatusOr<PrefillResult> result) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job->spec.request_id);
    if (it != jobs_.end() && it->second == job) jobs_.erase(it);
    queued_tokens_ -= static_cast<int64_t>(job->spec.prompt.size());
    PublishLoad();
  }
  absl::MutexLock lock(&job->mu);
  job->result = std::move(result);
}

void PrefillEngine::WorkerThread() {
  while (true) {
    std::shared_ptr<PrefillJob> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping
      job = queue_.front();
      queue_.pop_front();
      ++running_;
      PublishLoad();
    }
    absl::StatusOr<PrefillResult> result = Run(job.get());
    if (!result.ok() && job->cancelled) result = job->CancelStatus();
    if (!result.ok()) {
      TS_LOG(INFO, "prefill {} failed: {}", job->spec.request_id, result.status().ToString());
    }
    Complete(job, std::move(result));
    absl::MutexLock lock(&mu_);
    --running_;
    PublishLoad();
  }
}

absl::StatusOr<PrefillResult> PrefillEngine::Run(PrefillJob* job) {
  const PrefillSpec& spec = job->spec;
  PrefillResult result;
  result.queue_seconds = job->since_submit.ElapsedSeconds();
  if (metrics_ != nullptr) metrics_->queue_time().Observe(result.queue_seconds);
  result.prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  auto check_alive = [&]() -> absl::Status {
    if (job->cancelled) return job->CancelStatus();
    if (spec.deadline.has_value() && clock_->Now() >= *spec.deadline) {
      return absl::DeadlineExceededError("prefill deadline exceeded");
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check_alive());
  const common::Stopwatch compute;

  // Pages first, then the stream: a worker without room fails before touching the receiver.
  // The runner (declared before the sender) outlives it: the sender reads the runner's K/V.
  ASSIGN_OR_RETURN(std::unique_ptr<engine::SequenceRunner> runner,
                   backend_->Start(result.prompt_tokens, spec.selection));
  if (metrics_ != nullptr) {
    absl::MutexLock lock(&mu_);
    PublishLoad();  // the pages just reserved
  }
  ASSIGN_OR_RETURN(
      engine::Sampler sampler,
      engine::Sampler::Create(spec.sampling, static_cast<int>(backend_->config().vocab_size)));
  ASSIGN_OR_RETURN(
      std::unique_ptr<engine::KvChunkSender> sender,
      transport_->OpenSender({spec.request_id, spec.reservation_id, spec.decode_address},
                             runner->kv(), options_.kv));
  {
    absl::MutexLock lock(&job->mu);
    if (job->cancelled) return job->cancel_status;
    job->sender = sender.get();
  }
  struct Detach {
    PrefillJob* job;
    ~Detach() {
      absl::MutexLock lock(&job->mu);
      job->sender = nullptr;
    }
  } detach{job};

  std::vector<float> logits;
  const int64_t n = result.prompt_tokens;
  const common::Stopwatch transfer;
  common::metrics::Histogram* selection_seconds =
      metrics_ != nullptr ? &metrics_->SelectionSeconds(spec.selection.policy) : nullptr;
  for (int64_t begin = 0; begin < n; begin += spec.selection.chunk_size) {
    RETURN_IF_ERROR(check_alive());
    const int64_t end = std::min(n, begin + spec.selection.chunk_size);
    const common::Stopwatch chunk;
    const engine::SelectionStats before = runner->selection_stats();
    RETURN_IF_ERROR(runner->Forward(absl::MakeConstSpan(spec.prompt).subspan(begin, end - begin),
                                    end == n ? &logits : nullptr));
    if (metrics_ != nullptr) {
      metrics_->chunk_seconds().Observe(chunk.ElapsedSeconds());
      const engine::SelectionStats after = runner->selection_stats();
      const int64_t layer_steps = after.layer_steps - before.layer_steps;
      if (layer_steps > 0) {
        selection_seconds->Observe((after.selection_seconds - before.selection_seconds) /
                                   static_cast<double>(layer_steps));
      }
    }
    // This chunk's K/V (all layers) goes out while the next chunk is computed.
    RETURN_IF_ERROR(sender->SendChunk(begin, end));
  }
  ASSIGN_OR_RETURN(engine::SampleResult first, sampler.Sample(logits, spec.prompt, {}));
  result.prefill_seconds = compute.ElapsedSeconds();
  result.first_token_id = first.token_id;
  result.first_token_logprob = first.logprob;
  result.seed = sampler.seed();

  engine::KvFinal final;
  final.first_token_id = first.token_id;
  final.first_token_logprob = first.logprob;
  final.first_top_logprobs = std::move(first.top_logprobs);
  final.seed = sampler.seed();
  final.prefill_seconds = result.prefill_seconds;
  // Last in the stream, after every block: the state a stateful policy built over the prompt
  // (nothing for stateless ones), so the decode worker's selection continues from it.
  final.selection_states = runner->CollectSelectionStates();
  RETURN_IF_ERROR(check_alive());
  ASSIGN_OR_RETURN(engine::KvPushStats pushed, sender->Finish(std::move(final)));
  (void)pushed;
  result.transfer_seconds = transfer.ElapsedSeconds();
  result.kv_bytes = sender->bytes_sent();
  result.kv_chunks = sender->blocks_sent();
  return result;
}

void PrefillEngine::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    draining_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&idle), grace);
  }
  std::vector<std::shared_ptr<PrefillJob>> rest;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) rest.push_back(job);
  }
  for (const auto& job : rest) job->Abort(absl::UnavailableError("prefill worker shutting down"));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void PrefillEngine::PublishLoad() {
  if (metrics_ == nullptr) return;
  const engine::KvCapacity kv = backend_->kv_capacity();
  metrics_->load().Set(running_, static_cast<int64_t>(queue_.size()),
                       kv.total_pages - kv.free_pages, kv.total_pages);
}

PrefillLoad PrefillEngine::Load() const {
  PrefillLoad load;
  absl::MutexLock lock(&mu_);
  load.queued_prefill_tokens = queued_tokens_;
  load.running = running_;
  load.waiting = static_cast<int64_t>(queue_.size());
  const engine::KvCapacity kv = backend_->kv_capacity();
  load.free_pages = kv.free_pages;
  load.total_pages = kv.total_pages;
  load.page_size = kv.page_size;
  load.draining = draining_;
  return load;
}

}  // namespace tokenselect::prefill_worker
