// KvStore: one request's reserved K/V as the transfer sees it, whichever memory holds it: a CPU
// page pool (TableKvStore below) or a GPU cache (the CUDA backend's runner,
// engine/generation/cuda_backend.cc). The sender encodes blocks out of it (PipelinedKvSender,
// kv_transport.h), the receiver writes validated blocks into it (KvReceiver, kv_receiver.h), and a
// device-to-device transport (NCCL, nccl_kv_transport.h) moves K/V between the slots of two device
// stores without the host seeing the bytes.
//
// KvSideChannel is that transport's receiving end: a block whose KvBlock::link_id names the
// channel carries no payload in the stream; the receiver validates it as any block and has the
// channel deliver its bytes into the store.
#ifndef TOKENSELECT_ENGINE_TRANSFER_KV_STORE_H_
#define TOKENSELECT_ENGINE_TRANSFER_KV_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kvcache/token_table.h"
#include "engine/transfer/kv_format.h"

namespace tokenselect::engine {

// A GPU process's whole K/V cache, for device-to-device links (nccl_kv_link.h): per layer a K
// and a V array [num_slots, row] of 2-byte units on `device` (bf16 elements; an FP8 cache's
// rows are counted in pairs of bytes).
struct DeviceKvCache {
  int device = -1;
  std::vector<void*> k_layers;
  std::vector<void*> v_layers;
  int64_t num_slots = 0;
  int64_t row = 0;  // num_kv_heads * head_dim * element bytes / 2
};

// Where a device store's K/V live: the device and the cache slot of every reserved position.
struct KvDeviceSlots {
  int device = -1;
  absl::Span<const int32_t> slots;  // [capacity]: slot of position i
};

// Not thread-safe unless an implementation says otherwise; the sender and the receiver each
// use a store from one thread at a time.
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual KvLayout layout() const = 0;
  // Reserved positions (prompt + generated tokens).
  virtual int64_t capacity() const = 0;
  // The K/V of `range` (positions below capacity, written by earlier forward passes) as a block in
  // the wire format of kv_format.h, numbered `sequence`, with KvChecksum when `checksum`.
  // InvalidArgument for a range outside the layers or the reservation.
  virtual absl::StatusOr<KvBlock> Encode(const KvBlockRange& range, int64_t sequence,
                                         bool checksum) = 0;
  // Writes a block that KvReceiver has validated (ranges, dtype, shape, size) into the slots of its
  // positions.
  virtual absl::Status Write(const KvBlock& block) = 0;
  // The first `tokens` positions now hold the prompt's K/V: the request's length becomes
  // `tokens` (the receiver calls it once, when the stream is complete).
  virtual absl::Status Commit(int64_t tokens) = 0;
  // Device stores: the device and slots, for device-to-device transports; nullopt otherwise.
  virtual std::optional<KvDeviceSlots> device_slots() const { return std::nullopt; }
  // Device stores: blocks until the K/V written by the forward passes so far are in device
  // memory, so that another stream may read them. Host stores: nothing to wait for.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
};

// A TokenTable's reserved slots in its PagePool (fp32 on the host).
class TableKvStore final : public KvStore {
 public:
  // `table` must outlive the store.
  explicit TableKvStore(TokenTable* table) : table_(table) {}
  KvLayout layout() const override { return LayoutOf(*table_->pool()); }
  int64_t capacity() const override { return table_->capacity(); }
  absl::StatusOr<KvBlock> Encode(const KvBlockRange& range, int64_t sequence,
                                 bool checksum) override;
  absl::Status Write(const KvBlock& block) override;
  absl::Status Commit(int64_t tokens) override;

 private:
  TokenTable* table_;
};

// The receiving end of a device-to-device link (kv_receiver.h). Used from one stream's thread at
// a time.
class KvSideChannel {
 public:
  virtual ~KvSideChannel() = default;
  // The link's id, as the blocks it carries quote it in KvBlock::link_id.
  virtual const std::string& id() const = 0;
  // Receives the link's next chunk, which must be `range`, into `store`'s slots. May return
  // before the bytes have landed; Flush waits for them.
  virtual absl::Status Receive(const KvBlockRange& range, KvStore* store) = 0;
  // Waits until everything received so far is in the stores.
  virtual absl::Status Flush() = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_KV_STORE_H_
