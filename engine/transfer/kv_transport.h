// KvTransport: moves one request's K/V from the prefill worker's pool into the decode worker's
// reservation (docs/DESIGN.md section 5, framing in docs/kv_transfer.md). Implementations: host
// (gRPC client streaming of raw bytes, prefill_worker/kv_push_service.h), in-process (tests), and
// later NCCL; all carry the same KvBlock / KvFinal framing and the receiver runs the same checks
// (kv_receiver.h).
//
// PipelinedKvSender sits on top of a stream: the prefill loop hands it each finished chunk
// (token range, all layers) and goes on computing the next chunk while a sender thread encodes
// the chunk out of the pool and sends it; the queue is bounded so a slow link back-pressures
// prefill instead of buffering the whole prompt.
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
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/transfer/kv_format.h"

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

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Opens a stream to target.destination. Unavailable when it cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<KvStream>> Open(const KvStreamTarget& target) = 0;
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

class PipelinedKvSender {
 public:
  // `pool` must outlive the sender, and the slots of every queued chunk must keep their K/V
  // until Finish or Abort returns.
  PipelinedKvSender(std::unique_ptr<KvStream> stream, const PagePool* pool,
                    const KvSenderOptions& options);
  // Aborts the stream unless Finish succeeded; joins the sender thread.
  ~PipelinedKvSender();
  PipelinedKvSender(const PipelinedKvSender&) = delete;
  PipelinedKvSender& operator=(const PipelinedKvSender&) = delete;

  // Queues tokens [token_begin, token_end) of every layer of `table` (slots are read now; the
  // K/V when the sender thread gets to them). Blocks while queue_depth chunks wait. Returns the
  // first error of the stream so far (the sender stops at the first error).
  absl::Status SendChunk(const TokenTable& table, int64_t token_begin, int64_t token_end);

  // Waits for every queued chunk, then sends `final` (num_chunks filled in) and returns the
  // receiver's verdict.
  absl::StatusOr<KvPushStats> Finish(KvFinal final);

  // Stops sending and aborts the stream. Thread-safe; idempotent.
  void Abort();

  int64_t blocks_sent() const;
  int64_t bytes_sent() const;

 private:
  struct Chunk {
    int64_t token_begin = 0;
    int64_t token_end = 0;
    std::vector<int32_t> slots;
  };
  void Run();
  absl::Status SendOne(const Chunk& chunk);

  std::unique_ptr<KvStream> stream_;
  const PagePool* pool_;
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
