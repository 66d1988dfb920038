// KvTransport: moves one request's K/V from the prefill worker's pool into the decode worker's
// reservation (docs/DESIGN.md section 5, framing in docs/kv_transfer.md). Implementations: host
// (gRPC client streaming of raw bytes, prefill_worker/kv_push_service.h), in-process (tests), and
// later NCCL; all carry the same KvBlock / KvFinal framing and the receiver runs the same checks
// (kv_receiver.h).
//
// KvChunkSender is what the prefill loop talks to: it hands over each finished chunk (token
// range, all layers) and goes on computing the next one. KvTransport::OpenSender picks the
// implementation: PipelinedKvSender (below, the default) sits on top of a stream, with a sender
// thread that encodes the chunk out of the request's KvStore and sends it; its queue is bounded so
// a slow link back-pressures prefill instead of buffering the whole prompt. The NCCL transport
// (nccl_kv_transport.h) sends device to device instead.
#ifndef TOKENSELECT_ENGINE_TRANSFER_KV_TRANSPORT_H_
#define TOKENSELECT_ENGINE_TRANSFER_KV_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_store.h"

namespace tokenselect::engine {

// Where a request's K/V goes.
struct KvStreamTarget {
  std::string request_id;
  std::string reservation_id;
  std::string destination;  // the decode worker, host:port
};

// The receiver's acknowledgement of a complete stream.
struct KvPushStats {
  int64_t tokens_received = 0;
  int64_t bytes_received = 0;
};

// One open K/V stream. SendBlock and Finish are called from one thread; Abort from any thread,
// at any time (it makes pending and later calls fail).
class KvStream {
 public:
  virtual ~KvStream() = default;
  // Sends one block. Unavailable (or the receiver's error) when the stream broke.
  virtual absl::Status SendBlock(KvBlock block) = 0;
  // Sends the final record and waits for the receiver's verdict: its error (InvalidArgument,
  // NotFound for an expired reservation, ...) or its acknowledgement.
  virtual absl::StatusOr<KvPushStats> Finish(const KvFinal& final) = 0;
  // Closes the stream without a final record; the receiver aborts the request.
  virtual void Abort() = 0;
};

struct KvSenderOptions {
  int64_t max_block_bytes = 1 << 20;  // payload per message (gRPC's default limit is 4 MiB)
#ifdef NDEBUG
  bool checksum = false;  // FNV-1a per block: on in debug builds
#else
  bool checksum = true;
#endif
  int queue_depth = 2;  // chunks waiting to be sent before SendChunk blocks
};

// One request's K/V on its way out. SendChunk and Finish from one thread; Abort from any.
class KvChunkSender {
 public:
  // Aborts unless Finish succeeded.
  virtual ~KvChunkSender() = default;
  // Hands over positions [token_begin, token_end) of every layer (the forward pass that wrote
  // them has been issued). May return before they are sent; returns the first error so far.
  // InvalidArgument for a range outside the store.
  virtual absl::Status SendChunk(int64_t token_begin, int64_t token_end) = 0;
  // Waits for every chunk, then sends `final` (num_chunks filled in) and returns the receiver's
  // verdict.
  virtual absl::StatusOr<KvPushStats> Finish(KvFinal final) = 0;
  // Stops sending and aborts the stream. Thread-safe; idempotent.
  virtual void Abort() = 0;
  // Blocks (messages) sent and their payload bytes.
  virtual int64_t blocks_sent() const = 0;
  virtual int64_t bytes_sent() const = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Opens a stream to target.destination. Unavailable when it cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<KvStream>> Open(const KvStreamTarget& target) = 0;
  // Opens a sender of `store`'s K/V (which must outlive it) to the target. The default: a
  // PipelinedKvSender over Open's stream.
  virtual absl::StatusOr<std::unique_ptr<KvChunkSender>> OpenSender(
      const KvStreamTarget& target, KvStore* store, const KvSenderOptions& options);
};

class PipelinedKvSender final : public KvChunkSender {
 public:
  // `store` must outlive the sender, and the positions of every queued chunk must keep their K/V
  // until Finish or Abort returns.
  PipelinedKvSender(std::unique_ptr<KvStream> stream, KvStore* store,
                    const KvSenderOptions& options);
  // Aborts the stream unless Finish succeeded; joins the sender thread.
  ~PipelinedKvSender() override;
  PipelinedKvSender(const PipelinedKvSender&) = delete;
  PipelinedKvSender& operator=(const PipelinedKvSender&) = delete;

  // Queues the chunk (its K/V are encoded when the sender thread gets to it). Blocks while
  // queue_depth chunks wait.
  absl::Status SendChunk(int64_t token_begin, int64_t token_end) override;
  absl::StatusOr<KvPushStats> Finish(KvFinal final) override;
  void Abort() override;
  int64_t blocks_sent() const override;
  int64_t bytes_sent() const override;

 private:
  struct Chunk {
    int64_t token_begin = 0;
    int64_t token_end = 0;
  };
  void Run();
  absl::Status SendOne(const Chunk& chunk);

  std::unique_ptr<KvStream> stream_;
  KvStore* store_;
  const KvSenderOptions options_;
  const KvLayout layout_;

  mutable absl::Mutex mu_;
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the thread is sending a chunk
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t blocks_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_KV_TRANSPORT_H_
