// kv_links.h over NcclKvLink (nccl_kv_link.h): the decode side's acceptor and the prefill
// side's transport. Only in builds with NCCL (kv_links_unavailable.cc otherwise).
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/transfer/kv_links.h"
#include "engine/transfer/nccl_kv_link.h"

namespace tokenselect::engine {
namespace {

NcclKvCache ToLinkCache(const DeviceKvCache& c) {
  NcclKvCache out;
  for (void* p : c.k_layers) out.k_layers.push_back(static_cast<__nv_bfloat16*>(p));
  for (void* p : c.v_layers) out.v_layers.push_back(static_cast<__nv_bfloat16*>(p));
  out.num_slots = c.num_slots;
  out.row = c.row;
  return out;
}

// A link and whether a stream (decode) or request (prefill) holds it.
struct LinkSlot {
  std::string link_id;
  std::unique_ptr<NcclKvLink> link;
  bool in_use = false;
};

// Waits (on `mu`) until `slot` is free, then takes it. DeadlineExceeded after `timeout`.
absl::Status TakeSlot(absl::Mutex* mu, LinkSlot* slot, absl::Duration timeout, const char* what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  auto free = [slot]() { return !slot->in_use; };
  if (!mu->AwaitWithTimeout(absl::Condition(&free), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the K/V link stayed busy for ", absl::FormatDuration(timeout)));
  }
  slot->in_use = true;
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const int32_t>> DeviceSlots(const KvStore& store, int64_t begin,
                                                       int64_t end) {
  const std::optional<KvDeviceSlots> device = store.device_slots();
  if (!device.has_value()) {
    return absl::FailedPreconditionError(
        "the NCCL transport moves K/V between GPU caches; this request's K/V are in host memory");
  }
  if (begin < 0 || end <= begin || end > static_cast<int64_t>(device->slots.size())) {
    return absl::InvalidArgumentError(absl::StrCat("token range [", begin, ", ", end,
                                                   ") outside the reserved ",
                                                   device->slots.size(), " slots"));
  }
  return device->slots.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

// ---------------------------------------------------------------- decode side

class NcclAcceptor;

class NcclLease final : public KvLinkLease {
 public:
  NcclLease(NcclAcceptor* acceptor, std::shared_ptr<LinkSlot> slot)
      : acceptor_(acceptor), slot_(std::move(slot)) {}
  ~NcclLease() override;
  const std::string& id() const override { return slot_->link_id; }
  absl::Status Receive(const KvBlockRange& range, KvStore* store) override {
    absl::StatusOr<absl::Span<const int32_t>> slots =
        DeviceSlots(*store, range.token_begin, range.token_end);
    absl::Status status = slots.status();
    if (status.ok()) {
      status = slot_->link->RecvChunk(
          {range.layer_begin, range.layer_end, range.token_begin, range.token_end}, *slots);
    }
    if (!status.ok()) failed_ = true;
    return status;
  }
  absl::Status Flush() override {
    absl::Status status = slot_->link->Flush();
    if (!status.ok()) failed_ = true;
    return status;
  }
  void Release() override { released_ = !failed_; }

 private:
  NcclAcceptor* acceptor_;
  std::shared_ptr<LinkSlot> slot_;
  bool failed_ = false;
  bool released_ = false;
};

class NcclAcceptor final : public KvLinkAcceptor {
 public:
  NcclAcceptor(const DeviceKvCache& cache, const KvLinkOptions& options)
      : cache_(ToLinkCache(cache)), device_(cache.device), options_(options) {}

  absl::Status Connect(const std::string& link_id, const std::string& unique_id,
                       int64_t max_chunk_tokens) override {
    if (link_id.empty()) return absl::InvalidArgumentError("link_id must not be empty");
    if (max_chunk_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_chunk_tokens must be >= 1, got ", max_chunk_tokens));
    }
    NcclKvLinkOptions lo;
    lo.max_chunk_tokens = max_chunk_tokens;
    lo.timeout = options_.timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<NcclKvLink> link,
                     NcclKvLink::Connect(unique_id, NcclKvLink::kReceiverRank, device_, cache_,
                                         lo));
    auto slot = std::make_shared<LinkSlot>();
    slot->link_id = link_id;
    slot->link = std::move(link);
    absl::MutexLock lock(&mu_);
    links_[link_id] = std::move(slot);
    TS_LOG(INFO, "K/V link {} up (NCCL, GPU {}, chunks of up to {} tokens)", link_id, device_,
           max_chunk_tokens);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<KvLinkLease>> Acquire(const std::string& link_id) override {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(link_id);
    if (it == links_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk.link_id '", link_id,
                                              "': no such K/V link on this decode worker"));
    }
    std::shared_ptr<LinkSlot> slot = it->second;
    RETURN_IF_ERROR(TakeSlot(&mu_, slot.get(), options_.timeout, "PushKv"));
    return std::unique_ptr<KvLinkLease>(std::make_unique<NcclLease>(this, std::move(slot)));
  }

  int64_t num_links() const override {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(links_.size());
  }

  // Ends a lease: a broken link is aborted and forgotten.
  void Return(const std::shared_ptr<LinkSlot>& slot, bool broken) {
    if (broken) {
      slot->link->Abort();
      TS_LOG(WARN, "K/V link {} dropped after a failed stream", slot->link_id);
    }
    absl::MutexLock lock(&mu_);
    slot->in_use = false;
    if (broken) {
      auto it = links_.find(slot->link_id);
      if (it != links_.end() && it->second == slot) links_.erase(it);
    }
  }

 private:
  const NcclKvCache cache_;
  const int device_;
  const KvLinkOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<LinkSlot>> links_ ABSL_GUARDED_BY(mu_);
};

NcclLease::~NcclLease() { acceptor_->Return(slot_, !released_); }

// ---------------------------------------------------------------- prefill side

class NcclTransport;

class NcclChunkSender final : public KvChunkSender {
 public:
  NcclChunkSender(NcclTransport* transport, std::shared_ptr<LinkSlot> slot,
                  std::unique_ptr<KvStream> stream, KvStore* store, int64_t max_chunk_tokens)
      : transport_(transport),
        slot_(std::move(slot)),
        stream_(std::move(stream)),
        store_(store),
        layout_(store->layout()),
        max_chunk_tokens_(max_chunk_tokens) {}
  ~NcclChunkSender() override;

  absl::Status SendChunk(int64_t token_begin, int64_t token_end) override {
    if (aborted_) return absl::CancelledError("KV transfer aborted");
    if (!error_.ok()) return error_;
    error_ = Send(token_begin, token_end);
    return error_;
  }

  absl::StatusOr<KvPushStats> Finish(KvFinal final) override {
    if (aborted_) return absl::CancelledError("KV transfer aborted");
    if (!error_.ok()) return error_;
    error_ = slot_->link->Flush();  // every chunk is on the wire before the final record
    if (!error_.ok()) return error_;
    final.num_chunks = blocks_;
    absl::StatusOr<KvPushStats> stats = stream_->Finish(final);
    if (stats.ok()) {
      finished_ = true;
    } else {
      error_ = stats.status();
    }
    return stats;
  }

  void Abort() override {
    if (aborted_.exchange(true) || finished_) return;
    stream_->Abort();
    slot_->link->Abort();  // interrupts a wait in progress
  }

  int64_t blocks_sent() const override { return blocks_; }
  int64_t bytes_sent() const override { return bytes_; }

 private:
  absl::Status Send(int64_t begin, int64_t end) {
    ASSIGN_OR_RETURN(absl::Span<const int32_t> slots, DeviceSlots(*store_, begin, end));
    // The chunk's K/V are written by the forward passes queued so far.
    RETURN_IF_ERROR(store_->Synchronize());
    for (int64_t b = begin; b < end; b += max_chunk_tokens_) {
      const int64_t e = std::min(end, b + max_chunk_tokens_);
      // The metadata block goes first: the receiver posts its NCCL receive when it reads it,
      // and NCCL sets up a peer connection (the first transfer) only once both sides have
      // posted theirs, so sending the chunk first would wait for a receive never posted.
      KvBlock meta;
      meta.sequence = blocks_;
      meta.layer_begin = 0;
      meta.layer_end = layout_.num_layers;
      meta.token_begin = b;
      meta.token_end = e;
      meta.dtype = layout_.dtype;
      meta.shape = {layout_.num_layers, 2, e - b, layout_.num_kv_heads, layout_.head_dim};
      meta.link_id = slot_->link_id;
      RETURN_IF_ERROR(stream_->SendBlock(std::move(meta)));
      const KvChunkRange range{0, layout_.num_layers, b, e};
      RETURN_IF_ERROR(slot_->link->SendChunk(
          range, slots.subspan(static_cast<size_t>(b - begin), static_cast<size_t>(e - b))));
      ++blocks_;
      bytes_ += KvBlockBytes(layout_, {0, layout_.num_layers, b, e});
    }
    return absl::OkStatus();
  }

  NcclTransport* transport_;
  std::shared_ptr<LinkSlot> slot_;
  std::unique_ptr<KvStream> stream_;
  KvStore* store_;
  const KvLayout layout_;
  const int64_t max_chunk_tokens_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> finished_{false};
  absl::Status error_;
  int64_t blocks_ = 0;
  int64_t bytes_ = 0;
};

class NcclTransport final : public KvTransport {
 public:
  NcclTransport(const DeviceKvCache& cache, int64_t max_chunk_tokens, KvTransport* meta,
                KvLinkConnector connector, const KvLinkOptions& options)
      : cache_(ToLinkCache(cache)),
        device_(cache.device),
        max_chunk_tokens_(max_chunk_tokens),
        meta_(meta),
        connector_(std::move(connector)),
        options_(options) {}

  absl::StatusOr<std::unique_ptr<KvStream>> Open(const KvStreamTarget& target) override {
    return meta_->Open(target);
  }

  absl::StatusOr<std::unique_ptr<KvChunkSender>> OpenSender(
      const KvStreamTarget& target, KvStore* store, const KvSenderOptions&) override {
    if (!store->device_slots().has_value()) {
      return absl::FailedPreconditionError(
          "--transport nccl needs the GPU backend (--device cuda)");
    }
    std::shared_ptr<LinkSlot> slot;
    {
      absl::MutexLock lock(&mu_);
      std::shared_ptr<LinkSlot>& peer = peers_[target.destination];
      if (peer == nullptr) peer = std::make_shared<LinkSlot>();
      slot = peer;
      RETURN_IF_ERROR(TakeSlot(&mu_, slot.get(), options_.timeout, "K/V transfer"));
    }
    absl::Status status;
    if (slot->link == nullptr || !slot->link->health().ok()) {
      status = Connect(target.destination, slot.get());
    }
    absl::StatusOr<std::unique_ptr<KvStream>> stream =
        status.ok() ? meta_->Open(target) : absl::StatusOr<std::unique_ptr<KvStream>>(status);
    if (!stream.ok()) {
      Return(slot, /*broken=*/false);
      return stream.status();
    }
    return std::unique_ptr<KvChunkSender>(std::make_unique<NcclChunkSender>(
        this, std::move(slot), *std::move(stream), store, max_chunk_tokens_));
  }

  // Ends a request's hold on the link; a broken link is aborted and connected anew next time.
  void Return(const std::shared_ptr<LinkSlot>& slot, bool broken) {
    if (broken && slot->link != nullptr) {
      slot->link->Abort();
      TS_LOG(WARN, "K/V link {} dropped after a failed transfer", slot->link_id);
      slot->link.reset();
    }
    absl::MutexLock lock(&mu_);
    slot->in_use = false;
  }

 private:
  // Creates the communicator: the decode worker joins through the connector while this side
  // joins here (each Connect blocks until both have).
  absl::Status Connect(const std::string& destination, LinkSlot* slot) {
    slot->link.reset();
    ASSIGN_OR_RETURN(std::string unique_id, NcclKvLink::CreateUniqueId());
    const std::string link_id = common::NewId("kvlink");
    absl::Status remote;
    std::thread ask([&] { remote = connector_(destination, link_id, unique_id, max_chunk_tokens_); });
    NcclKvLinkOptions lo;
    lo.max_chunk_tokens = max_chunk_tokens_;
    lo.timeout = options_.timeout;
    absl::StatusOr<std::unique_ptr<NcclKvLink>> link =
        NcclKvLink::Connect(unique_id, NcclKvLink::kSenderRank, device_, cache_, lo);
    ask.join();
    if (!remote.ok()) {
      return absl::Status(remote.code(), absl::StrCat("K/V link to ", destination,
                                                      ": the decode worker could not join: ",
                                                      remote.message()));
    }
    if (!link.ok()) {
      return absl::Status(link.status().code(), absl::StrCat("K/V link to ", destination, ": ",
                                                             link.status().message()));
    }
    slot->link = *std::move(link);
    slot->link_id = link_id;
    TS_LOG(INFO, "K/V link {} to {} up (NCCL, GPU {})", link_id, destination, device_);
    return absl::OkStatus();
  }

  const NcclKvCache cache_;
  const int device_;
  const int64_t max_chunk_tokens_;
  KvTransport* meta_;
  const KvLinkConnector connector_;
  const KvLinkOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<LinkSlot>> peers_ ABSL_GUARDED_BY(mu_);
};

NcclChunkSender::~NcclChunkSender() {
  const bool clean = finished_;
  if (!clean) Abort();
  transport_->Return(slot_, !clean);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvLinkAcceptor>> NewNcclKvLinkAcceptor(
    const DeviceKvCache& cache, const KvLinkOptions& options) {
  if (cache.k_layers.empty() || cache.device < 0) {
    return absl::FailedPreconditionError("device K/V links need a GPU K/V cache");
  }
  return std::unique_ptr<KvLinkAcceptor>(std::make_unique<NcclAcceptor>(cache, options));
}

absl::StatusOr<std::unique_ptr<KvTransport>> NewNcclKvTransport(const DeviceKvCache& cache,
                                                                int64_t max_chunk_tokens,
                                                                KvTransport* meta,
                                                                KvLinkConnector connector,
                                                                const KvLinkOptions& options) {
  if (cache.k_layers.empty() || cache.device < 0) {
    return absl::FailedPreconditionError("--transport nccl needs the GPU backend (--device cuda)");
  }
  if (max_chunk_tokens < 1 || meta == nullptr || !connector) {
    return absl::InvalidArgumentError("NCCL transport: bad chunk size, metadata transport or "
                                      "connector");
  }
  return std::unique_ptr<KvTransport>(std::make_unique<NcclTransport>(
      cache, max_chunk_tokens, meta, std::move(connector), options));
}

}  // namespace tokenselect::engine
