#include "engine/transfer/kv_receiver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "engine/transfer/selection_state.h"

namespace tokenselect::engine {

KvReceiver::KvReceiver(std::string request_id, std::string reservation_id, KvStore* store,
                       int64_t prompt_tokens)
    : request_id_(std::move(request_id)),
      reservation_id_(std::move(reservation_id)),
      store_(store),
      prompt_tokens_(prompt_tokens),
      layout_(store->layout()),
      next_token_(static_cast<size_t>(layout_.num_layers), 0) {}

int64_t KvReceiver::tokens_complete() const {
  if (next_token_.empty()) return 0;
  return *std::min_element(next_token_.begin(), next_token_.end());
}

absl::Status KvReceiver::CheckIds(absl::string_view request_id,
                                  absl::string_view reservation_id) const {
  if (request_id != request_id_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id '", request_id, "' does not match the reservation's '", request_id_, "'"));
  }
  if (reservation_id != reservation_id_) {
    return absl::InvalidArgumentError(absl::StrCat("reservation_id '", reservation_id,
                                                   "' does not match '", reservation_id_, "'"));
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Validate(const KvBlock& b, const KvSideChannel* side) const {
  if (b.sequence != next_sequence_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.sequence is ", b.sequence, ", expected ", next_sequence_));
  }
  if (b.layer_begin < 0 || b.layer_begin >= b.layer_end || b.layer_end > layout_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("chunk layer range [", b.layer_begin, ", ",
                                                   b.layer_end, ") is not within [0, ",
                                                   layout_.num_layers, ")"));
  }
  if (b.token_begin < 0 || b.token_begin >= b.token_end || b.token_end > prompt_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk token range [", b.token_begin, ", ",
                                                   b.token_end, ") is not within the prompt [0, ",
                                                   prompt_tokens_, ")"));
  }
  for (int32_t l = b.layer_begin; l < b.layer_end; ++l) {
    if (next_token_[static_cast<size_t>(l)] != b.token_begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk token range [", b.token_begin, ", ", b.token_end, ") of layer ", l,
          " is out of order: expected tokens from ", next_token_[static_cast<size_t>(l)]));
    }
  }
  if (b.dtype != layout_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.dtype is ", KvDTypeName(b.dtype),
                                                   ", the reservation holds ",
                                                   KvDTypeName(layout_.dtype)));
  }
  const std::vector<int64_t> want = {b.layer_end - b.layer_begin, 2, b.token_end - b.token_begin,
                                     layout_.num_kv_heads, layout_.head_dim};
  if (b.shape != want) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.shape is [", absl::StrJoin(b.shape, ", "),
                                                   "], expected [", absl::StrJoin(want, ", "),
                                                   "]"));
  }
  if (!b.link_id.empty()) {
    // The payload travels over the named link: nothing in the message itself.
    if (side == nullptr || side->id() != b.link_id) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.link_id '", b.link_id,
                                                     "' is not a link of this stream"));
    }
    if (!b.data.empty() || b.checksum.has_value()) {
      return absl::InvalidArgumentError(
          "chunk.data and chunk.checksum must be empty when chunk.link_id is set");
    }
  }
  const int64_t bytes =
      KvBlockBytes(layout_, {b.layer_begin, b.layer_end, b.token_begin, b.token_end});
  if (b.link_id.empty() && static_cast<int64_t>(b.data.size()) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.data has ", b.data.size(), " bytes, expected ", bytes));
  }
  if (b.checksum.has_value() && *b.checksum != KvChecksum(b.data)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.checksum mismatch in chunk ", b.sequence));
  }
  if (b.token_end > store_->capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk token range ends at ", b.token_end,
                                                   " beyond the reserved ", store_->capacity(),
                                                   " slots"));
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Accept(absl::string_view request_id, absl::string_view reservation_id,
                                const KvBlock& block, KvSideChannel* side) {
  if (finished_) return absl::FailedPreconditionError("KV stream already finished");
  if (failed_) return absl::FailedPreconditionError("KV stream already failed");
  absl::Status status = CheckIds(request_id, reservation_id);
  if (status.ok()) status = Validate(block, side);
  if (status.ok()) {
    const KvBlockRange range{block.layer_begin, block.layer_end, block.token_begin,
                             block.token_end};
    status = block.link_id.empty() ? store_->Write(block) : side->Receive(range, store_);
  }
  if (!status.ok()) {
    failed_ = true;
    return status;
  }
  for (int32_t l = block.layer_begin; l < block.layer_end; ++l) {
    next_token_[static_cast<size_t>(l)] = block.token_end;
  }
  ++next_sequence_;
  bytes_received_ +=
      KvBlockBytes(layout_, {block.layer_begin, block.layer_end, block.token_begin,
                             block.token_end});
  return absl::OkStatus();
}

absl::Status KvReceiver::Finish(absl::string_view request_id, absl::string_view reservation_id,
                                const KvFinal& final, KvSideChannel* side) {
  if (finished_) return absl::FailedPreconditionError("KV stream already finished");
  if (failed_) return absl::FailedPreconditionError("KV stream already failed");
  absl::Status status = CheckIds(request_id, reservation_id);
  if (status.ok() && side != nullptr) status = side->Flush();
  if (status.ok() && final.num_chunks != next_sequence_) {
    status = absl::InvalidArgumentError(
        absl::StrCat("final.num_chunks is ", final.num_chunks, ", received ", next_sequence_));
  }
  if (status.ok()) {
    for (size_t l = 0; l < next_token_.size(); ++l) {
      if (next_token_[l] != prompt_tokens_) {
        status = absl::InvalidArgumentError(absl::StrCat("KV incomplete: layer ", l, " has ",
                                                         next_token_[l], " of ", prompt_tokens_,
                                                         " prompt tokens"));
        break;
      }
    }
  }
  if (status.ok() && final.first_token_id < 0) {
    status = absl::InvalidArgumentError(
        absl::StrCat("final.first_token_id must be >= 0, got ", final.first_token_id));
  }
  std::vector<SelectionLayerState> states;
  if (status.ok()) {
    absl::StatusOr<std::vector<SelectionLayerState>> decoded =
        DecodeSelectionStates(final.selection_states, layout_.num_layers, prompt_tokens_);
    if (decoded.ok()) {
      states = std::move(decoded).value();
    } else {
      status = decoded.status();
    }
  }
  if (!status.ok()) {
    failed_ = true;
    return status;
  }
  if (absl::Status committed = store_->Commit(prompt_tokens_); !committed.ok()) {
    failed_ = true;
    return committed;
  }
  selection_states_ = std::move(states);
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
