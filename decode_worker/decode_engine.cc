#include "decode_worker/decode_engine.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/stop_checker.h"
#include "engine/transfer/kv_receiver.h"
#include "tokenizer/stream_decoder.h"

namespace tokenselect::decode_worker {

class Session {
 public:
  enum class State { kReserved, kReady, kRunning, kDone };

  DecodeSpec spec;
  Reservation reservation;
  common::Stopwatch since_admit;

  // KV reception; the runner (the request's KV and selection on the backend) is the loop
  // thread's once the state is kRunning.
  absl::Mutex kv_mu;
  std::unique_ptr<engine::SequenceRunner> runner;  // kv_mu until kRunning, then the loop's
  std::unique_ptr<engine::KvReceiver> receiver;    // kv_mu until kRunning, then the loop's
  engine::KvFinal final;                         // without its selection_states, which wait below
  // The final record's per-layer selection state (empty for stateless policies): kv_mu until
  // kRunning, then moved into the runner by the loop thread.
  std::vector<engine::SelectionLayerState> selection_states;

  // Guarded by the engine's mu_.
  State state = State::kReserved;
  absl::Time lease_expires;
  std::atomic<bool> done{false};

  // Owned by the loop thread.
  std::optional<engine::Sampler> sampler;
  std::unique_ptr<engine::StopChecker> stop;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::vector<int32_t> generated;
  common::Stopwatch decode_clock;
  double kv_wait_seconds = 0;
  // Metrics (the loop thread's, except since_ready which FinishKv resets under mu_).
  common::Stopwatch since_ready;
  common::Stopwatch since_token;
  const DecodeMetrics::Policy* policy_metrics = nullptr;
  int64_t layer_steps_seen = 0;
  double selection_seconds_seen = 0;

  // Ignores everything after the first terminal event.
  void Push(DecodeEvent event) {
    absl::MutexLock lock(&ev_mu_);
    if (closed_) return;
    if (event.kind != DecodeEvent::Kind::kTokens) closed_ = true;
    events_.push_back(std::move(event));
  }
  std::optional<DecodeEvent> Next(absl::Duration timeout) {
    absl::MutexLock lock(&ev_mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ev_mu_) { return !events_.empty(); };
    if (!ev_mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
    DecodeEvent event = std::move(events_.front());
    events_.pop_front();
    return event;
  }

 private:
  absl::Mutex ev_mu_;
  std::deque<DecodeEvent> events_ ABSL_GUARDED_BY(ev_mu_);
  bool closed_ ABSL_GUARDED_BY(ev_mu_) = false;
};

namespace {

// A decode step's metrics: the selection time per layer (the step's mean over its layers, one
// observation per step) and the inter-token gap.
void RecordStep(DecodeMetrics* metrics, Session* s) {
  const engine::SelectionStats stats = s->runner->selection_stats();
  const int64_t layer_steps = stats.layer_steps - s->layer_steps_seen;
  if (layer_steps > 0) {
    s->policy_metrics->selection_seconds->Observe(
        (stats.selection_seconds - s->selection_seconds_seen) / static_cast<double>(layer_steps));
  }
  s->layer_steps_seen = stats.layer_steps;
  s->selection_seconds_seen = stats.selection_seconds;
  if (metrics->inter_token() != nullptr) {
    metrics->inter_token()->Observe(s->since_token.ElapsedSeconds());
    s->since_token.Reset();
  }
}

DecodeEvent ErrorEvent(absl::Status status) {
  DecodeEvent event;
  event.kind = DecodeEvent::Kind::kError;
  event.status = std::move(status);
  return event;
}

}  // namespace

const Reservation& DecodeStream::reservation() const { return session_->reservation; }

std::optional<DecodeEvent> DecodeStream::Next(absl::Duration timeout) {
  return session_->Next(timeout);
}

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    engine::GenerationBackend* backend, const tokenizer::Tokenizer* tok,
    const DecodeEngineOptions& options) {
  if (backend == nullptr || tok == nullptr) {
    return absl::InvalidArgumentError("DecodeEngine needs a backend and a tokenizer");
  }
  return std::unique_ptr<DecodeEngine>(new DecodeEngine(backend, tok, options));
}

DecodeEngine::DecodeEngine(engine::GenerationBackend* backend, const tokenizer::Tokenizer* tok,
                           const DecodeEngineOptions& options)
    : backend_(backend),
      tokenizer_(tok),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : common::Clock::Real()) {
  for (int64_t id : backend_->config().eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  for (int32_t id : tokenizer_->eos_ids()) eos_ids_.push_back(id);
  if (options.metrics != nullptr) {
    metrics_ = std::make_unique<DecodeMetrics>(*options.metrics, backend_->config().num_layers,
                                               options.record_inter_token);
    absl::MutexLock lock(&mu_);
    PublishLoad();
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  loop_ = std::thread([this] { LoopThread(); });
  lease_ = std::thread([this] { LeaseThread(); });
}

DecodeEngine::~DecodeEngine() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<DecodeStream> DecodeEngine::Admit(DecodeSpec spec) {
  const int64_t vocab = backend_->config().vocab_size;
  if (spec.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
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
  const int64_t prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  const int64_t needed = prompt_tokens + spec.sampling.max_new_tokens;
  const int64_t slots = backend_->kv_capacity().num_slots();
  if (needed > slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt too long: prompt (", prompt_tokens, ") + sampling.max_new_tokens (",
                     spec.sampling.max_new_tokens, ") exceeds this worker's KV capacity of ",
                     slots, " tokens"));
  }
  auto s = std::make_shared<Session>();
  s->reservation.reservation_id = common::NewId("rsv");
  s->reservation.request_id = spec.request_id;
  s->reservation.reserved_tokens = needed;
  s->reservation.prompt_tokens = prompt_tokens;
  s->reservation.layout = layout();
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("decode worker is shutting down");
    if (sessions_.contains(spec.request_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id '", spec.request_id, "' is already running here"));
    }
    if (static_cast<int64_t>(sessions_.size()) >= options_.max_running) {
      return absl::ResourceExhaustedError(
          absl::StrCat("decode worker is full (", options_.max_running, " requests)"));
    }
    // The request's KV and its selection provider, all or nothing.
    ASSIGN_OR_RETURN(std::unique_ptr<engine::SequenceRunner> runner,
                     backend_->Start(needed, spec.selection));
    {
      absl::MutexLock kv_lock(&s->kv_mu);
      s->receiver = std::make_unique<engine::KvReceiver>(
          spec.request_id, s->reservation.reservation_id, runner->kv(), prompt_tokens);
      s->runner = std::move(runner);
    }
    s->lease_expires = clock_->Now() + options_.lease_timeout;
    s->reservation.lease_expires = s->lease_expires;
    s->spec = std::move(spec);
    sessions_[s->spec.request_id] = s;
    PublishLoad();
  }
  return DecodeStream(s);
}

std::shared_ptr<Session> DecodeEngine::Find(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(request_id);
  return it == sessions_.end() ? nullptr : it->second;
}

void DecodeEngine::End(const std::shared_ptr<Session>& s, DecodeEvent event) {
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    if (s->state == Session::State::kDone) return;
    release = s->state != Session::State::kRunning;  // the loop releases running runners
    s->state = Session::State::kDone;
    s->done = true;
    auto it = sessions_.find(s->spec.request_id);
    if (it != sessions_.end() && it->second == s) sessions_.erase(it);
    ready_.erase(std::remove(ready_.begin(), ready_.end(), s), ready_.end());
  }
  if (release) {
    absl::MutexLock kv_lock(&s->kv_mu);
    s->receiver.reset();
    s->runner.reset();
  }
  if (metrics_ != nullptr) {
    absl::MutexLock lock(&mu_);
    PublishLoad();
  }
  s->Push(std::move(event));
}

absl::Status DecodeEngine::AcceptKv(const std::string& request_id,
                                    const std::string& reservation_id,
                                    const engine::KvBlock& block, engine::KvSideChannel* side) {
  std::shared_ptr<Session> s = Find(request_id);
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || s->state != Session::State::kReserved) {
      return absl::NotFoundError(absl::StrCat("no reservation waiting for KV for request '",
                                              request_id, "' (unknown, expired or complete)"));
    }
    s->lease_expires = clock_->Now() + options_.lease_timeout;
  }
  absl::Status status;
  {
    absl::MutexLock kv_lock(&s->kv_mu);
    if (s->receiver == nullptr) return absl::NotFoundError("reservation already freed");
    status = s->receiver->Accept(request_id, reservation_id, block, side);
  }
  if (!status.ok()) ResetKv(s);
  return status;
}

void DecodeEngine::ResetKv(const std::shared_ptr<Session>& s) {
  absl::MutexLock kv_lock(&s->kv_mu);
  if (s->receiver == nullptr || s->runner == nullptr) return;
  s->receiver =
      std::make_unique<engine::KvReceiver>(s->spec.request_id, s->reservation.reservation_id,
                                           s->runner->kv(), s->reservation.prompt_tokens);
}

absl::StatusOr<engine::KvPushStats> DecodeEngine::FinishKv(const std::string& request_id,
                                                           const std::string& reservation_id,
                                                           engine::KvFinal final,
                                                           engine::KvSideChannel* side) {
  std::shared_ptr<Session> s = Find(request_id);
  {
    absl::MutexLock lock(&mu_);
    if (s == nullptr || s->state != Session::State::kReserved) {
      return absl::NotFoundError(absl::StrCat("no reservation waiting for KV for request '",
                                              request_id, "' (unknown, expired or complete)"));
    }
  }
  absl::Status status;
  engine::KvPushStats stats;
  if (final.first_token_id >= backend_->config().vocab_size) {
    status = absl::InvalidArgumentError(
        absl::StrCat("final.first_token_id ", final.first_token_id, " is outside the vocabulary"));
  } else {
    absl::MutexLock kv_lock(&s->kv_mu);
    if (s->receiver == nullptr) return absl::NotFoundError("reservation already freed");
    status = s->receiver->Finish(request_id, reservation_id, final, side);
    stats.tokens_received = s->receiver->tokens_complete();
    stats.bytes_received = s->receiver->bytes_received();
    if (status.ok()) s->selection_states = s->receiver->TakeSelectionStates();
    final.selection_states.clear();
    s->final = std::move(final);
  }
  if (!status.ok()) {
    ResetKv(s);
    return status;
  }
  absl::MutexLock lock(&mu_);
  if (s->state != Session::State::kReserved) return absl::CancelledError("request ended");
  s->state = Session::State::kReady;
  s->kv_wait_seconds = s->since_admit.ElapsedSeconds();
  s->since_ready.Reset();
  ready_.push_back(s);
  return stats;
}

void DecodeEngine::AbortKv(const std::string& request_id, const std::string& reservation_id,
                           const absl::Status& status) {
  std::shared_ptr<Session> s = Find(request_id);
  if (s == nullptr || s->reservation.reservation_id != reservation_id) return;
  {
    absl::MutexLock lock(&mu_);
    if (s->state != Session::State::kReserved) return;
  }
  TS_LOG(INFO, "request {}: KV stream aborted ({}); waiting for a retry until the lease ends",
         request_id, status.ToString());
  ResetKv(s);
}

bool DecodeEngine::Cancel(const std::string& request_id, const std::string& reason) {
  std::shared_ptr<Session> s = Find(request_id);
  if (s == nullptr) return false;
  End(s, ErrorEvent(absl::CancelledError(absl::StrCat("request cancelled: ", reason))));
  return true;
}

void DecodeEngine::LeaseThread() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(5));
    if (stopping_) break;
    const absl::Time now = clock_->Now();
    std::vector<std::shared_ptr<Session>> expired;
    for (const auto& [id, s] : sessions_) {
      if (s->state == Session::State::kReserved && s->lease_expires <= now) expired.push_back(s);
    }
    if (expired.empty()) continue;
    mu_.Unlock();
    for (const auto& s : expired) {
      TS_LOG(WARN, "request {}: reservation {} expired (no KV within {})", s->spec.request_id,
             s->reservation.reservation_id, absl::FormatDuration(options_.lease_timeout));
      End(s, ErrorEvent(absl::DeadlineExceededError(
                 absl::StrCat("reservation expired: no KV arrived within ",
                              absl::FormatDuration(options_.lease_timeout)))));
    }
    mu_.Lock();
  }
}

void DecodeEngine::StartRunning(const std::shared_ptr<Session>& s) {
  {
    absl::MutexLock lock(&mu_);
    if (s->state != Session::State::kReady) return;
    s->state = Session::State::kRunning;
  }
  running_.push_back(s);
  auto fail = [&](const absl::Status& status) { End(s, ErrorEvent(status)); };
  // The prefill worker's selection state (checked by the receiver): the decode steps go on
  // from where its last chunk left it, as in one process.
  std::vector<engine::SelectionLayerState> states;
  {
    absl::MutexLock kv_lock(&s->kv_mu);
    states.swap(s->selection_states);
  }
  absl::Status restored = s->runner->RestoreSelectionStates(std::move(states));
  if (!restored.ok()) return fail(restored);
  if (metrics_ != nullptr) {
    metrics_->queue_time().Observe(s->since_ready.ElapsedSeconds());
    s->policy_metrics = &metrics_->ForPolicy(s->spec.selection.policy);
    s->since_token.Reset();
  }
  engine::SamplingParams params = s->spec.sampling;
  params.seed = s->final.seed;
  absl::StatusOr<engine::Sampler> sampler =
      engine::Sampler::Create(params, static_cast<int>(backend_->config().vocab_size));
  if (!sampler.ok()) return fail(sampler.status());
  s->sampler.emplace(std::move(sampler).value());
  s->stop = std::make_unique<engine::StopChecker>(params, eos_ids_);
  s->decoder = std::make_unique<tokenizer::StreamDecoder>(*tokenizer_, s->spec.skip_special_tokens);
  s->decode_clock.Reset();
  // The first token was sampled by the prefill worker: it goes through the same stop handling.
  const int32_t first = s->final.first_token_id;
  s->generated.push_back(first);
  absl::StatusOr<engine::StopCheckResult> checked = s->stop->Append(first, s->decoder->Push(first));
  if (!checked.ok()) return fail(checked.status());
  if (checked->finish_reason == engine::FinishReason::kLength) checked->text += s->decoder->Flush();
  DecodeEvent event;
  event.tokens.push_back({first, s->final.first_token_logprob, s->final.first_top_logprobs});
  event.text = std::move(checked->text);
  s->Push(std::move(event));
  if (s->stop->finished()) Finish(s);  // e.g. max_new_tokens 1, or a stop on the first token
}

void DecodeEngine::StepAll(const std::vector<std::shared_ptr<Session>>& sessions) {
  // Every session that still generates runs in one batched forward pass; row b of the logits
  // belongs to batch[b] (a session cancelled meanwhile just drops its row).
  std::vector<std::shared_ptr<Session>> batch;
  std::vector<engine::SequenceRunner*> runners;
  std::vector<int32_t> tokens;
  for (const auto& s : sessions) {
    if (s->done) continue;
    if (s->stop->finished()) {
      Finish(s);
      continue;
    }
    batch.push_back(s);
    runners.push_back(s->runner.get());
    tokens.push_back(s->generated.back());
  }
  if (batch.empty()) return;
  const absl::Status status = backend_->DecodeBatch(runners, tokens, &logits_);
  const size_t vocab = static_cast<size_t>(backend_->config().vocab_size);
  for (size_t b = 0; b < batch.size(); ++b) {
    const std::shared_ptr<Session>& s = batch[b];
    if (s->done) continue;
    if (!status.ok()) {
      End(s, ErrorEvent(common::Annotate(status, "decode step: ")));
      continue;
    }
    Advance(s, absl::MakeConstSpan(logits_).subspan(b * vocab, vocab));
    if (!s->done && s->stop->finished()) Finish(s);
  }
}

void DecodeEngine::Advance(const std::shared_ptr<Session>& s, absl::Span<const float> logits) {
  absl::StatusOr<engine::SampleResult> sample =
      s->sampler->Sample(logits, s->spec.prompt, s->generated);
  if (!sample.ok()) return End(s, ErrorEvent(sample.status()));
  s->generated.push_back(sample->token_id);
  absl::StatusOr<engine::StopCheckResult> checked =
      s->stop->Append(sample->token_id, s->decoder->Push(sample->token_id));
  if (!checked.ok()) return End(s, ErrorEvent(checked.status()));
  if (checked->finish_reason == engine::FinishReason::kLength) {
    checked->text += s->decoder->Flush();
  }
  DecodeEvent event;
  event.tokens.push_back({sample->token_id, sample->logprob, std::move(sample->top_logprobs)});
  event.text = std::move(checked->text);
  s->Push(std::move(event));
  if (s->policy_metrics != nullptr) RecordStep(metrics_.get(), s.get());
}

void DecodeEngine::Finish(const std::shared_ptr<Session>& s) {
  DecodeEvent final;
  final.kind = DecodeEvent::Kind::kFinal;
  final.finish_reason = s->stop->finish_reason();
  final.prompt_tokens = static_cast<int64_t>(s->spec.prompt.size());
  final.completion_tokens = static_cast<int64_t>(s->generated.size());
  final.kv_wait_seconds = s->kv_wait_seconds;
  final.decode_seconds = s->decode_clock.ElapsedSeconds();
  absl::StatusOr<engine::SelectionCacheCounters> cache = s->runner->cache_counters();
  if (cache.ok()) final.cache = *cache;
  End(s, std::move(final));
}

void DecodeEngine::LoopThread() {
  while (true) {
    std::vector<std::shared_ptr<Session>> starting;
    {
      absl::MutexLock lock(&mu_);
      const bool idle = running_.empty();
      auto work = [this, idle]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !ready_.empty() || !idle;
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) break;
      starting.assign(ready_.begin(), ready_.end());
      ready_.clear();
    }
    // Admission between steps: newly complete requests join the batch with their first token.
    for (const auto& s : starting) StartRunning(s);
    // One step: every running request advances one token, all in one batch.
    std::vector<std::shared_ptr<Session>> stepping;
    for (const auto& s : running_) {
      if (std::find(starting.begin(), starting.end(), s) == starting.end()) stepping.push_back(s);
    }
    StepAll(stepping);
    auto finished = [](const std::shared_ptr<Session>& s) {
      if (!s->done) return false;
      if (s->policy_metrics != nullptr && s->runner != nullptr) {
        absl::StatusOr<std::vector<engine::SelectionCacheCounters>> layers =
            s->runner->layer_cache_counters();
        if (layers.ok()) DecodeMetrics::RecordCache(*s->policy_metrics, *layers);
      }
      absl::MutexLock kv_lock(&s->kv_mu);
      s->runner.reset();
      return true;
    };
    running_.erase(std::remove_if(running_.begin(), running_.end(), finished), running_.end());
    absl::MutexLock lock(&mu_);
    num_running_ = static_cast<int64_t>(running_.size());
    PublishLoad();
  }
  for (const auto& s : running_) {
    End(s, ErrorEvent(absl::UnavailableError("decode worker shut down")));
    absl::MutexLock kv_lock(&s->kv_mu);
    s->runner.reset();
  }
  running_.clear();
}

void DecodeEngine::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    draining_ = true;
    auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&empty), grace);
  }
  std::vector<std::shared_ptr<Session>> rest;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) rest.push_back(s);
  }
  for (const auto& s : rest) {
    End(s, ErrorEvent(absl::UnavailableError("decode worker shutting down")));
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (lease_.joinable()) lease_.join();
}

void DecodeEngine::PublishLoad() {
  if (metrics_ == nullptr) return;
  const engine::KvCapacity kv = backend_->kv_capacity();
  const int64_t total = kv.total_pages;
  // A running request that just ended has left sessions_ but not yet num_running_ (the loop
  // updates it after the step): clamp the difference.
  const int64_t waiting =
      std::max<int64_t>(0, static_cast<int64_t>(sessions_.size()) - num_running_);
  metrics_->load().Set(num_running_, waiting, total - kv.free_pages, total);
}

DecodeLoad DecodeEngine::Load() const {
  DecodeLoad load;
  absl::MutexLock lock(&mu_);
  load.running = num_running_;
  load.waiting = static_cast<int64_t>(sessions_.size()) - num_running_;
  const engine::KvCapacity kv = backend_->kv_capacity();
  load.free_pages = kv.free_pages;
  load.total_pages = kv.total_pages;
  load.page_size = kv.page_size;
  load.draining = draining_;
  return load;
}

}  // namespace tokenselect::decode_worker
