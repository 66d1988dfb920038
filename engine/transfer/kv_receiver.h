// The receiving end of one request's K/V stream on the decode worker: validates every block
// against the reservation (ids, layer and token ranges, dtype, shape, payload size, checksum,
// ordering) and writes it into the request's reserved slots (a KvStore, kv_store.h); Finish checks
// that every (layer, token) of the prompt arrived exactly once and decodes the selection state
// carried by the final record (docs/kv_transfer.md). A block that names a link (KvBlock::link_id,
// the NCCL transport) carries no payload: it is validated the same way and its bytes come through
// the stream's KvSideChannel.
//
// Ordering rule: for every layer, blocks cover its tokens in increasing, contiguous order (the
// sender's PlanKvBlocks order); sequence numbers are consecutive from 0. Anything else is
// InvalidArgument, and the receiver stays failed: the request must be aborted.
//
// Not thread-safe: one stream writes into one receiver.
#ifndef TOKENSELECT_ENGINE_TRANSFER_KV_RECEIVER_H_
#define TOKENSELECT_ENGINE_TRANSFER_KV_RECEIVER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/selection/layer_state.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_store.h"

namespace tokenselect::engine {

class KvReceiver {
 public:
  // `store` (the reservation, capacity >= prompt_tokens, length 0) must outlive the receiver;
  // it gives the expected layout.
  KvReceiver(std::string request_id, std::string reservation_id, KvStore* store,
             int64_t prompt_tokens);

  // Validates `block` (quoted with the ids of its message) and copies it into the store's slots,
  // or, for a block with a link_id, has `side` (which must be that link) receive its bytes.
  // InvalidArgument naming the bad field (request_id, reservation_id, sequence, layer range,
  // token range, dtype, shape, data size, checksum, link_id); FailedPrecondition after Finish or
  // a previous error. On error nothing of this block is written; the side channel's own errors
  // are returned as they are.
  absl::Status Accept(absl::string_view request_id, absl::string_view reservation_id,
                      const KvBlock& block, KvSideChannel* side = nullptr);

  // Checks the final record: ids, num_chunks equal to the blocks accepted, every layer complete,
  // first_token_id, and selection_states (0 or num_layers entries, each a valid layer state
  // within the prompt: selection_state.h DecodeSelectionStates). With `side`, first waits until
  // its blocks have landed. On success the store's length becomes prompt_tokens and the decoded
  // states wait in TakeSelectionStates. InvalidArgument naming the field otherwise (the
  // receiver stays failed).
  absl::Status Finish(absl::string_view request_id, absl::string_view reservation_id,
                      const KvFinal& final, KvSideChannel* side = nullptr);

  // After a successful Finish: the per-layer selection states of the final record (empty when
  // it carried none), moved out; a second call returns an empty vector.
  std::vector<SelectionLayerState> TakeSelectionStates() { return std::move(selection_states_); }

  bool finished() const { return finished_; }
  int64_t blocks_received() const { return next_sequence_; }
  int64_t bytes_received() const { return bytes_received_; }
  // Prompt tokens present in every layer.
  int64_t tokens_complete() const;

 private:
  absl::Status CheckIds(absl::string_view request_id, absl::string_view reservation_id) const;
  absl::Status Validate(const KvBlock& block, const KvSideChannel* side) const;

  std::string request_id_;
  std::string reservation_id_;
  KvStore* store_;
  int64_t prompt_tokens_;
  KvLayout layout_;
  std::vector<int64_t> next_token_;  // per layer: tokens [0, next) received
  int64_t next_sequence_ = 0;
  int64_t bytes_received_ = 0;
  std::vector<SelectionLayerState> selection_states_;  // decoded by Finish
  bool finished_ = false;
  bool failed_ = false;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_KV_RECEIVER_H_
