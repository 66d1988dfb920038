// The prefill worker as a library: StartPrefillWorker loads the model onto its device (CPU or a
// GPU: engine/generation/worker_backend.h) or borrows a CPU model, creates the PrefillEngine
// with a KV transport (the host gRPC transport, the NCCL one with transport "nccl", or one given
// by the caller) and serves
// tokenselect.v1.PrefillWorker, grpc.health.v1.Health and server reflection on one port. The
// binary (main.cc) is a thin shell over it; the all-in-one server and the tests start it
// in-process.
#ifndef TOKENSELECT_PREFILL_WORKER_PREFILL_WORKER_H_
#define TOKENSELECT_PREFILL_WORKER_PREFILL_WORKER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/generation/model_loader.h"
#include "engine/generation/worker_backend.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_links.h"
#include "engine/transfer/kv_transport.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "prefill_worker/prefill_engine.h"
#include "wire/worker_setup.h"

namespace tokenselect::prefill_worker {

struct PrefillWorkerOptions {
  // The model: either a directory to load ...
  std::string model_dir;
  std::string load_format = "auto";  // auto | safetensors | dummy
  // ... or a CPU model owned by the caller, which must outlive the worker. Used when set.
  const engine::Model* model = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Device, GPU, KV capacity (pages x page_size; 0 pages on a GPU: planned from its memory).
  engine::WorkerBackendOptions backend;

  // host:port to listen on; port 0 picks a free port (see PrefillWorker::port()).
  std::string listen_address = "127.0.0.1:0";
  std::shared_ptr<grpc::ServerCredentials> credentials;  // insecure when null
  // Largest accepted message (a 1M-token prompt is ~3 MiB of varints).
  int max_receive_message_bytes = 64 << 20;

  // K/V transport to the decode workers: "host" (gRPC streams of the bytes, with
  // kv_channel_credentials, insecure when null) or "nccl" (GPU to GPU over one NCCL communicator
  // per decode worker, set up through the decode worker's ConnectKvLink; --device cuda only).
  // A transport given here (must outlive the worker) replaces both.
  std::string transport_kind = "host";
  engine::KvTransport* transport = nullptr;
  engine::KvLinkOptions links;  // the NCCL transport's timeouts
  std::shared_ptr<grpc::ChannelCredentials> kv_channel_credentials;

  PrefillEngineOptions engine;                 // threads, queue, KV block options
  engine::SelectionOptions default_selection;  // per-request overrides start from these
};

class PrefillWorker {
 public:
  ~PrefillWorker();  // Shutdown(0)
  PrefillWorker(const PrefillWorker&) = delete;
  PrefillWorker& operator=(const PrefillWorker&) = delete;

  int port() const { return server_.port; }
  const std::string& address() const { return server_.address; }
  const std::string& worker_id() const { return worker_id_; }
  PrefillEngine& engine() { return *engine_; }
  // The CPU backend's pool (tests check it for leaks); null on a GPU.
  const engine::PagePool* cpu_pool() const { return backend_->cpu_pool(); }

  // Graceful stop: refuse new requests (UNAVAILABLE), let queued and running prefills finish for
  // up to `grace`, abort the rest, then stop the server. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  friend absl::StatusOr<std::unique_ptr<PrefillWorker>> StartPrefillWorker(
      const PrefillWorkerOptions& options);
  PrefillWorker() = default;

  std::unique_ptr<engine::WorkerBackend> backend_;
  std::unique_ptr<engine::KvTransport> host_transport_;
  std::unique_ptr<engine::KvTransport> metered_transport_;  // with engine.metrics
  std::unique_ptr<engine::KvTransport> owned_transport_;    // NCCL, over the two above
  std::unique_ptr<PrefillEngine> engine_;
  std::unique_ptr<grpc::Service> service_;
  wire::WorkerServer server_;
  std::string worker_id_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// Loads the model (unless given), starts the engine and the server. Errors from loading;
// Unavailable when the address cannot be bound.
absl::StatusOr<std::unique_ptr<PrefillWorker>> StartPrefillWorker(
    const PrefillWorkerOptions& options);

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_PREFILL_WORKER_H_
