// NcclKvLink: moves K/V GPU to GPU between one prefill process (rank 0, the sender) and one
// decode process (rank 1, the receiver) over a two-rank NCCL communicator (docs/DESIGN.md
// section 5; wire format and failure handling in docs/kv_transfer.md, "NCCL transport").
//
// Setup, per prefill/decode pair, lazily on the first request between them: one side calls
// CreateUniqueId() and sends the 128 bytes to the other (over worker.proto); both call Connect()
// with the bytes, their rank and their GPU, concurrently (each blocks until the other has joined,
// or the timeout). The process that created the id must stay alive until both Connects return.
//
// Per chunk (a token range of a layer range), both sides follow the same plan, derived from the
// reservation and the prefill chunk size, in the same order:
//   sender:    SendChunk(range, its slots of the tokens, event after which the K/V are written)
//   receiver:  RecvChunk(range, its slots of the tokens)
//   ...        then Flush() on both sides (the receiver's K/V are in its slots when it returns).
// Each chunk travels as one ncclSend / ncclRecv (one NCCL group) of a 256-byte header (sequence
// number, layer and token range, row length, payload bytes) followed by the payload in the
// kernels/cuda/kv_pack.h staging layout [layers, 2, tokens, row] bf16. The receiver checks the
// header against its own plan before it scatters anything.
//
// Pipelining: options.staging_buffers (3) staging buffers per side. The sender packs chunk i+1 (on
// its pack stream) while chunk i is on the wire (comm stream); the receiver has chunk i+1's
// receive posted while it scatters chunk i (scatter stream). SendChunk / RecvChunk
// therefore return before their chunk has arrived: an error of chunk i (peer death, a header
// that disagrees) is returned by a later call or by Flush.
//
// Failures: the communicator is non-blocking (ncclConfig_t.blocking = 0). Every wait polls the CUDA
// event and ncclCommGetAsyncError against a deadline (options.timeout per wait). An NCCL error
// (the peer died or aborted and NCCL noticed) -> Unavailable; no progress before the deadline (a
// dead peer NCCL does not notice) -> DeadlineExceeded. Either way the link calls ncclCommAbort
// (which stops its kernels), becomes broken, and every later call returns that first error; the
// caller destroys it and connects a new link with a new unique id. Abort() does the same on
// request. Bad arguments -> InvalidArgument naming the field (the link stays usable).
//
// Threads: SendChunk / RecvChunk / Flush from one thread at a time; Abort from any thread at any
// time (it interrupts a wait in progress). Methods set the calling thread's current device to the
// link's device.
#ifndef TOKENSELECT_ENGINE_TRANSFER_NCCL_KV_LINK_H_
#define TOKENSELECT_ENGINE_TRANSFER_NCCL_KV_LINK_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tokenselect::engine {

// A process's GPU K/V cache as the link sees it: per layer one K and one V array [num_slots, row]
// bf16 on the link's device (engine/model/cuda_model.h). Must outlive the link.
struct NcclKvCache {
  std::vector<__nv_bfloat16*> k_layers;  // [num_layers]
  std::vector<__nv_bfloat16*> v_layers;  // [num_layers]
  int64_t num_slots = 0;
  int64_t row = 0;  // num_kv_heads * head_dim
};

// Layers [layer_begin, layer_end) x prompt positions [token_begin, token_end).
struct KvChunkRange {
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
};

struct NcclKvLinkOptions {
  static constexpr int kMaxStagingBuffers = 4;
  // Staging capacity: a chunk may have at most this many tokens (x all layers; fewer layers leave
  // room unused). staging_buffers buffers of 256 + max_chunk_tokens * num_layers * 2 * row * 2
  // bytes per side (3 x 64 MiB for Llama-3-8B and 512 tokens).
  int64_t max_chunk_tokens = 512;
  // Chunks in flight per side, 2 to kMaxStagingBuffers. A third buffer lets the receiver post
  // chunk i+2's receive without waiting for chunk i's scatter, and the sender pack ahead of a
  // slow chunk (bench/nccl_kv_bench.cc measures 2 against 3). Each side picks its own.
  int staging_buffers = 3;
  // Blocks of the pack / scatter kernels (kernels/cuda/kv_pack.h max_blocks; 0: uncapped). They
  // run next to the NCCL kernel of the previous chunk; a capped grid leaves it the other SMs
  // (bench/nccl_kv_bench.cc sweeps this: with 3 buffers 32 to 192 are within the run-to-run noise
  // of +-1 ms per 16 GiB, 128 had the steadiest medians, uncapped is about 1 ms slower).
  int copy_blocks = 128;
  // Longest any single wait (Connect, a free staging buffer, a chunk's arrival, Flush) may take.
  absl::Duration timeout = absl::Seconds(30);
};

class NcclKvLink {
 public:
  static constexpr int kSenderRank = 0;    // the prefill process
  static constexpr int kReceiverRank = 1;  // the decode process

  // A fresh ncclUniqueId: 128 opaque bytes. Starts NCCL's bootstrap listener in this process.
  // Internal on NCCL errors.
  static absl::StatusOr<std::string> CreateUniqueId();

  // Joins the communicator named by `unique_id` as `rank` on GPU `device`, and allocates the
  // staging buffers. Blocks until the peer has joined too. InvalidArgument naming the field for a
  // unique_id that is not 128 bytes, a rank other than 0 or 1, a device that does not exist, or a
  // bad cache or options; DeadlineExceeded when the peer does not join within options.timeout;
  // Unavailable / Internal for NCCL errors; ResourceExhausted when device memory runs out.
  static absl::StatusOr<std::unique_ptr<NcclKvLink>> Connect(absl::string_view unique_id, int rank,
                                                             int device, const NcclKvCache& cache,
                                                             const NcclKvLinkOptions& options = {});

  // A healthy link waits for its outstanding chunks (up to options.timeout) and finalizes the
  // communicator; a broken one (or one whose finalize stalls) aborts it.
  ~NcclKvLink();
  NcclKvLink(const NcclKvLink&) = delete;
  NcclKvLink& operator=(const NcclKvLink&) = delete;

  // Sender (rank 0) only. Packs `range` from the cache rows `slots` (slots[i] holds position
  // range.token_begin + i; the slots' K/V must stay until they are packed, i.e. until the call
  // two chunks later or Flush returns) and sends it. When `kv_ready` is not null the packing waits
  // for that event (recorded by the caller after the forward pass that wrote these K/V) on the
  // device, not on the host. Blocks only while all staging buffers are in flight.
  // InvalidArgument naming the field: layer_begin/layer_end/token_begin/token_end (empty or out of
  // order, or more than max_chunk_tokens tokens), slots (size != tokens, or a slot outside the
  // cache); FailedPrecondition on the receiver; otherwise the errors of the class comment.
  absl::Status SendChunk(const KvChunkRange& range, absl::Span<const int32_t> slots,
                         cudaEvent_t kv_ready = nullptr);

  // Receiver (rank 1) only. Receives the next chunk, which must be `range`, and scatters it into
  // the cache rows `slots` (slots[i] for position range.token_begin + i). Argument errors as
  // SendChunk. A received header that differs from the expected one (sequence, ranges, row,
  // size: the two plans disagree) -> InvalidArgument naming the header field, nothing of that
  // chunk is scattered, and the link is broken.
  absl::Status RecvChunk(const KvChunkRange& range, absl::Span<const int32_t> slots);

  // Waits until every chunk so far has been sent (sender) or received and scattered into the
  // cache (receiver). Returns the link's first error.
  absl::Status Flush();

  // Aborts the communicator (interrupting a wait in progress, whose call returns Aborted) and
  // breaks the link. Thread-safe; idempotent.
  void Abort();

  // OK while the link is usable; otherwise its first error.
  absl::Status health() const;

  int rank() const { return rank_; }
  int device() const { return device_; }
  // Chunks sent (handed to NCCL) or received (checked and scattered) so far, and their payload
  // bytes (headers excluded).
  int64_t chunks() const { return chunks_.load(); }
  int64_t bytes() const { return bytes_.load(); }

 private:
  struct Impl;
  NcclKvLink(int rank, int device, std::unique_ptr<Impl> impl);

  struct PollPlan;
  // Polls `done` until it returns true (or an error, returned as is). Between polls: Aborted after
  // Abort, DeadlineExceeded after options.timeout, both breaking the link.
  absl::Status Poll(absl::string_view what, const PollPlan& plan,
                    absl::FunctionRef<absl::StatusOr<bool>()> done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls `event` until it completes. Breaks the link on an NCCL error, abort or deadline.
  absl::Status Wait(cudaEvent_t event, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls ncclCommGetAsyncError until the last NCCL call has been enqueued (ncclInProgress ends).
  absl::Status WaitNccl(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The communicator's async state: true when idle, false while a call is in progress; breaks the
  // link (Internal / Unavailable) on an NCCL error.
  absl::StatusOr<bool> NcclIdle(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK for cudaSuccess; otherwise breaks the link with CudaStatus(e, what).
  absl::Status CheckCuda(cudaError_t e, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SendChunk's and RecvChunk's start: checks the call (health, that this side is `rank`, the
  // range and slots), waits until the next chunk's staging buffer is free and returns it.
  absl::StatusOr<int> StartChunk(int rank, const KvChunkRange& range,
                                 absl::Span<const int32_t> slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for chunk i's last event (sent / scattered) if it is in flight, freeing its buffer.
  absl::Status Reclaim(int64_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends (sender) or receives (receiver) the first `bytes` of staging buffer b as the next chunk
  // on the comm stream; returns once NCCL has enqueued it.
  absl::Status EnqueueTransfer(int b, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts the communicator and records `error` as the link's first error (kept if one exists).
  absl::Status Break(absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRange(const KvChunkRange& range, absl::Span<const int32_t> slots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Receiver: waits for the pending chunk, checks its header, enqueues its scatter.
  absl::Status FinishPendingReceive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  const int device_;
  std::atomic<bool> abort_requested_{false};  // makes a wait in progress give up at once
  std::atomic<int64_t> chunks_{0};
  std::atomic<int64_t> bytes_{0};
  // mu_ is held through a whole call, waits included (Abort takes it after raising
  // abort_requested_, which ends any wait promptly). err_mu_ guards only the first error, so that
  // health() never waits for a call in progress. Order: mu_, then err_mu_.
  mutable absl::Mutex mu_;
  std::unique_ptr<Impl> impl_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex err_mu_;
  absl::Status error_ ABSL_GUARDED_BY(err_mu_);
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_NCCL_KV_LINK_H_
