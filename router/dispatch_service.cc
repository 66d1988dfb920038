#include "router/dispatch_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/logging.h"
#include "grpcpp/client_context.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"
#include "rpc/proto_params.h"
#include "rpc/status_convert.h"

namespace tokenselect::router {
namespace {

std::unique_ptr<grpc::ClientContext> ChildContext(grpc::ServerContext* parent) {
  if (parent != nullptr) return grpc::ClientContext::FromServerContext(*parent);
  return std::make_unique<grpc::ClientContext>();
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

v1::WorkerRequest ToWorkerRequest(const RequestSpec& spec) {
  v1::WorkerRequest r;
  r.set_request_id(spec.request_id);
  r.mutable_prompt_token_ids()->Add(spec.prompt_ids.begin(), spec.prompt_ids.end());
  const params::SamplingParams& s = spec.sampling;
  v1::SamplingParams* p = r.mutable_sampling();
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_presence_penalty(s.presence_penalty);
  // Prefill samples the first token and decode continues the same random stream: both need the
  // same seed, so the router picks one when the client did not.
  p->set_seed(s.seed ? *s.seed : RandomSeed());
  p->set_max_new_tokens(s.max_new_tokens);
  p->mutable_stop_token_ids()->Add(s.stop_token_ids.begin(), s.stop_token_ids.end());
  p->set_ignore_eos(s.ignore_eos);
  for (const std::string& stop : s.stop) p->add_stop(stop);
  p->set_include_stop_str_in_output(s.include_stop_str_in_output);
  p->set_logprobs(s.logprobs);
  p->set_top_logprobs(s.top_logprobs);
  const SelectionSpec& sel = spec.selection;
  v1::SelectionParams* q = r.mutable_selection();
  if (sel.policy) {
    q->set_policy(static_cast<v1::SelectionPolicy>(rpc::SelectionPolicyNumber(*sel.policy)));
  }
  if (sel.k) q->set_k(*sel.k);
  if (sel.n_init) q->set_n_init(*sel.n_init);
  if (sel.n_local) q->set_n_local(*sel.n_local);
  if (sel.theta) q->set_theta(*sel.theta);
  if (sel.chunk_size) q->set_chunk_size(*sel.chunk_size);
  r.set_skip_special_tokens(spec.skip_special_tokens);
  return r;
}

void CopyLogprobs(const google::protobuf::RepeatedPtrField<v1::LogprobEntry>& in,
                  std::vector<LogprobSpec>* out) {
  for (const v1::LogprobEntry& e : in) {
    LogprobSpec l;
    l.chosen = {e.chosen().token_id(), e.chosen().logprob()};
    for (const v1::TokenLogprob& t : e.top()) l.top.push_back({t.token_id(), t.logprob()});
    out->push_back(std::move(l));
  }
}

// Codes the client should see as they are; anything else from a worker is a lost worker.
bool PassThrough(absl::StatusCode code) {
  return code == absl::StatusCode::kCancelled || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kUnauthenticated;
}

absl::Status WorkerError(const char* kind, const std::string& address, const grpc::Status& s) {
  const absl::Status status = rpc::FromGrpcStatus(s);
  const std::string message = absl::StrCat(kind, " worker ", address, ": ", status.message());
  if (PassThrough(status.code())) return absl::Status(status.code(), message);
  return absl::UnavailableError(message);
}

// Keeps the registry's in-flight accounting of one worker for the life of a call.
class InflightGuard {
 public:
  InflightGuard(WorkerRegistry* registry, WorkerKind kind, std::string address, int64_t tokens)
      : registry_(registry), kind_(kind), address_(std::move(address)), tokens_(tokens) {
    registry_->AddInflight(kind_, address_, 1, tokens_);
  }
  ~InflightGuard() { registry_->AddInflight(kind_, address_, -1, -tokens_); }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;

 private:
  WorkerRegistry* registry_;
  WorkerKind kind_;
  std::string address_;
  int64_t tokens_;
};

// An open Decode stream whose first message (the reservation) has arrived.
struct DecodeCall {
  std::string address;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader;
  v1::Reservation reservation;
  std::unique_ptr<InflightGuard> inflight;

  // Cancels the stream and waits for it to end (the worker frees the reservation).
  void Abort() {
    if (!reader) return;
    context->TryCancel();
    v1::DecodeResponse ignored;
    while (reader->Read(&ignored)) {
    }
    reader->Finish().IgnoreError();
    reader.reset();
  }
};

// Free token slots of a decode worker, minus what this router has asked of it since the poll.
int64_t FreeTokens(const WorkerSnapshot& w) {
  return w.load.free_kv_pages * std::max<int64_t>(1, w.load.page_size) - w.inflight_tokens;
}

// Token metrics of one token message: `n` tokens arrived at `now` (seconds since arrival);
// `*last` is when the previous message arrived (< 0: none yet). The first message observes TTFT,
// later ones the gap since the previous message, split evenly over its tokens.
void RecordTokens(const RouterMetrics& metrics, int n, double now, double* last) {
  metrics.generation_tokens().Increment(n);
  if (*last < 0) {
    metrics.ttft().Observe(now);
  } else {
    const double gap = (now - *last) / n;
    for (int i = 0; i < n; ++i) metrics.inter_token().Observe(gap);
  }
  *last = now;
}

}  // namespace

LoadProbe Dispatcher::MakeLoadProbe() {
  return [](WorkerKind kind, const std::shared_ptr<grpc::Channel>& channel,
            absl::Duration timeout) -> absl::StatusOr<WorkerLoadInfo> {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    v1::GetLoadRequest request;
    v1::WorkerLoad load;
    grpc::Status status =
        kind == WorkerKind::kPrefill
            ? v1::PrefillWorker::NewStub(channel)->GetLoad(&context, request, &load)
            : v1::DecodeWorker::NewStub(channel)->GetLoad(&context, request, &load);
    if (!status.ok()) return rpc::FromGrpcStatus(status);
    WorkerLoadInfo info;
    info.queued_prefill_tokens = load.queued_prefill_tokens();
    info.running_requests = load.running_requests();
    info.waiting_requests = load.waiting_requests();
    info.free_kv_pages = load.free_kv_pages();
    info.total_kv_pages = load.total_kv_pages();
    info.page_size = load.page_size();
    info.draining = load.draining();
    if (load.has_default_selection()) {
      absl::StatusOr<params::SelectionOptions> defaults =
          rpc::SelectionFromProto(load.default_selection());
      if (defaults.ok()) info.default_selection = *defaults;  // else: as if not reported
    }
    return info;
  };
}

std::optional<params::SelectionOptions> Dispatcher::WorkersDefaultSelection() const {
  for (WorkerKind kind : {WorkerKind::kDecode, WorkerKind::kPrefill}) {
    for (const WorkerSnapshot& w : registry_->Healthy(kind)) {
      if (w.load.default_selection.has_value()) return w.load.default_selection;
    }
  }
  return std::nullopt;
}

absl::Status Dispatcher::Run(grpc::ServerContext* server_context, const RequestSpec& spec,
                             absl::Time arrival, const EmitFn& emit) const {
  const v1::WorkerRequest worker_request = ToWorkerRequest(spec);
  const int64_t prompt_tokens = static_cast<int64_t>(spec.prompt_ids.size());
  const int64_t reserve_tokens = prompt_tokens + spec.sampling.max_new_tokens;
  auto since_arrival = [&] { return absl::ToDoubleSeconds(absl::Now() - arrival); };

  std::set<std::string> failed_prefill;
  absl::Status last_error = absl::UnavailableError("no healthy prefill worker");
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Prefill worker: the fewest queued prompt tokens, counting what we just sent it.
    std::vector<WorkerSnapshot> prefills = registry_->Healthy(WorkerKind::kPrefill);
    prefills.erase(std::remove_if(prefills.begin(), prefills.end(),
                                  [&](const WorkerSnapshot& w) {
                                    return failed_prefill.count(w.address) > 0;
                                  }),
                   prefills.end());
    if (prefills.empty()) return last_error;
    const WorkerSnapshot prefill = *std::min_element(
        prefills.begin(), prefills.end(), [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
          return a.load.queued_prefill_tokens + a.inflight_tokens <
                 b.load.queued_prefill_tokens + b.inflight_tokens;
        });

    // Decode worker: the most free KV first; the next one when it is full or unreachable.
    std::vector<WorkerSnapshot> decodes = registry_->Healthy(WorkerKind::kDecode);
    if (decodes.empty()) return absl::UnavailableError("no healthy decode worker");
    std::stable_sort(decodes.begin(), decodes.end(),
                     [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
                       return FreeTokens(a) > FreeTokens(b);
                     });
    DecodeCall decode;
    absl::Status reserve_error;
    for (const WorkerSnapshot& d : decodes) {
      v1::DecodeRequest request;
      *request.mutable_request() = worker_request;
      request.set_prefill_worker_address(prefill.address);
      decode.address = d.address;
      decode.context = ChildContext(server_context);
      decode.reader = v1::DecodeWorker::NewStub(d.channel)->Decode(decode.context.get(), request);
      v1::DecodeResponse first;
      if (decode.reader->Read(&first) && first.has_reservation()) {
        decode.reservation = first.reservation();
        decode.inflight = std::make_unique<InflightGuard>(registry_, WorkerKind::kDecode, d.address,
                                                          reserve_tokens);
        break;
      }
      const bool protocol_error = first.event_case() != v1::DecodeResponse::EVENT_NOT_SET;
      grpc::Status status = protocol_error ? grpc::Status(grpc::StatusCode::INTERNAL,
                                                          "first message is not a reservation")
                                           : decode.reader->Finish();
      if (protocol_error) decode.Abort();
      decode.reader.reset();
      reserve_error = WorkerError("decode", d.address, status);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        registry_->MarkUnhealthy(WorkerKind::kDecode, d.address);
      }
      const absl::StatusCode code = reserve_error.code();
      if (code == absl::StatusCode::kCancelled || code == absl::StatusCode::kDeadlineExceeded ||
          code == absl::StatusCode::kInvalidArgument) {
        return reserve_error;
      }
    }
    if (!decode.reader) return reserve_error;
    const double queue_seconds = since_arrival();

    // Prefill into the reservation.
    v1::PrefillRequest prefill_request;
    *prefill_request.mutable_request() = worker_request;
    prefill_request.set_decode_worker_address(decode.address);
    *prefill_request.mutable_reservation() = decode.reservation;
    v1::PrefillResponse prefill_response;
    grpc::Status prefill_status;
    {
      InflightGuard guard(registry_, WorkerKind::kPrefill, prefill.address, prompt_tokens);
      std::unique_ptr<grpc::ClientContext> context = ChildContext(server_context);
      prefill_status = v1::PrefillWorker::NewStub(prefill.channel)
                           ->Prefill(context.get(), prefill_request, &prefill_response);
    }
    if (!prefill_status.ok()) {
      decode.Abort();
      last_error = WorkerError("prefill", prefill.address, prefill_status);
      const absl::StatusCode code = last_error.code();
      if (code == absl::StatusCode::kCancelled || code == absl::StatusCode::kDeadlineExceeded ||
          code == absl::StatusCode::kInvalidArgument) {
        return last_error;
      }
      if (prefill_status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        registry_->MarkUnhealthy(WorkerKind::kPrefill, prefill.address);
      }
      TS_LOG(WARN, "request {}: {}; retrying on another prefill worker", spec.request_id,
             last_error.ToString());
      failed_prefill.insert(prefill.address);
      continue;
    }

    // Relay the decode stream.
    if (metrics_ != nullptr) {
      metrics_->prompt_tokens().Increment(static_cast<double>(prompt_tokens));
    }
    StreamEvent event;
    int64_t completion_tokens = 0;
    double ttft = -1;
    double last_token = -1;  // since arrival, of the previous token message
    bool finished = false;
    v1::DecodeResponse message;
    while (decode.reader->Read(&message)) {
      event = StreamEvent();
      if (message.has_tokens()) {
        const v1::DecodeTokens& t = message.tokens();
        event.text = t.text();
        event.token_ids.assign(t.token_ids().begin(), t.token_ids().end());
        CopyLogprobs(t.logprobs(), &event.logprobs);
        completion_tokens += t.token_ids_size();
        if (!event.token_ids.empty()) {
          const double now = since_arrival();
          if (ttft < 0) ttft = now;
          if (metrics_ != nullptr) RecordTokens(*metrics_, t.token_ids_size(), now, &last_token);
        }
      } else if (message.has_final()) {
        const v1::DecodeFinal& f = message.final();
        event.final = true;
        finished = true;
        event.finish_reason = static_cast<FinishReasonCode>(f.finish_reason());
        completion_tokens = std::max<int64_t>(completion_tokens, f.usage().completion_tokens());
        event.cache_hits = f.selection_stats().cache_hits();
        event.cache_misses = f.selection_stats().cache_misses();
        event.timings.queue_seconds = queue_seconds;
        event.timings.ttft_seconds = ttft < 0 ? since_arrival() : ttft;
        event.timings.total_seconds = since_arrival();
        if (metrics_ != nullptr) metrics_->e2e().Observe(event.timings.total_seconds);
        event.timings.prefill_seconds = prefill_response.prefill_seconds();
      } else {
        continue;  // a second reservation would be a protocol error; ignore it
      }
      event.usage = {prompt_tokens, completion_tokens};
      if (!emit(event)) {
        decode.Abort();
        return absl::CancelledError("the client went away");
      }
      if (finished) break;
    }
    if (finished) {
      // The worker sends nothing after the final message; let its stream end normally.
      while (decode.reader->Read(&message)) {
      }
      decode.reader->Finish().IgnoreError();
      return absl::OkStatus();
    }
    const grpc::Status status = decode.reader->Finish();
    if (status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("decode worker ", decode.address, " ended the stream without a result"));
    }
    return WorkerError("decode", decode.address, status);
  }
  return last_error;
}

}  // namespace tokenselect::router
