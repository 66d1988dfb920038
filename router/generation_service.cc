#include "router/generation_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/tokenselect/v1/generate.grpc.pb.h"
#include "rpc/proto_params.h"
#include "rpc/status_convert.h"

// Returns the grpc::Status of an absl::Status expression when it is an error.
#define RETURN_GRPC_IF_ERROR(expr)                                        \
  do {                                                                    \
    const absl::Status ts_grpc_status_ = (expr);                          \
    if (!ts_grpc_status_.ok()) return rpc::ToGrpcStatus(ts_grpc_status_); \
  } while (0)

namespace tokenselect::router {
namespace {

constexpr size_t kMaxRequestIdBytes = 128;

absl::StatusOr<SelectionSpec> ToSelectionSpec(const v1::SelectionParams& p) {
  SelectionSpec s;
  ASSIGN_OR_RETURN(s.policy, rpc::SelectionPolicyFromNumber(p.policy()));
  if (p.has_k()) s.k = p.k();
  if (p.has_n_init()) s.n_init = p.n_init();
  if (p.has_n_local()) s.n_local = p.n_local();
  if (p.has_theta()) s.theta = p.theta();
  if (p.has_chunk_size()) s.chunk_size = p.chunk_size();
  return s;
}

void ToProto(const LogprobSpec& l, v1::LogprobEntry* e) {
  e->mutable_chosen()->set_token_id(l.chosen.token_id);
  e->mutable_chosen()->set_logprob(l.chosen.logprob);
  for (const TokenLogprobSpec& t : l.top) {
    v1::TokenLogprob* out = e->add_top();
    out->set_token_id(t.token_id);
    out->set_logprob(t.logprob);
  }
}

void ToProto(const TimingsSpec& t, v1::Timings* out) {
  out->set_queue_seconds(t.queue_seconds);
  out->set_ttft_seconds(t.ttft_seconds);
  out->set_total_seconds(t.total_seconds);
  out->set_prefill_seconds(t.prefill_seconds);
}

class GenerationService final : public v1::Generation::Service {
 public:
  explicit GenerationService(GenerationServiceOptions options) : options_(std::move(options)) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    const absl::Time arrival = absl::Now();
    RETURN_GRPC_IF_ERROR(CountedIfError(Authorize(*context)));
    absl::StatusOr<RequestSpec> spec = BuildSpec(*request);
    if (!spec.ok()) return rpc::ToGrpcStatus(CountedIfError(spec.status()));
    const RequestSpec& s = *spec;
    FinishReasonCode finish = FinishReasonCode::kUnspecified;
    const absl::Status status =
        options_.dispatcher->Run(context, s, arrival, [&](const StreamEvent& event) {
          if (event.final) finish = event.finish_reason;
          v1::GenerateResponse response;
          response.set_request_id(s.request_id);
          response.set_text(event.text);
          response.mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
          for (const LogprobSpec& l : event.logprobs) ToProto(l, response.add_logprobs());
          if (event.final || s.continuous_usage) {
            response.mutable_usage()->set_prompt_tokens(event.usage.prompt_tokens);
            response.mutable_usage()->set_completion_tokens(event.usage.completion_tokens);
          }
          if (event.final) {
            response.set_finish_reason(static_cast<v1::FinishReason>(event.finish_reason));
            ToProto(event.timings, response.mutable_timings());
            response.mutable_selection_stats()->set_cache_hits(event.cache_hits);
            response.mutable_selection_stats()->set_cache_misses(event.cache_misses);
          }
          return writer->Write(response);
        });
    Counted(status, finish);
    LogOutcome(s, status);
    return rpc::ToGrpcStatus(status);
  }

  grpc::Status GenerateUnary(grpc::ServerContext* context, const v1::GenerateRequest* request,
                             v1::GenerateUnaryResponse* response) override {
    const absl::Time arrival = absl::Now();
    RETURN_GRPC_IF_ERROR(CountedIfError(Authorize(*context)));
    absl::StatusOr<RequestSpec> spec = BuildSpec(*request);
    if (!spec.ok()) return rpc::ToGrpcStatus(CountedIfError(spec.status()));
    response->set_request_id(spec->request_id);
    FinishReasonCode finish = FinishReasonCode::kUnspecified;
    const absl::Status status =
        options_.dispatcher->Run(context, *spec, arrival, [&](const StreamEvent& event) {
          response->mutable_text()->append(event.text);
          response->mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
          for (const LogprobSpec& l : event.logprobs) ToProto(l, response->add_logprobs());
          if (event.final) {
            finish = event.finish_reason;
            response->set_finish_reason(static_cast<v1::FinishReason>(event.finish_reason));
            response->mutable_usage()->set_prompt_tokens(event.usage.prompt_tokens);
            response->mutable_usage()->set_completion_tokens(event.usage.completion_tokens);
            ToProto(event.timings, response->mutable_timings());
            response->mutable_selection_stats()->set_cache_hits(event.cache_hits);
            response->mutable_selection_stats()->set_cache_misses(event.cache_misses);
          }
          return !context->IsCancelled();
        });
    Counted(status, finish);
    LogOutcome(*spec, status);
    return rpc::ToGrpcStatus(status);
  }

  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override {
    RETURN_GRPC_IF_ERROR(Authorize(*context));
    const bool add_special =
        request->has_add_special_tokens() ? request->add_special_tokens() : true;
    std::vector<int32_t> ids;
    switch (request->input_case()) {
      case v1::TokenizeRequest::kText:
        ids = options_.model->tokenizer->Encode(request->text(), add_special);
        break;
      case v1::TokenizeRequest::kChat: {
        absl::StatusOr<std::vector<int32_t>> chat = EncodeChat(request->chat());
        if (!chat.ok()) return rpc::ToGrpcStatus(chat.status());
        ids = *std::move(chat);
        break;
      }
      default:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "input: one of text or chat is required");
    }
    for (int32_t id : ids) {
      response->add_token_ids(id);
      response->add_tokens(options_.model->tokenizer->IdToToken(id).value_or(""));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    RETURN_GRPC_IF_ERROR(Authorize(*context));
    const ServedModel& m = *options_.model;
    info->set_model_name(m.name);
    info->set_architecture(m.shape.architecture);
    info->set_vocab_size(m.vocab_size());
    info->set_num_layers(m.shape.num_layers);
    info->set_num_heads(m.shape.num_heads);
    info->set_num_kv_heads(m.shape.num_kv_heads);
    info->set_head_dim(m.shape.head_dim);
    info->set_max_position_embeddings(m.shape.max_position_embeddings);
    info->set_max_prompt_tokens(m.max_prompt_tokens);
    for (int32_t id : m.EosIds()) info->add_eos_token_ids(id);
    rpc::SelectionToProto(
        options_.dispatcher->WorkersDefaultSelection().value_or(options_.default_selection),
        info->mutable_default_selection());
    return grpc::Status::OK;
  }

 private:
  // Counts a finished Generate / GenerateUnary call in tokenselect_requests_total.
  void Counted(const absl::Status& status, FinishReasonCode finish) const {
    if (options_.metrics != nullptr) options_.metrics->RecordRequest(status, finish);
  }
  // Counts a call refused before dispatch (authentication, validation); returns `status`.
  const absl::Status& CountedIfError(const absl::Status& status) const {
    if (!status.ok()) Counted(status, FinishReasonCode::kUnspecified);
    return status;
  }

  absl::Status Authorize(const grpc::ServerContext& context) const {
    if (!options_.api_keys.enabled()) return absl::OkStatus();
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) return options_.api_keys.Check("");
    return options_.api_keys.Check(absl::string_view(it->second.data(), it->second.size()));
  }

  absl::StatusOr<std::vector<int32_t>> EncodeChat(const v1::Chat& chat) const {
    std::vector<tokenizer::ChatMessage> messages;
    for (const v1::ChatMessage& m : chat.messages()) messages.push_back({m.role(), m.content()});
    const bool add_generation_prompt =
        chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true;
    absl::StatusOr<std::string> rendered =
        options_.model->tokenizer->ApplyChatTemplate(messages, add_generation_prompt);
    if (!rendered.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chat: ", rendered.status().message()));
    }
    return options_.model->tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
  }

  absl::StatusOr<RequestSpec> BuildSpec(const v1::GenerateRequest& request) const {
    RequestSpec spec;
    if (request.request_id().size() > kMaxRequestIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: at most ", kMaxRequestIdBytes, " bytes"));
    }
    spec.request_id = request.request_id().empty() ? common::NewId("req") : request.request_id();
    const bool add_special = request.has_add_special_tokens() ? request.add_special_tokens() : true;
    switch (request.input_case()) {
      case v1::GenerateRequest::kPrompt:
        if (request.prompt().empty()) return absl::InvalidArgumentError("prompt: empty prompt");
        spec.prompt_ids = options_.model->tokenizer->Encode(request.prompt(), add_special);
        break;
      case v1::GenerateRequest::kPromptTokenIds:
        spec.prompt_ids.assign(request.prompt_token_ids().ids().begin(),
                               request.prompt_token_ids().ids().end());
        if (spec.prompt_ids.empty()) {
          return absl::InvalidArgumentError("prompt_token_ids: empty prompt");
        }
        break;
      case v1::GenerateRequest::kChat: {
        ASSIGN_OR_RETURN(spec.prompt_ids, EncodeChat(request.chat()));
        break;
      }
      default:
        return absl::InvalidArgumentError(
            "input: one of prompt, prompt_token_ids or chat is required");
    }
    RETURN_IF_ERROR(ValidatePrompt(spec.prompt_ids, options_.model->max_prompt_tokens,
                                   options_.model->vocab_size()));
    spec.sampling = rpc::SamplingFromProto(request.sampling());
    RETURN_IF_ERROR(
        params::Validate(spec.sampling, static_cast<int>(options_.model->vocab_size())));
    ASSIGN_OR_RETURN(spec.selection, ToSelectionSpec(request.selection()));
    RETURN_IF_ERROR(ValidateSelection(spec.selection));
    const v1::StreamOptions& stream = request.stream_options();
    spec.skip_special_tokens =
        stream.has_skip_special_tokens() ? stream.skip_special_tokens() : true;
    spec.continuous_usage = stream.continuous_usage();
    return spec;
  }

  static void LogOutcome(const RequestSpec& spec, const absl::Status& status) {
    if (status.ok()) {
      TS_LOG(DEBUG, "request {} ok ({} prompt tokens)", spec.request_id, spec.prompt_ids.size());
    } else {
      TS_LOG(INFO, "request {} failed: {}", spec.request_id, status.ToString());
    }
  }

  const GenerationServiceOptions options_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewGenerationService(GenerationServiceOptions options) {
  return std::make_unique<GenerationService>(std::move(options));
}

}  // namespace tokenselect::router
