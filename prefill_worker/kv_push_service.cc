#include "prefill_worker/kv_push_service.h"

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "rpc/status_convert.h"
#include "wire/wire_service.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"

namespace tokenselect::prefill_worker {
namespace {

namespace pb = ::tokenselect::v1;

class GrpcKvStream final : public engine::KvStream {
 public:
  GrpcKvStream(const std::shared_ptr<grpc::Channel>& channel, engine::KvStreamTarget target)
      : stub_(pb::DecodeWorker::NewStub(channel)), target_(std::move(target)) {
    writer_ = stub_->PushKv(&context_, &response_);
  }
  ~GrpcKvStream() override {
    if (!closed_) {
      context_.TryCancel();
      writer_->Finish();
    }
  }

  absl::Status SendBlock(engine::KvBlock block) override {
    if (closed_) return status_;
    pb::PushKvMessage msg;
    msg.set_request_id(target_.request_id);
    msg.set_reservation_id(target_.reservation_id);
    wire::ToWire(std::move(block), msg.mutable_chunk());
    if (!writer_->Write(msg)) return Close();
    return absl::OkStatus();
  }

  absl::StatusOr<engine::KvPushStats> Finish(const engine::KvFinal& final) override {
    if (closed_) return status_;
    pb::PushKvMessage msg;
    msg.set_request_id(target_.request_id);
    msg.set_reservation_id(target_.reservation_id);
    wire::ToWire(final, msg.mutable_final());
    writer_->Write(msg);  // a failure shows in Finish's status
    writer_->WritesDone();
    absl::Status closed = Close();
    if (!closed.ok()) return closed;
    return engine::KvPushStats{response_.tokens_received(), response_.bytes_received()};
  }

  void Abort() override { context_.TryCancel(); }

 private:
  // Ends the call and keeps its status.
  absl::Status Close() {
    closed_ = true;
    status_ =
        rpc::FromGrpcStatus(writer_->Finish(), absl::StrCat("PushKv to ", target_.destination, ": "));
    return status_;
  }

  std::unique_ptr<pb::DecodeWorker::Stub> stub_;
  engine::KvStreamTarget target_;
  grpc::ClientContext context_;
  pb::PushKvResponse response_;
  std::unique_ptr<grpc::ClientWriter<pb::PushKvMessage>> writer_;
  bool closed_ = false;
  absl::Status status_;
};

class GrpcKvTransport final : public engine::KvTransport {
 public:
  explicit GrpcKvTransport(std::shared_ptr<grpc::ChannelCredentials> credentials)
      : credentials_(credentials ? std::move(credentials) : grpc::InsecureChannelCredentials()) {}

  absl::StatusOr<std::unique_ptr<engine::KvStream>> Open(
      const engine::KvStreamTarget& target) override {
    if (target.destination.empty()) {
      return absl::InvalidArgumentError("decode_worker_address must not be empty");
    }
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&mu_);
      std::shared_ptr<grpc::Channel>& slot = channels_[target.destination];
      if (slot == nullptr) {
        grpc::ChannelArguments args;
        args.SetMaxSendMessageSize(-1);
        slot = grpc::CreateCustomChannel(target.destination, credentials_, args);
      }
      channel = slot;
    }
    return std::unique_ptr<engine::KvStream>(new GrpcKvStream(channel, target));
  }

 private:
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<engine::KvTransport> NewGrpcKvTransport(
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return std::make_unique<GrpcKvTransport>(std::move(credentials));
}

absl::StatusOr<std::unique_ptr<engine::KvTransport>> NewNcclKvTransport(
    engine::GenerationBackend* backend, engine::KvTransport* meta,
    std::shared_ptr<grpc::ChannelCredentials> credentials, const engine::KvLinkOptions& options) {
  const std::optional<engine::DeviceKvCache> cache = backend->device_cache();
  if (!cache.has_value()) {
    return absl::InvalidArgumentError(
        "--transport nccl needs --device cuda with --tp 1 (device links move one GPU's K/V; "
        "with --tp > 1 use --transport host)");
  }
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  const absl::Duration timeout = options.timeout;
  // The decode worker joins through its ConnectKvLink RPC, on a channel of its own (the RPC
  // blocks until this side has joined as well).
  engine::KvLinkConnector connector = [credentials, timeout](
                                          const std::string& destination,
                                          const std::string& link_id,
                                          const std::string& unique_id,
                                          int64_t max_chunk_tokens) -> absl::Status {
    auto stub = pb::DecodeWorker::NewStub(grpc::CreateChannel(destination, credentials));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
    pb::ConnectKvLinkRequest request;
    request.set_link_id(link_id);
    request.set_nccl_unique_id(unique_id);
    request.set_max_chunk_tokens(max_chunk_tokens);
    pb::ConnectKvLinkResponse response;
    return rpc::FromGrpcStatus(stub->ConnectKvLink(&ctx, request, &response));
  };
  return engine::NewNcclKvTransport(*cache, backend->max_chunk(), meta, std::move(connector),
                                    options);
}

}  // namespace tokenselect::prefill_worker
