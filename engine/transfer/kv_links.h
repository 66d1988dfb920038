// Device K/V links between workers: the NCCL transport (docs/kv_transfer.md, "NCCL transport";
// DESIGN section 5). One two-rank NCCL communicator (nccl_kv_link.h) per prefill process and
// decode worker, created lazily on the first request between them:
//
//   prefill (rank 0)   NewNcclKvTransport: OpenSender to a decode worker without a link creates
//                      an ncclUniqueId, asks the decode worker to join (the connector: the
//                      DecodeWorker.ConnectKvLink RPC) while joining itself, then keeps the link.
//                      A request holds the link from OpenSender until its sender finishes (links
//                      carry one request at a time, in order); each prefill chunk goes out as
//                      one NCCL transfer of all layers (packed from the request's device slots)
//                      plus a metadata block on the host stream that names the link and carries
//                      no bytes. Finish waits for the link, then sends the final record.
//   decode (rank 1)    KvLinkAcceptor::Connect joins; the PushKv handler Acquires the link named
//                      by a stream's first linked block and hands it to the receiver as its
//                      KvSideChannel, which receives each chunk into the request's slots.
//
// Failures: any link error (the peer died, a stall past the timeout, a header that disagrees),
// or a request aborted mid-transfer, breaks the link on that side: it is aborted
// (ncclCommAbort) and dropped, the request fails (the decode worker rewinds the reservation; the
// lease frees it), and the next request connects a new link with a new id. Without NCCL in the
// build the factories return FailedPrecondition.
#ifndef TOKENSELECT_ENGINE_TRANSFER_KV_LINKS_H_
#define TOKENSELECT_ENGINE_TRANSFER_KV_LINKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/transfer/kv_store.h"
#include "engine/transfer/kv_transport.h"

namespace tokenselect::engine {

struct KvLinkOptions {
  // Longest wait for the peer to join, for a staging buffer, or for a chunk to land.
  absl::Duration timeout = absl::Seconds(10);
};

// A link held by one KV stream on the decode side. Breaks the link (abort + drop) when destroyed
// after a failure or before Release.
class KvLinkLease : public KvSideChannel {
 public:
  // The stream completed (Flush returned OK): the link stays for the next stream.
  virtual void Release() = 0;
};

class KvLinkAcceptor {
 public:
  virtual ~KvLinkAcceptor() = default;
  // Joins the communicator of `unique_id` as the receiver and keeps it as `link_id`. Blocks until
  // the peer has joined. InvalidArgument for an empty link_id, an id of the wrong size or
  // max_chunk_tokens < 1; the link's errors (DeadlineExceeded, Unavailable, ResourceExhausted).
  virtual absl::Status Connect(const std::string& link_id, const std::string& unique_id,
                               int64_t max_chunk_tokens) = 0;
  // Takes the link for one stream (waiting while another stream holds it). NotFound for an
  // unknown (or dropped) link.
  virtual absl::StatusOr<std::unique_ptr<KvLinkLease>> Acquire(const std::string& link_id) = 0;
  // Links up now.
  virtual int64_t num_links() const = 0;
};

// Decode side, over this process's GPU cache (which must outlive the acceptor).
absl::StatusOr<std::unique_ptr<KvLinkAcceptor>> NewNcclKvLinkAcceptor(
    const DeviceKvCache& cache, const KvLinkOptions& options = {});

// Asks the decode worker at `destination` to join link `link_id` (DecodeWorker.ConnectKvLink);
// called concurrently with the local join, returns when the remote one returns.
using KvLinkConnector =
    std::function<absl::Status(const std::string& destination, const std::string& link_id,
                               const std::string& unique_id, int64_t max_chunk_tokens)>;

// Prefill side: sends from device stores of `cache` (must outlive the transport) in chunks of
// at most max_chunk_tokens positions; `meta` carries the metadata blocks and the final record
// (it must outlive the transport; Open goes straight to it).
absl::StatusOr<std::unique_ptr<KvTransport>> NewNcclKvTransport(const DeviceKvCache& cache,
                                                                int64_t max_chunk_tokens,
                                                                KvTransport* meta,
                                                                KvLinkConnector connector,
                                                                const KvLinkOptions& options = {});

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_KV_LINKS_H_
