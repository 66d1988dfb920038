#include "prefill_worker/prefill_service.h"

#include <chrono>
#include <utility>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "rpc/proto_params.h"
#include "rpc/status_convert.h"
#include "wire/wire_service.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"

namespace tokenselect::prefill_worker {
namespace {

namespace pb = ::tokenselect::v1;

class PrefillServiceImpl final : public pb::PrefillWorker::Service {
 public:
  PrefillServiceImpl(PrefillEngine* engine, PrefillServiceOptions options)
      : engine_(engine), options_(std::move(options)) {}

  grpc::Status Prefill(grpc::ServerContext* ctx, const pb::PrefillRequest* req,
                       pb::PrefillResponse* out) override {
    const pb::WorkerRequest& r = req->request();
    PrefillSpec spec;
    spec.request_id = r.request_id();
    spec.prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    spec.sampling = rpc::SamplingFromProto(r.sampling());
    absl::StatusOr<engine::SelectionOptions> selection =
        rpc::SelectionFromProto(r.selection(), options_.default_selection);
    if (!selection.ok()) return rpc::ToGrpcStatus(selection.status());
    spec.selection = *selection;
    spec.decode_address = req->decode_worker_address();
    spec.reservation_id = req->reservation().reservation_id();
    spec.reserved_prompt_tokens = req->reservation().prompt_tokens();
    spec.receiver_layout = wire::ToEngine(req->reservation().layout());
    if (!req->reservation().request_id().empty() &&
        req->reservation().request_id() != spec.request_id) {
      return rpc::ToGrpcStatus(
          absl::InvalidArgumentError("reservation.request_id does not match "
                                     "request.request_id"));
    }
    const auto deadline = ctx->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      spec.deadline = absl::FromChrono(deadline);
    }
    const std::string request_id = spec.request_id;
    absl::StatusOr<PrefillHandle> handle = engine_->Submit(std::move(spec));
    if (!handle.ok()) return rpc::ToGrpcStatus(handle.status());
    while (true) {
      std::optional<absl::StatusOr<PrefillResult>> result = handle->Wait(absl::Milliseconds(20));
      if (!result.has_value()) {
        if (ctx->IsCancelled()) engine_->Cancel(request_id, "Prefill RPC cancelled");
        continue;  // the job ends promptly once cancelled
      }
      if (!result->ok()) return rpc::ToGrpcStatus(result->status());
      const PrefillResult& p = **result;
      out->set_prompt_tokens(p.prompt_tokens);
      out->set_first_token_id(p.first_token_id);
      if (p.first_token_logprob.has_value()) out->set_first_token_logprob(*p.first_token_logprob);
      out->set_seed(p.seed);
      out->set_queue_seconds(p.queue_seconds);
      out->set_prefill_seconds(p.prefill_seconds);
      out->set_transfer_seconds(p.transfer_seconds);
      out->set_kv_bytes(p.kv_bytes);
      out->set_kv_chunks(p.kv_chunks);
      return grpc::Status::OK;
    }
  }

  grpc::Status GetLoad(grpc::ServerContext*, const pb::GetLoadRequest*,
                       pb::WorkerLoad* out) override {
    const PrefillLoad load = engine_->Load();
    out->set_worker_id(options_.worker_id);
    out->set_queued_prefill_tokens(load.queued_prefill_tokens);
    out->set_running_requests(load.running);
    out->set_waiting_requests(load.waiting);
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
  PrefillEngine* engine_;
  const PrefillServiceOptions options_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewPrefillService(PrefillEngine* engine,
                                                 PrefillServiceOptions options) {
  return std::make_unique<PrefillServiceImpl>(engine, std::move(options));
}

}  // namespace tokenselect::prefill_worker
