// The decode worker as a library: StartDecodeWorker loads (or borrows) the model, creates the
// DecodeEngine and serves tokenselect.v1.DecodeWorker, grpc.health.v1.Health and server
// reflection on one port. The binary (main.cc) is a thin shell over it; the all-in-one server and
// the tests start it in-process.
#ifndef TOKENSELECT_DECODE_WORKER_DECODE_WORKER_H_
#define TOKENSELECT_DECODE_WORKER_DECODE_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "decode_worker/decode_engine.h"
#include "engine/generation/model_loader.h"
#include "engine/generation/worker_backend.h"
#include "engine/selection/selection_options.h"
#include "engine/transfer/kv_links.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "wire/worker_setup.h"

namespace tokenselect::decode_worker {

struct DecodeWorkerOptions {
  // The model: either a directory to load ...
  std::string model_dir;
  std::string load_format = "auto";  // auto | safetensors | dummy
  // ... or a CPU model and tokenizer owned by the caller, which must outlive the worker
  // (all-in-one on the CPU shares one copy between the workers). Used when model is set.
  const engine::Model* model = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Device, GPU, KV capacity (pages x page_size; 0 pages on a GPU: planned from its memory).
  engine::WorkerBackendOptions backend;

  // host:port to listen on; port 0 picks a free port (see DecodeWorker::port()).
  std::string listen_address = "127.0.0.1:0";
  // Insecure when null.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Largest accepted message (PushKv blocks are 1 MiB by default; a 1M-token prompt in a
  // DecodeRequest is ~3 MiB of varints).
  int max_receive_message_bytes = 64 << 20;

  DecodeEngineOptions engine;                  // lease_timeout, clock, metrics
  engine::KvLinkOptions links;                 // device K/V links (GPU + NCCL): timeouts
  engine::SelectionOptions default_selection;  // per-request overrides start from these
};

class DecodeWorker {
 public:
  ~DecodeWorker();  // Shutdown(0)
  DecodeWorker(const DecodeWorker&) = delete;
  DecodeWorker& operator=(const DecodeWorker&) = delete;

  // The bound port and "host:port" as clients reach it.
  int port() const { return server_.port; }
  const std::string& address() const { return server_.address; }
  const std::string& worker_id() const { return worker_id_; }
  DecodeEngine& engine() { return *engine_; }
  // The CPU backend's pool (tests check it for leaks); null on a GPU.
  const engine::PagePool* cpu_pool() const { return backend_->cpu_pool(); }

  // Graceful stop: refuse new requests (UNAVAILABLE), let running ones finish for up to `grace`,
  // cancel the rest, then stop the server. Idempotent; safe from any thread except a handler.
  void Shutdown(absl::Duration grace);

 private:
  friend absl::StatusOr<std::unique_ptr<DecodeWorker>> StartDecodeWorker(
      const DecodeWorkerOptions& options);
  DecodeWorker() = default;

  std::unique_ptr<engine::WorkerBackend> backend_;
  std::unique_ptr<engine::KvLinkAcceptor> links_;  // destroyed after the server and engine
  std::unique_ptr<DecodeEngine> engine_;
  std::unique_ptr<grpc::Service> service_;
  wire::WorkerServer server_;
  std::string worker_id_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// Loads the model (unless given), starts the engine and the server. InvalidArgument / NotFound
// from loading; Unavailable when the address cannot be bound.
absl::StatusOr<std::unique_ptr<DecodeWorker>> StartDecodeWorker(const DecodeWorkerOptions& options);

}  // namespace tokenselect::decode_worker

#endif  // TOKENSELECT_DECODE_WORKER_DECODE_WORKER_H_
