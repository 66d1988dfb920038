#include "clients/client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/client_context.h"
#include "proto/tokenselect/v1/generate.grpc.pb.h"
#include "rpc/status_convert.h"

namespace tokenselect::clients {
namespace {

absl::StatusOr<v1::SelectionPolicy> PolicyFromName(const std::string& name) {
  // The names of engine::PolicyName, in the order of tokenselect.v1.SelectionPolicy.
  static constexpr struct {
    const char* name;
    v1::SelectionPolicy policy;
  } kPolicies[] = {
      {"tokenselect", v1::SELECTION_POLICY_TOKENSELECT},
      {"topk", v1::SELECTION_POLICY_TOPK},
      {"head_vote", v1::SELECTION_POLICY_HEAD_VOTE},
      {"dense", v1::SELECTION_POLICY_DENSE},
      {"streaming", v1::SELECTION_POLICY_STREAMING},
      {"tokenselect_span", v1::SELECTION_POLICY_TOKENSELECT_SPAN},
      {"infllm", v1::SELECTION_POLICY_INFLLM},
      {"quest", v1::SELECTION_POLICY_QUEST},
      {"cascade", v1::SELECTION_POLICY_CASCADE},
  };
  if (name.empty()) return v1::SELECTION_POLICY_UNSPECIFIED;
  for (const auto& p : kPolicies) {
    if (name == p.name) return p.policy;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("selection.policy must be tokenselect, topk, head_vote, dense, streaming, "
                   "tokenselect_span, infllm, quest or cascade, got '",
                   name, "'"));
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_STOP_STRING:
      return "stop_string";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    default:
      return "";
  }
}

absl::StatusOr<v1::GenerateRequest> ToProto(const GenerateInput& in) {
  v1::GenerateRequest r;
  r.set_request_id(in.request_id);
  const int inputs = !in.prompt.empty() + !in.prompt_ids.empty() + !in.chat.empty();
  if (inputs > 1) {
    return absl::InvalidArgumentError("give only one of prompt, prompt_ids and chat");
  }
  if (!in.prompt_ids.empty()) {
    r.mutable_prompt_token_ids()->mutable_ids()->Add(in.prompt_ids.begin(), in.prompt_ids.end());
  } else if (!in.chat.empty()) {
    for (const auto& [role, content] : in.chat) {
      v1::ChatMessage* m = r.mutable_chat()->add_messages();
      m->set_role(role);
      m->set_content(content);
    }
  } else if (!in.prompt.empty()) {
    r.set_prompt(in.prompt);
  }  // none: the server answers INVALID_ARGUMENT naming "input"
  if (in.add_special_tokens) r.set_add_special_tokens(*in.add_special_tokens);
  const Sampling& s = in.sampling;
  v1::SamplingParams* p = r.mutable_sampling();
  if (s.temperature) p->set_temperature(*s.temperature);
  if (s.top_k) p->set_top_k(*s.top_k);
  if (s.top_p) p->set_top_p(*s.top_p);
  if (s.min_p) p->set_min_p(*s.min_p);
  if (s.repetition_penalty) p->set_repetition_penalty(*s.repetition_penalty);
  if (s.frequency_penalty) p->set_frequency_penalty(*s.frequency_penalty);
  if (s.presence_penalty) p->set_presence_penalty(*s.presence_penalty);
  if (s.seed) p->set_seed(*s.seed);
  if (s.max_new_tokens) p->set_max_new_tokens(*s.max_new_tokens);
  p->mutable_stop_token_ids()->Add(s.stop_token_ids.begin(), s.stop_token_ids.end());
  p->set_ignore_eos(s.ignore_eos);
  for (const std::string& stop : s.stop) p->add_stop(stop);
  p->set_include_stop_str_in_output(s.include_stop_str_in_output);
  p->set_logprobs(s.logprobs);
  p->set_top_logprobs(s.top_logprobs);
  const Selection& sel = in.selection;
  v1::SelectionParams* q = r.mutable_selection();
  ASSIGN_OR_RETURN(v1::SelectionPolicy policy, PolicyFromName(sel.policy));
  q->set_policy(policy);
  if (sel.k) q->set_k(*sel.k);
  if (sel.n_init) q->set_n_init(*sel.n_init);
  if (sel.n_local) q->set_n_local(*sel.n_local);
  if (sel.theta) q->set_theta(*sel.theta);
  if (sel.chunk_size) q->set_chunk_size(*sel.chunk_size);
  if (in.skip_special_tokens) {
    r.mutable_stream_options()->set_skip_special_tokens(*in.skip_special_tokens);
  }
  return r;
}

Timings FromProto(const v1::Timings& t) {
  return {t.queue_seconds(), t.ttft_seconds(), t.total_seconds(), t.prefill_seconds()};
}

StreamChunk FromProto(const v1::GenerateResponse& r) {
  StreamChunk c;
  c.request_id = r.request_id();
  c.text = r.text();
  c.token_ids.assign(r.token_ids().begin(), r.token_ids().end());
  for (const v1::LogprobEntry& e : r.logprobs()) c.logprobs.push_back(e.chosen().logprob());
  c.final = r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  c.finish_reason = FinishReasonName(r.finish_reason());
  c.prompt_tokens = r.usage().prompt_tokens();
  c.completion_tokens = r.usage().completion_tokens();
  c.timings = FromProto(r.timings());
  return c;
}

void Accumulate(const StreamChunk& c, GenerateResult* result) {
  result->request_id = c.request_id;
  result->text += c.text;
  result->token_ids.insert(result->token_ids.end(), c.token_ids.begin(), c.token_ids.end());
  result->logprobs.insert(result->logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  if (c.final) {
    result->finish_reason = c.finish_reason;
    result->prompt_tokens = c.prompt_tokens;
    result->completion_tokens = c.completion_tokens;
    result->timings = c.timings;
  }
}

class StreamImpl final : public GenerateStream {
 public:
  StreamImpl(std::unique_ptr<grpc::ClientContext> context, absl::Status setup_error)
      : context_(std::move(context)), setup_error_(std::move(setup_error)) {}
  void Start(v1::Generation::Stub* stub, const v1::GenerateRequest& request) {
    reader_ = stub->Generate(context_.get(), request);
  }
  bool Next(StreamChunk* chunk) override {
    if (!reader_) return false;
    v1::GenerateResponse response;
    if (!reader_->Read(&response)) return false;
    *chunk = FromProto(response);
    return true;
  }
  void Cancel() override {
    if (context_) context_->TryCancel();
  }
  absl::Status Finish() override {
    if (!setup_error_.ok() || !reader_) return setup_error_;
    v1::GenerateResponse ignored;
    while (reader_->Read(&ignored)) {
    }
    absl::Status status = rpc::FromGrpcStatus(reader_->Finish());
    reader_.reset();
    setup_error_ = status.ok() ? absl::OkStatus() : status;
    return status;
  }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  absl::Status setup_error_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
};

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        channel_(std::move(channel)),
        stub_(v1::Generation::NewStub(channel_)) {}

  absl::StatusOr<GenerateResult> GenerateUnary(const GenerateInput& input,
                                               const CallOptions& call) override {
    ASSIGN_OR_RETURN(v1::GenerateRequest request, ToProto(input));
    std::unique_ptr<grpc::ClientContext> context = Context(call);
    v1::GenerateUnaryResponse response;
    RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->GenerateUnary(context.get(), request, &response)));
    GenerateResult r;
    r.request_id = response.request_id();
    r.text = response.text();
    r.token_ids.assign(response.token_ids().begin(), response.token_ids().end());
    for (const v1::LogprobEntry& e : response.logprobs())
      r.logprobs.push_back(e.chosen().logprob());
    r.finish_reason = FinishReasonName(response.finish_reason());
    r.prompt_tokens = response.usage().prompt_tokens();
    r.completion_tokens = response.usage().completion_tokens();
    r.timings = FromProto(response.timings());
    return r;
  }

  absl::StatusOr<GenerateResult> Generate(
      const GenerateInput& input, const CallOptions& call,
      const std::function<bool(const StreamChunk&)>& on_chunk) override {
    std::unique_ptr<GenerateStream> stream = StartGenerate(input, call);
    GenerateResult result;
    StreamChunk chunk;
    bool cancelled = false;
    while (stream->Next(&chunk)) {
      Accumulate(chunk, &result);
      if (on_chunk && !on_chunk(chunk)) {
        stream->Cancel();
        cancelled = true;
        break;
      }
    }
    absl::Status status = stream->Finish();
    if (cancelled) return absl::CancelledError("cancelled by the caller");
    RETURN_IF_ERROR(status);
    return result;
  }

  std::unique_ptr<GenerateStream> StartGenerate(const GenerateInput& input,
                                                const CallOptions& call) override {
    absl::StatusOr<v1::GenerateRequest> request = ToProto(input);
    if (!request.ok()) return std::make_unique<StreamImpl>(nullptr, request.status());
    auto stream = std::make_unique<StreamImpl>(Context(call), absl::OkStatus());
    stream->Start(stub_.get(), *request);
    return stream;
  }

  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                const CallOptions& call) override {
    v1::TokenizeRequest request;
    request.set_text(text);
    v1::TokenizeResponse response;
    std::unique_ptr<grpc::ClientContext> context = Context(call);
    RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->Tokenize(context.get(), request, &response)));
    return std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end());
  }

  absl::StatusOr<ModelInfoResult> GetModelInfo(const CallOptions& call) override {
    v1::ModelInfo info;
    std::unique_ptr<grpc::ClientContext> context = Context(call);
    RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub_->GetModelInfo(context.get(), v1::GetModelInfoRequest(), &info)));
    ModelInfoResult r;
    r.model_name = info.model_name();
    r.architecture = info.architecture();
    r.vocab_size = info.vocab_size();
    r.num_layers = info.num_layers();
    r.num_heads = info.num_heads();
    r.num_kv_heads = info.num_kv_heads();
    r.head_dim = info.head_dim();
    r.max_position_embeddings = info.max_position_embeddings();
    r.max_prompt_tokens = info.max_prompt_tokens();
    r.eos_token_ids.assign(info.eos_token_ids().begin(), info.eos_token_ids().end());
    return r;
  }

  absl::StatusOr<rpc::ServingStatus> Health(const std::string& service,
                                            absl::Duration timeout) override {
    return rpc::CheckHealth(channel_, service, timeout);
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context(const CallOptions& call) const {
    auto context = std::make_unique<grpc::ClientContext>();
    if (call.timeout != absl::InfiniteDuration()) {
      context->set_deadline(std::chrono::system_clock::now() +
                            absl::ToChronoMilliseconds(call.timeout));
    }
    if (!options_.api_key.empty()) {
      context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.api_key));
    }
    return context;
  }

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("client: target is empty");
  rpc::ChannelOptions channel_options;
  channel_options.tls = options.tls;
  channel_options.max_message_bytes = options.max_message_bytes;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   rpc::MakeChannel(options.target, channel_options));
  return std::unique_ptr<Client>(new ClientImpl(options, std::move(channel)));
}

}  // namespace tokenselect::clients
