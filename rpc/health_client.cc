#include "rpc/health_client.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "rpc/status_convert.h"

namespace tokenselect::rpc {
namespace {

// HealthCheckRequest { string service = 1; }: tag 0x0a, length, bytes (services are short).
std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string out = "\x0a";
  out.push_back(static_cast<char>(service.size()));
  return out + service;
}

// HealthCheckResponse { ServingStatus status = 1; }: tag 0x08, varint. Absent means UNKNOWN.
ServingStatus DecodeResponse(const std::string& bytes) {
  if (bytes.size() >= 2 && bytes[0] == '\x08') {
    const int value = static_cast<unsigned char>(bytes[1]);
    if (value >= 0 && value <= 3) return static_cast<ServingStatus>(value);
  }
  return ServingStatus::kUnknown;
}

}  // namespace

absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service, absl::Duration timeout) {
  if (service.size() > 127) return absl::InvalidArgumentError("health service name too long");
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return DecodeResponse(bytes);
}

}  // namespace tokenselect::rpc
