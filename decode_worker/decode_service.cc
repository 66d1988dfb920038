#include "decode_worker/decode_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/proto_params.h"
#include "rpc/status_convert.h"
#include "wire/wire_service.h"
#include "grpcpp/grpcpp.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"

namespace tokenselect::decode_worker {
namespace {

namespace pb = ::tokenselect::v1;


absl::StatusOr<DecodeSpec> ToSpec(const pb::WorkerRequest& r,
                                  const engine::SelectionOptions& defaults) {
  DecodeSpec spec;
  spec.request_id = r.request_id();
  spec.prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  spec.sampling = rpc::SamplingFromProto(r.sampling());
  absl::StatusOr<engine::SelectionOptions> selection =
      rpc::SelectionFromProto(r.selection(), defaults);
  if (!selection.ok()) return selection.status();
  spec.selection = *selection;
  spec.skip_special_tokens = !r.has_skip_special_tokens() || r.skip_special_tokens();
  return spec;
}

void ToWire(const DecodedToken& t, pb::LogprobEntry* out) {
  out->mutable_chosen()->set_token_id(t.id);
  out->mutable_chosen()->set_logprob(t.logprob.value_or(0.0f));
  for (const engine::TokenLogprob& top : t.top_logprobs) {
    pb::TokenLogprob* e = out->add_top();
    e->set_token_id(top.token_id);
    e->set_logprob(top.logprob);
  }
}

class DecodeServiceImpl final : public pb::DecodeWorker::Service {
 public:
  DecodeServiceImpl(DecodeEngine* engine, DecodeServiceOptions options)
      : engine_(engine), options_(std::move(options)) {}

  grpc::Status Decode(grpc::ServerContext* ctx, const pb::DecodeRequest* req,
                      grpc::ServerWriter<pb::DecodeResponse>* writer) override {
    absl::StatusOr<DecodeSpec> spec = ToSpec(req->request(), options_.default_selection);
    if (!spec.ok()) return rpc::ToGrpcStatus(spec.status());
    const std::string request_id = spec->request_id;
    absl::StatusOr<DecodeStream> stream = engine_->Admit(std::move(spec).value());
    if (!stream.ok()) return rpc::ToGrpcStatus(stream.status());

    const Reservation& r = stream->reservation();
    pb::DecodeResponse first;
    pb::Reservation* out = first.mutable_reservation();
    out->set_reservation_id(r.reservation_id);
    out->set_request_id(r.request_id);
    out->set_reserved_tokens(r.reserved_tokens);
    out->set_prompt_tokens(r.prompt_tokens);
    wire::ToWire(r.layout, out->mutable_layout());
    out->set_lease_expires_unix_ms(absl::ToUnixMillis(r.lease_expires));
    if (options_.address) out->set_decode_worker_address(options_.address());
    if (!writer->Write(first)) {
      engine_->Cancel(request_id, "Decode stream closed by the client");
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    while (true) {
      std::optional<DecodeEvent> event = stream->Next(absl::Milliseconds(20));
      if (ctx->IsCancelled()) {
        engine_->Cancel(request_id, "Decode RPC cancelled");
        return grpc::Status(grpc::StatusCode::CANCELLED, "Decode cancelled");
      }
      if (!event.has_value()) continue;
      pb::DecodeResponse response;
      switch (event->kind) {
        case DecodeEvent::Kind::kTokens: {
          pb::DecodeTokens* tokens = response.mutable_tokens();
          bool logprobs = false;
          for (const DecodedToken& t : event->tokens) logprobs |= t.logprob.has_value();
          for (const DecodedToken& t : event->tokens) {
            tokens->add_token_ids(t.id);
            if (logprobs) ToWire(t, tokens->add_logprobs());
          }
          tokens->set_text(std::move(event->text));
          break;
        }
        case DecodeEvent::Kind::kFinal: {
          pb::DecodeFinal* final = response.mutable_final();
          final->set_finish_reason(wire::ToWire(event->finish_reason));
          final->mutable_usage()->set_prompt_tokens(event->prompt_tokens);
          final->mutable_usage()->set_completion_tokens(event->completion_tokens);
          final->set_kv_wait_seconds(event->kv_wait_seconds);
          final->set_decode_seconds(event->decode_seconds);
          final->mutable_selection_stats()->set_cache_hits(event->cache.hits);
          final->mutable_selection_stats()->set_cache_misses(event->cache.misses);
          break;
        }
        case DecodeEvent::Kind::kError:
          return rpc::ToGrpcStatus(event->status);
      }
      if (!writer->Write(response)) {
        engine_->Cancel(request_id, "Decode stream closed by the client");
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      if (event->kind == DecodeEvent::Kind::kFinal) return grpc::Status::OK;
    }
  }

  grpc::Status PushKv(grpc::ServerContext* ctx, grpc::ServerReader<pb::PushKvMessage>* reader,
                      pb::PushKvResponse* response) override {
    pb::PushKvMessage msg;
    std::string request_id, reservation_id;
    bool final_seen = false;
    // The device link of a stream whose chunks name one (the NCCL transport), held until the
    // stream ends; broken (aborted, dropped) unless the stream completes.
    std::unique_ptr<engine::KvLinkLease> link;
    while (reader->Read(&msg)) {
      if (request_id.empty()) {
        request_id = msg.request_id();
        reservation_id = msg.reservation_id();
      }
      if (final_seen) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "message after the final record");
      }
      if (msg.has_chunk()) {
        engine::KvBlock block = wire::ToEngine(msg.mutable_chunk());
        if (!block.link_id.empty() && link == nullptr) {
          absl::Status status = AcquireLink(block.link_id, &link);
          if (!status.ok()) {
            engine_->AbortKv(msg.request_id(), msg.reservation_id(), status);
            return rpc::ToGrpcStatus(status);
          }
        }
        absl::Status status =
            engine_->AcceptKv(msg.request_id(), msg.reservation_id(), block, link.get());
        if (!status.ok()) return rpc::ToGrpcStatus(status);
      } else if (msg.has_final()) {
        absl::StatusOr<engine::KvPushStats> stats =
            engine_->FinishKv(msg.request_id(), msg.reservation_id(),
                              wire::ToEngine(msg.mutable_final()), link.get());
        if (!stats.ok()) return rpc::ToGrpcStatus(stats.status());
        if (link != nullptr) link->Release();
        response->set_tokens_received(stats->tokens_received);
        response->set_bytes_received(stats->bytes_received);
        final_seen = true;
      } else {
        const absl::Status status =
            absl::InvalidArgumentError("push_kv message has neither chunk nor final");
        engine_->AbortKv(msg.request_id(), msg.reservation_id(), status);
        return rpc::ToGrpcStatus(status);
      }
    }
    if (!final_seen) {
      const absl::Status status = ctx->IsCancelled()
                                      ? absl::CancelledError("KV stream cancelled by the sender")
                                      : absl::InvalidArgumentError("KV stream ended without final");
      if (!request_id.empty()) engine_->AbortKv(request_id, reservation_id, status);
      return rpc::ToGrpcStatus(status);
    }
    return grpc::Status::OK;
  }

  grpc::Status ConnectKvLink(grpc::ServerContext*, const pb::ConnectKvLinkRequest* req,
                             pb::ConnectKvLinkResponse*) override {
    if (options_.links == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this decode worker takes no device K/V links (it needs --device cuda "
                          "and a build with NCCL); use the host transport");
    }
    return rpc::ToGrpcStatus(options_.links->Connect(req->link_id(), req->nccl_unique_id(),
                                                     req->max_chunk_tokens()));
  }

  grpc::Status GetLoad(grpc::ServerContext*, const pb::GetLoadRequest*,
                       pb::WorkerLoad* out) override {
    const DecodeLoad load = engine_->Load();
    out->set_worker_id(options_.worker_id);
    out->set_running_requests(load.running);
    out->set_waiting_requests(std::max<int64_t>(0, load.waiting));
    out->set_free_kv_pages(load.free_pages);
    out->set_total_kv_pages(load.total_pages);
    out->set_page_size(load.page_size);
    out->set_draining(load.draining);
    rpc::SelectionToProto(options_.default_selection, out->mutable_default_selection());
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const pb::CancelRequest* req,
                      pb::CancelResponse* out) override {
    out->set_found(engine_->Cancel(req->request_id(), req->reason()));
    return grpc::Status::OK;
  }

 private:
  absl::Status AcquireLink(const std::string& link_id, std::unique_ptr<engine::KvLinkLease>* out) {
    if (options_.links == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.link_id '", link_id, "': this decode worker takes no device K/V links"));
    }
    absl::StatusOr<std::unique_ptr<engine::KvLinkLease>> lease = options_.links->Acquire(link_id);
    if (!lease.ok()) return lease.status();
    *out = *std::move(lease);
    return absl::OkStatus();
  }

  DecodeEngine* engine_;
  const DecodeServiceOptions options_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewDecodeService(DecodeEngine* engine,
                                                DecodeServiceOptions options) {
  return std::make_unique<DecodeServiceImpl>(engine, std::move(options));
}

}  // namespace tokenselect::decode_worker
